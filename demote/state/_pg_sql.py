"""The PostgreSQL state store's SQL: schema, migrations, and one statement per operation.

Written once; the store's sync and async drivers execute the same strings. Every
operation is one statement (so one round trip on an autocommit connection), atomic by
itself:

- compare-and-set is an ``UPDATE ... WHERE <state> IS NOT DISTINCT FROM <expected>`` (an
  ``INSERT ... ON CONFLICT DO NOTHING`` when nothing is expected), fenced by an
  ``EXISTS`` that locks the lease row ``FOR UPDATE`` while checking holder, token and
  expiry; the release is a ``DELETE`` in the same statement, run after the comparison;
- acquire is an upsert of the lease that only replaces an expired one (and grants
  nothing if the statement's snapshot shows the lease held, so the state it joins is
  never older than the previous holder's commit), taking its token from a sequence;
- clear revokes the lease and upserts the tombstone (generation + 1) in one statement.

Locks are always taken lease row first, then state row, so two operations on one
conversation never deadlock. Expiry is by the server's clock (``now()``).

Schema versions: 1 is the table and lease table of earlier releases; 2 adds the lease
token, the fencing sequence and the ``{table}_meta`` row that records the version.
Migrations run under an advisory lock, in one transaction, and are idempotent.
"""

from __future__ import annotations

from dataclasses import astuple
from functools import cache
from typing import Any

from demote.errors import StoreError
from demote.records import ConversationState
from demote.state._codec import COLUMNS
from demote.state.base import Lease, tombstone

__all__ = ["SCHEMA_VERSION", "Sql", "migrate", "schema_version"]

SCHEMA_VERSION = 4
_TYPES = {c: ("text" if c in ("anchor", "summary", "trail") else "bigint") for c in COLUMNS}
_COLS = ", ".join(f'"{c}"' for c in COLUMNS)
_S_COLS = ", ".join(f's."{c}"' for c in COLUMNS)


#: The columns of the state and lease tables: those of version 1, those of the newest.
_STATE_REQUIRED = frozenset(
    {
        "conversation_id",
        "window_start",
        "delivered",
        "pinned",
        "anchor",
        "summary",
        "summarized",
        "offset",
        "generation",
    }
)
_STATE_ALLOWED = _STATE_REQUIRED | {"trail", "cleared"}
_LEASE_REQUIRED = frozenset(("conversation_id", "holder", "expires"))
_LEASE_ALLOWED = _LEASE_REQUIRED | {"token"}


def _values(prefix: str) -> str:
    return ", ".join(f"%({prefix}{c})s::{_TYPES[c]}" for c in COLUMNS)


def state_params(prefix: str, state: ConversationState) -> dict[str, Any]:
    """Named parameters of ``state`` for :func:`_values` placeholders."""
    return {f"{prefix}{c}": v for c, v in zip(COLUMNS, astuple(state), strict=True)}


class Sql:
    """The statements of one store table (``table`` is a checked identifier)."""

    def __init__(self, table: str) -> None:
        self.table = table
        lease, t = f"{table}_lease", table
        self.lease_table = lease
        self.get = f"SELECT {_COLS} FROM {t} WHERE conversation_id = %(id)s"
        self.count = f"SELECT count(*) FROM {t}"
        self.holds = (
            f"EXISTS (SELECT 1 FROM {lease} WHERE conversation_id = %(id)s "
            "AND holder = %(holder)s AND token = %(token)s AND expires > now() FOR UPDATE)"
        )
        self.drop_lease = (
            f"DELETE FROM {lease} WHERE conversation_id = %(id)s "
            "AND holder = %(holder)s AND token = %(token)s"
        )
        # The state is read with the statement's snapshot. A lease that snapshot shows
        # held may be in the middle of its holder's commit (which releases it): the
        # insert would wait for that commit and succeed, but the state joined below
        # would be the one from before it. So a lease held in the snapshot is never
        # granted (None: busy, try later), and a grant always comes with fresh state.
        self.acquire = (
            f"WITH l AS (INSERT INTO {lease} AS l (conversation_id, holder, token, expires) "
            f"SELECT %(id)s, %(holder)s, nextval('{t}_fence'), "
            "now() + make_interval(secs => %(ttl)s) "
            f"WHERE NOT EXISTS (SELECT 1 FROM {lease} WHERE conversation_id = %(id)s "
            "AND expires > now()) "
            "ON CONFLICT (conversation_id) DO UPDATE SET holder = EXCLUDED.holder, "
            "token = EXCLUDED.token, expires = EXCLUDED.expires WHERE l.expires <= now() "
            f"RETURNING token) SELECT l.token, {_S_COLS} "
            f"FROM l LEFT JOIN {t} s ON s.conversation_id = %(id)s"
        )
        self.renew = (
            f"UPDATE {lease} SET expires = now() + make_interval(secs => %(ttl)s) "
            "WHERE conversation_id = %(id)s AND holder = %(holder)s AND token = %(token)s "
            "AND expires > now() RETURNING 1"
        )
        self.release = self.drop_lease
        # The lease goes first (an InitPlan the state write waits on): lease, then state.
        fresh = ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in COLUMNS if c != "generation")
        self.clear = (
            f"WITH rel AS (DELETE FROM {lease} WHERE conversation_id = %(id)s RETURNING 1) "
            f"INSERT INTO {t} AS s (conversation_id, {_COLS}) "
            f"SELECT %(id)s, {_values('n_')} WHERE (SELECT count(*) FROM rel) >= 0 "
            f"ON CONFLICT (conversation_id) DO UPDATE SET {fresh}, "
            f'"generation" = s."generation" + 1 RETURNING {_COLS}'
        )
        self.delete = (
            f"WITH rel AS (DELETE FROM {lease} WHERE conversation_id = %(id)s RETURNING 1) "
            f"DELETE FROM {t} WHERE conversation_id = %(id)s "
            "AND (SELECT count(*) FROM rel) >= 0"
        )

    @cache  # noqa: B019 - eight strings per store, kept as long as the store
    def cas(self, expecting: bool, fenced: bool, release: bool) -> str:
        """The compare-and-set statement for this combination of arguments."""
        guard = f" AND {self.holds}" if fenced else ""
        if expecting:
            write = (
                f"UPDATE {self.table} SET ({_COLS}) = ROW({_values('n_')}) "
                f"WHERE conversation_id = %(id)s AND ({_COLS}) IS NOT DISTINCT FROM "
                f"({_values('e_')}){guard} RETURNING 1"
            )
        else:
            write = (
                f"INSERT INTO {self.table} (conversation_id, {_COLS}) "
                f"SELECT %(id)s, {_values('n_')} WHERE TRUE{guard} "
                "ON CONFLICT (conversation_id) DO NOTHING RETURNING 1"
            )
        if not release:
            return f"WITH w AS ({write}) SELECT count(*) FROM w"
        # The release runs after the write (its InitPlan reads w), so the check sees
        # the lease before it goes.
        return (
            f"WITH w AS ({write}), rel AS ({self.drop_lease} "
            "AND (SELECT count(*) FROM w) >= 0 RETURNING 1) SELECT count(*) FROM w"
        )

    def cas_params(
        self,
        cid: str,
        expected: ConversationState | None,
        new: ConversationState,
        lease: Lease | None,
    ) -> dict[str, Any]:
        """Parameters of :meth:`cas`."""
        params = {"id": cid, **state_params("n_", new)}
        if expected is not None:
            params.update(state_params("e_", expected))
        if lease is not None:
            params.update(holder=lease.holder, token=lease.token)
        return params

    def clear_params(self, cid: str) -> dict[str, Any]:
        """Parameters of :attr:`clear` (the tombstone of a conversation never seen)."""
        return {"id": cid, **state_params("n_", tombstone(None))}

    def migrations(self) -> list[str]:
        """Bring any earlier layout to :data:`SCHEMA_VERSION` (idempotent)."""
        t, lease = self.table, self.lease_table
        return [
            self._own_check(),  # first: a table of another program is never altered
            # version 1
            f"CREATE TABLE IF NOT EXISTS {t} (conversation_id TEXT PRIMARY KEY, "
            "window_start BIGINT NOT NULL, delivered BIGINT NOT NULL, "
            "pinned BIGINT NOT NULL, anchor TEXT, summary TEXT, "
            'summarized BIGINT NOT NULL, "offset" BIGINT NOT NULL, '
            "generation BIGINT NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {lease} (conversation_id TEXT PRIMARY KEY, "
            "holder TEXT NOT NULL, expires TIMESTAMPTZ NOT NULL)",
            # version 2
            f"ALTER TABLE {lease} ADD COLUMN IF NOT EXISTS token BIGINT NOT NULL DEFAULT 0",
            self._fence(),
            # version 3
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS trail TEXT NOT NULL DEFAULT ''",
            # version 4
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS cleared BIGINT NOT NULL DEFAULT 0",
            f"CREATE TABLE IF NOT EXISTS {t}_meta (id BOOLEAN PRIMARY KEY DEFAULT TRUE "
            "CHECK (id), version INTEGER NOT NULL)",
            f"INSERT INTO {t}_meta (version) VALUES ({SCHEMA_VERSION}) "
            f"ON CONFLICT (id) DO UPDATE SET version = {SCHEMA_VERSION}",
        ]

    def _fence(self) -> str:
        """Create the fencing sequence if it is missing.

        A new store's starts at 1. One made again (it was dropped, the store's meta row
        says tokens were handed out before) starts at the server's clock in milliseconds:
        fencing tokens must only grow (an archive refuses batches older than an erase's
        token), and no store hands out a token per millisecond since 1970.
        """
        t = self.table
        return (
            f"DO $$ BEGIN IF to_regclass('{t}_fence') IS NULL THEN "
            f"IF to_regclass('{t}_meta') IS NULL THEN CREATE SEQUENCE {t}_fence; "
            f"ELSE EXECUTE format('CREATE SEQUENCE {t}_fence START WITH %s', "
            "(extract(epoch FROM clock_timestamp()) * 1000)::bigint); END IF; END IF; END $$"
        )

    def _own_check(self) -> str:
        """A statement that raises if a table named like the store's is another program's.

        It is, if it has a column the store's newest schema does not, or lacks one the
        first had. It runs before any statement that creates or alters, in the same
        transaction, so a refused table is left as it was.
        """
        checks = []
        for table, required, allowed in (
            (self.table, _STATE_REQUIRED, _STATE_ALLOWED),
            (self.lease_table, _LEASE_REQUIRED, _LEASE_ALLOWED),
        ):
            have = (
                "SELECT column_name::text FROM information_schema.columns "
                f"WHERE table_schema = current_schema() AND table_name = '{table}'"
            )
            want = ", ".join(f"'{c}'" for c in sorted(required))
            ok = ", ".join(f"'{c}'" for c in sorted(allowed))
            checks.append(
                f"IF EXISTS ({have}) AND (EXISTS ({have} AND column_name NOT IN ({ok})) "
                f"OR (SELECT count(*) FROM ({have} AND column_name IN ({want})) AS c) "
                f"< {len(required)}) THEN RAISE EXCEPTION 'table % is not a demote state "
                "store table: it has other columns; it was left unchanged', "
                f"'{table}'; END IF;"
            )
        return f"DO $$ BEGIN {' '.join(checks)} END $$"

    @property
    def meta_exists(self) -> str:
        """Whether the meta table (schema version 2 and later) exists."""
        return f"SELECT to_regclass('{self.table}_meta') IS NOT NULL"

    @property
    def version(self) -> str:
        """The recorded schema version (only once :attr:`meta_exists`)."""
        return f"SELECT version FROM {self.table}_meta"


def migrate(conn: Any, sql: Sql, repair: bool) -> None:
    """Create or upgrade ``sql``'s tables to :data:`SCHEMA_VERSION` (one transaction).

    Without ``repair`` nothing runs when the recorded version is current; with it every
    (idempotent) statement runs, so whatever was dropped is made again.

    Raises:
        StoreError: The table records a newer schema than this code's.
    """
    version = schema_version(conn, sql)
    if version is not None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"table {sql.table!r} has state store schema {version}, newer than this "
                f"demote's {SCHEMA_VERSION}: upgrade demote"
            )
        if version == SCHEMA_VERSION and not repair:
            return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"demote:{sql.table}",))
        for statement in sql.migrations():
            conn.execute(statement)


def schema_version(conn: Any, sql: Sql) -> int | None:
    """The schema version recorded for ``sql``'s table (``None``: none recorded)."""
    if not conn.execute(sql.meta_exists).fetchone()[0]:
        return None
    (version,) = conn.execute(sql.version).fetchone()
    return int(version)
