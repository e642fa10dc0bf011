"""A PostgreSQL schema of a test's own, for code that makes tables under fixed names.

Docs pages and notebooks make their tables (LangGraph's ``checkpoints``, demote's
``demote_state``, ...) under the names a reader would get. Run against the shared test
database, they get a new schema each, reached through the URL's ``search_path`` option, so
that runs never meet each other's tables; the schema is dropped afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

__all__ = ["schema_of_its_own"]


def schema_of_its_own(url: str, prefix: str = "docs") -> tuple[str, Callable[[], None]]:
    """A URL of ``url``'s database whose tables go to a new schema, and its drop."""
    import psycopg

    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")

    def drop() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}", drop
