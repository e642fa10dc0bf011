"""A state store in PostgreSQL, for several workers or hosts (extra ``demote[postgres]``).

One row per conversation in ``table`` (default ``demote_state``) and one per held lease in
``{table}_lease``. Compare-and-set locks the row (``SELECT ... FOR UPDATE``) inside one
transaction; a lease is an upsert that only succeeds when the previous one expired, so one
worker at a time delivers a conversation's demotions across the fleet.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import astuple, fields
from typing import Any

from demote.errors import ConfigError, MissingExtraError, StoreError
from demote.records import ConversationState

__all__ = ["PostgresStateStore"]

_COLUMNS = [f.name for f in fields(ConversationState)]
_IDENT = re.compile(r"[a-z_][a-z0-9_]{0,50}")


class PostgresStateStore:
    """Conversation states in PostgreSQL.

    Args:
        dsn: A libpq connection string or URL (``postgresql://user@host:5432/db``).
        table: Table name (created if missing): lowercase letters, digits, underscores.
    """

    def __init__(self, dsn: str, *, table: str = "demote_state") -> None:
        if not _IDENT.fullmatch(table):
            raise ConfigError(f"table: {table!r} is not a plain lowercase identifier")
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError("psycopg", "postgres") from exc
        self.table = table
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._db: Any = psycopg.connect(dsn, autocommit=False)
        except Exception as exc:
            raise StoreError(f"cannot reach postgres: {exc}") from exc
        with self._tx() as cur:
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (conversation_id TEXT PRIMARY KEY, "
                "window_start BIGINT NOT NULL, delivered BIGINT NOT NULL, "
                "pinned BIGINT NOT NULL, anchor TEXT, summary TEXT, "
                'summarized BIGINT NOT NULL, "offset" BIGINT NOT NULL, '
                "generation BIGINT NOT NULL)"
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {table}_lease (conversation_id TEXT PRIMARY KEY, "
                "holder TEXT NOT NULL, expires TIMESTAMPTZ NOT NULL)"
            )

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock:
            if self._closed:
                raise StoreError("postgres state store is closed")
            try:
                with self._db.transaction(), self._db.cursor() as cur:
                    yield cur
            except StoreError:
                raise
            except Exception as exc:  # psycopg errors become ours at this boundary
                raise StoreError(f"postgres: {exc}") from exc

    def _select(self, cur: Any, conversation_id: str, lock: bool) -> ConversationState | None:
        cols = ", ".join(f'"{c}"' for c in _COLUMNS)
        cur.execute(
            f"SELECT {cols} FROM {self.table} WHERE conversation_id = %s"
            + (" FOR UPDATE" if lock else ""),
            (conversation_id,),
        )
        row = cur.fetchone()
        return None if row is None else ConversationState(*row)

    def get(self, conversation_id: str) -> ConversationState | None:
        """The stored state, or ``None``."""
        with self._tx() as cur:
            return self._select(cur, conversation_id, lock=False)

    def compare_and_set(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
    ) -> bool:
        """Store ``new`` if the current state equals ``expected`` (row locked meanwhile)."""
        cols = ", ".join(f'"{c}"' for c in _COLUMNS)
        updates = ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in _COLUMNS)
        with self._tx() as cur:
            if expected is None:
                cur.execute(
                    f"INSERT INTO {self.table} (conversation_id, {cols}) VALUES "
                    f"(%s{', %s' * len(_COLUMNS)}) ON CONFLICT (conversation_id) DO NOTHING",
                    (conversation_id, *astuple(new)),
                )
                return bool(cur.rowcount == 1)
            if self._select(cur, conversation_id, lock=True) != expected:
                return False
            cur.execute(
                f"INSERT INTO {self.table} (conversation_id, {cols}) VALUES "
                f"(%s{', %s' * len(_COLUMNS)}) ON CONFLICT (conversation_id) DO UPDATE SET "
                + updates,
                (conversation_id, *astuple(new)),
            )
            return True

    def delete(self, conversation_id: str) -> None:
        """Forget the conversation's state."""
        with self._tx() as cur:
            cur.execute(f"DELETE FROM {self.table} WHERE conversation_id = %s", (conversation_id,))

    def count(self) -> int:
        """How many conversations have state."""
        with self._tx() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {self.table}")
            return int(cur.fetchone()[0])

    def acquire_lease(self, conversation_id: str, holder: str, ttl: float) -> bool:
        """Take the conversation's delivery lease for ``ttl`` seconds if it is free."""
        with self._tx() as cur:
            cur.execute(
                f"INSERT INTO {self.table}_lease AS l (conversation_id, holder, expires) "
                "VALUES (%s, %s, now() + make_interval(secs => %s)) "
                "ON CONFLICT (conversation_id) DO UPDATE SET holder = EXCLUDED.holder, "
                "expires = EXCLUDED.expires WHERE l.expires < now() RETURNING holder",
                (conversation_id, holder, ttl),
            )
            return cur.fetchone() is not None

    def release_lease(self, conversation_id: str, holder: str) -> None:
        """Give the lease back, only if ``holder`` still has it."""
        with self._tx() as cur:
            cur.execute(
                f"DELETE FROM {self.table}_lease WHERE conversation_id = %s AND holder = %s",
                (conversation_id, holder),
            )

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
