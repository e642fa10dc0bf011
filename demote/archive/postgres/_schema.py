"""The PostgreSQL archive's schema (version 2), its migrations, and pgvector detection.

For a table ``T`` (``demote_archive`` by default)::

    T(id IDENTITY, scope, conversation_id, idx, role, text, context, speaker, key,
      tsv TSVECTOR, tokens, data, archived_at)    -- one row per archived message
        UNIQUE (scope, key)                       -- re-delivery stores nothing twice
        INDEX  (scope, idx)                       -- messages() in order, neighbours
        GIN    (tsv)                              -- full-text matches
    T_conversations(id IDENTITY, scope UNIQUE, conversation_id, messages, tokens,
                    vectors, vector_seq)          -- per conversation: counts, BM25's avgdl
    T_terms(conversation, term, in_text, in_any, in_adj, in_all)  -- document frequencies
    T_speakers(conversation, speaker)             -- who speaks in each conversation
    T_vectors(seq IDENTITY, message UNIQUE -> T ON DELETE CASCADE, conversation, idx,
              embedding REAL[] | vector)          -- with embeddings=
    T_erased(scope PRIMARY KEY, conversation_id, fence)  -- fencing tokens of erases
    T_settings(name PRIMARY KEY, value)           -- vector storage, embedding model
    T_meta(version)                               -- the schema version

and the text search dictionary ``T_porter`` (Snowball's ``porter``, no stop words) and
configuration ``T_fts`` (every word token stemmed by it). ``scope`` is a digest of the
conversation id (:func:`demote.archive._search.scope`): keys and indexes stay small however
long an id is, and the same digest is the one ``D``-weighted lexeme of every ``tsv``, so a
full-text match ANDs it with the query terms and the GIN index itself narrows the posting
lists to one conversation. Every statement also compares ``conversation_id``.

``tsv`` holds the text (weight ``A``), the context (``B``), the neighbours' text (``C``)
and the scope (``D``); ``tokens`` counts its positions (BM25's document length). ``text``
is the message text with one line per tool call (:func:`demote.records.searchable_text`),
``data`` the whole message as JSON text (as in the SQLite archive:
:func:`demote.archive._data.stored_data`), ``archived_at`` when it was stored. Version 1
tables gain the last two, ``NULL`` in their rows, which come back text-only.

Migrations run in one transaction under an advisory lock on the table's name, so workers
that start together wait for the first one and find the schema made. A table of a newer
version is refused. Vectors are stored as pgvector's ``vector`` when the extension is
installed in the database when the table is made (``vectors="auto"``), else as ``real[]``;
the choice is recorded in ``T_settings`` and kept for the table's life.
"""

from __future__ import annotations

from typing import Any, Literal

from demote.errors import ConfigError, StoreError

__all__ = [
    "DETECT",
    "VERSION",
    "Layout",
    "check_option",
    "detect",
    "migrate",
    "storage_for",
]

VERSION = 2

#: The schema of the ``vector`` extension, if it is installed in this database.
DETECT = (
    "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
    "WHERE e.extname = 'vector'"
)

VectorsOption = Literal["auto", "array", "pgvector"]


class Layout:
    """Where one archive lives: its table, text search configuration and vector type.

    Args:
        table: A checked identifier (lowercase letters, digits, underscores).
        pgvector: The schema holding the ``vector`` extension when vectors are stored as
            pgvector's type; ``None`` for ``real[]``.
    """

    def __init__(self, table: str, pgvector: str | None = None) -> None:
        self.table = table
        self.pgvector = pgvector
        self.config = f"'{table}_fts'::regconfig"
        if pgvector is None:
            self.vector_type = "REAL[]"
        else:
            schema = '"' + pgvector.replace('"', '""') + '"'
            self.vector_type = f"{schema}.vector"
            self.distance = f"OPERATOR({schema}.<=>)"

    def ddl(self) -> list[str]:
        """The current version, idempotent (``IF NOT EXISTS``); text search objects apart."""
        t, cfg = self.table, self.config
        return [
            f"ALTER TEXT SEARCH CONFIGURATION {t}_fts ALTER MAPPING FOR asciiword, word, "
            f"numword, asciihword, hword, numhword, hword_asciipart, hword_part, "
            f"hword_numpart WITH {t}_porter",
            f"CREATE TABLE IF NOT EXISTS {t}_conversations (id BIGINT GENERATED ALWAYS AS "
            "IDENTITY PRIMARY KEY, scope TEXT NOT NULL UNIQUE, conversation_id TEXT NOT NULL, "
            "messages BIGINT NOT NULL DEFAULT 0, tokens BIGINT NOT NULL DEFAULT 0, "
            "vectors BIGINT NOT NULL DEFAULT 0, vector_seq BIGINT NOT NULL DEFAULT 0)",
            f"CREATE TABLE IF NOT EXISTS {t} (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY "
            "KEY, scope TEXT NOT NULL, conversation_id TEXT NOT NULL, idx BIGINT NOT NULL, "
            "role TEXT NOT NULL, text TEXT NOT NULL, context TEXT NOT NULL DEFAULT '', "
            "speaker TEXT NOT NULL DEFAULT '', key TEXT NOT NULL, tsv TSVECTOR NOT NULL, "
            "tokens INTEGER NOT NULL DEFAULT 0, UNIQUE (scope, key))",
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS data TEXT, "
            "ADD COLUMN IF NOT EXISTS archived_at DOUBLE PRECISION",
            f"CREATE INDEX IF NOT EXISTS {t}_scope_idx ON {t} (scope, idx)",
            f"CREATE INDEX IF NOT EXISTS {t}_tsv ON {t} USING gin (tsv)",
            f"CREATE TABLE IF NOT EXISTS {t}_terms (conversation BIGINT NOT NULL REFERENCES "
            f"{t}_conversations (id) ON DELETE CASCADE, term TEXT NOT NULL, "
            "in_text INTEGER NOT NULL, in_any INTEGER NOT NULL, in_adj INTEGER NOT NULL, "
            "in_all INTEGER NOT NULL, PRIMARY KEY (conversation, term))",
            f"CREATE TABLE IF NOT EXISTS {t}_speakers (conversation BIGINT NOT NULL "
            f"REFERENCES {t}_conversations (id) ON DELETE CASCADE, speaker TEXT NOT NULL, "
            "PRIMARY KEY (conversation, speaker))",
            f"CREATE TABLE IF NOT EXISTS {t}_vectors (seq BIGINT GENERATED ALWAYS AS IDENTITY "
            f"PRIMARY KEY, message BIGINT NOT NULL UNIQUE REFERENCES {t} (id) ON DELETE "
            "CASCADE, conversation BIGINT NOT NULL, idx BIGINT NOT NULL, "
            f"embedding {self.vector_type} NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {t}_vectors_conversation ON {t}_vectors "
            "(conversation, seq)",
            f"CREATE TABLE IF NOT EXISTS {t}_erased (scope TEXT PRIMARY KEY, "
            "conversation_id TEXT NOT NULL, fence BIGINT NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {t}_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
            f"INSERT INTO {t}_settings (name, value) VALUES ('vector_storage', "
            f"'{'array' if self.pgvector is None else 'pgvector'}') ON CONFLICT DO NOTHING",
            f"CREATE TABLE IF NOT EXISTS {t}_meta (id BOOLEAN PRIMARY KEY DEFAULT TRUE "
            "CHECK (id), version INTEGER NOT NULL)",
            f"INSERT INTO {t}_meta (version) VALUES ({VERSION}) "
            f"ON CONFLICT (id) DO UPDATE SET version = {VERSION}",
            # A no-op that fails now, not at the first delivery, if the configuration is off.
            f"SELECT to_tsvector({cfg}, 'running')",
        ]


def check_option(option: object) -> None:
    """Raise :class:`ConfigError` unless ``option`` names a vector storage."""
    if option not in ("auto", "array", "pgvector"):
        raise ConfigError(f"vectors must be 'auto', 'array' or 'pgvector', got {option!r}")


def storage_for(option: VectorsOption, stored: str | None, installed: str | None) -> str | None:
    """The pgvector schema to use (``None``: ``real[]``), from the option and the database.

    Args:
        option: ``"auto"``, ``"array"`` or ``"pgvector"``.
        stored: The storage recorded in an existing table (``"array"``, ``"pgvector"``),
            or ``None`` for a new table.
        installed: The schema of the installed ``vector`` extension (:data:`DETECT`).

    Raises:
        ConfigError: ``option`` is unknown, or asks for a storage the table or the
            database cannot give.
    """
    check_option(option)
    wanted = stored or (option if option != "auto" else "pgvector" if installed else "array")
    if option != "auto" and stored is not None and stored != option:
        raise ConfigError(
            f"vectors={option!r}, but the table stores its vectors as {stored} "
            "(chosen when it was made)"
        )
    if wanted == "array":
        return None
    if installed is None:
        raise ConfigError(
            "vectors are stored with pgvector, but the vector extension is not installed in "
            "this database (CREATE EXTENSION vector)"
        )
    return installed


def detect(conn: Any) -> str | None:
    """The schema of the ``vector`` extension installed in ``conn``'s database, if any."""
    row = conn.execute(DETECT).fetchone()
    return None if row is None else str(row[0])


def _stored(conn: Any, table: str) -> tuple[int | None, str | None]:
    """The table's schema version and vector storage (``None``: no archive there)."""
    meta, settings = conn.execute(
        f"SELECT to_regclass('{table}_meta') IS NOT NULL, "
        f"to_regclass('{table}_settings') IS NOT NULL"
    ).fetchone()
    if not meta:
        return None, None
    (version,) = conn.execute(f"SELECT version FROM {table}_meta").fetchone()
    if not settings:  # dropped since: repair makes it again
        return int(version), None
    row = conn.execute(
        f"SELECT value FROM {table}_settings WHERE name = 'vector_storage'"
    ).fetchone()
    return int(version), None if row is None else str(row[0])


def _exists(conn: Any, catalog: str, column: str, name: str) -> bool:
    prefix = {"pg_ts_dict": "dict", "pg_ts_config": "cfg"}[catalog]
    return bool(
        conn.execute(
            f"SELECT 1 FROM {catalog} WHERE {column} = %s AND {prefix}namespace = "
            "(SELECT oid FROM pg_namespace WHERE nspname = current_schema())",
            (name,),
        ).fetchone()
    )


#: The archive's tables (suffix of the table name) and the columns each has in every
#: version: a table of that name without them belongs to another program.
_REQUIRED = {
    "": frozenset({"id", "scope", "conversation_id", "idx", "role", "text", "key"}),
    "_conversations": frozenset({"id", "scope", "conversation_id", "messages"}),
}


def _check_foreign(conn: Any, table: str) -> None:
    """Refuse, before creating anything, a table named like the archive's but another's."""
    for suffix, required in _REQUIRED.items():
        name = f"{table}{suffix}"
        rows = conn.execute(
            "SELECT column_name::text FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s",
            (name,),
        ).fetchall()
        have = {str(r[0]) for r in rows}
        if have and not required <= have:
            raise StoreError(
                f"table {name!r} is not a demote archive table: it has other columns "
                f"({', '.join(sorted(have))}); it was left unchanged"
            )


def migrate(
    conn: Any, table: str, option: VectorsOption, read_only: bool, repair: bool = False
) -> Layout:
    """Create or check the archive's tables on ``conn``; returns their layout.

    With ``repair`` (a table or text search object was found missing), every idempotent
    statement runs even if the recorded version is current, so whatever was dropped is
    made again as at first use.

    Raises:
        StoreError: The table is newer than this code, or (``read_only``) missing or
            older.
        ConfigError: The vector storage asked for cannot be had.
    """
    version, stored = _stored(conn, table)
    if version is not None and version > VERSION:
        raise StoreError(
            f"table {table!r} has archive schema {version}, newer than this demote's "
            f"{VERSION}: upgrade demote"
        )
    if read_only and version != VERSION:
        raise StoreError(
            f"no archive in table {table!r}"
            if version is None
            else f"table {table!r} has archive schema {version}: open it once for writing to "
            f"migrate it to {VERSION}"
        )
    if version == VERSION and not repair:
        return Layout(table, storage_for(option, stored, detect(conn)))
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"demote-archive:{table}",))
        version, stored = _stored(conn, table)  # another worker may have made it meanwhile
        layout = Layout(table, storage_for(option, stored, detect(conn)))
        if version == VERSION and not repair:
            return layout
        if version is None:  # nothing of demote's recorded there: is the table another's?
            _check_foreign(conn, table)
        missing = _missing(conn, table) if repair and version is not None else set()
        _drop_dependents(conn, table, missing)
        if not _exists(conn, "pg_ts_dict", "dictname", f"{table}_porter"):
            conn.execute(
                f"CREATE TEXT SEARCH DICTIONARY {table}_porter "
                "(TEMPLATE = snowball, Language = porter)"
            )
        if not _exists(conn, "pg_ts_config", "cfgname", f"{table}_fts"):
            conn.execute(f"CREATE TEXT SEARCH CONFIGURATION {table}_fts (COPY = pg_catalog.simple)")
        for statement in layout.ddl():
            conn.execute(statement)
        if missing - {""} and "" not in missing:
            _recount(conn, table)
    return layout


#: The tables that describe the messages table (suffixes): made again from it.
_DERIVED = ("_conversations", "_terms", "_speakers", "_vectors")


def _missing(conn: Any, table: str) -> set[str]:
    """The suffixes of the messages table and the tables describing it that are missing."""
    names = ("", *_DERIVED)
    found = conn.execute(
        "SELECT " + ", ".join(f"to_regclass('{table}{s}') IS NULL" for s in names)
    ).fetchone()
    return {suffix for suffix, gone in zip(names, found, strict=True) if gone}


def _drop_dependents(conn: Any, table: str, missing: set[str]) -> None:
    """Before a repair's DDL: drop what described a table that is gone, to be made anew.

    The messages gone, their statistics and vectors go too (the archive starts over as at
    first use; the erase fences and settings stay). The conversations gone, the term and
    speaker rows that pointed at them go (they are counted again from the messages).
    A ``DROP ... CASCADE`` by the operator also took these tables' foreign keys; made
    anew, they have them again.
    """
    gone: tuple[str, ...]
    if "" in missing:
        gone = ("_vectors", "_terms", "_speakers", "_conversations")
    elif "_conversations" in missing:
        gone = ("_terms", "_speakers")
    else:
        return
    for suffix in gone:
        conn.execute(f"DROP TABLE IF EXISTS {table}{suffix}")


def _recount(conn: Any, table: str) -> None:
    """Count every conversation's statistics again from its messages (after a repair)."""
    t = table
    for statement in (
        f"TRUNCATE {t}_terms, {t}_speakers",
        f"INSERT INTO {t}_conversations (scope, conversation_id) SELECT scope, "
        f"min(conversation_id) FROM {t} GROUP BY scope ON CONFLICT (scope) DO NOTHING",
        f"UPDATE {t}_conversations c SET messages = s.n, tokens = s.tokens FROM (SELECT "
        f"scope, count(*) AS n, sum(tokens) AS tokens FROM {t} GROUP BY scope) s "
        "WHERE c.scope = s.scope",
        f"INSERT INTO {t}_terms (conversation, term, in_text, in_any, in_adj, in_all) "
        "SELECT c.id, u.lexeme, sum(('A' = ANY(u.weights))::int), "
        "sum((u.weights && '{A,B}')::int), sum((u.weights && '{A,C}')::int), "
        f"sum((u.weights && '{{A,B,C}}')::int) FROM {t} m JOIN {t}_conversations c "
        "ON c.scope = m.scope, unnest(m.tsv) AS u GROUP BY c.id, u.lexeme "
        "HAVING sum((u.weights && '{A,B,C}')::int) > 0",
        f"INSERT INTO {t}_speakers (conversation, speaker) SELECT DISTINCT c.id, m.speaker "
        f"FROM {t} m JOIN {t}_conversations c ON c.scope = m.scope WHERE m.speaker <> ''",
        f"UPDATE {t}_vectors v SET conversation = c.id FROM {t} m JOIN {t}_conversations c "
        "ON c.scope = m.scope WHERE v.message = m.id AND v.conversation <> c.id",
        f"UPDATE {t}_conversations c SET vectors = coalesce(s.n, 0), "
        "vector_seq = greatest(c.vector_seq, coalesce(s.top, 0)) FROM (SELECT x.id, "
        "count(v.seq) AS n, max(v.seq) AS top FROM "
        f"{t}_conversations x LEFT JOIN {t}_vectors v ON v.conversation = x.id "
        "GROUP BY x.id) s WHERE c.id = s.id",
    ):
        conn.execute(statement)
