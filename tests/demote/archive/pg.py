"""Helpers of the PostgreSQL archive tests."""

from __future__ import annotations

import psycopg

SUFFIXES = (
    "_vectors",
    "_terms",
    "_speakers",
    "",
    "_conversations",
    "_erased",
    "_settings",
    "_meta",
)


def drop_archive(url: str, table: str) -> None:
    """Drop every table and text search object of the archive ``table``."""
    with psycopg.connect(url, autocommit=True) as conn:
        for suffix in SUFFIXES:
            conn.execute(f"DROP TABLE IF EXISTS {table}{suffix} CASCADE")
        conn.execute(f"DROP TEXT SEARCH CONFIGURATION IF EXISTS {table}_fts")
        conn.execute(f"DROP TEXT SEARCH DICTIONARY IF EXISTS {table}_porter")
