"""The long tail: the SQLite and PostgreSQL archives, their search and ranking, embeddings.

:class:`~demote.archive.sqlite.SQLiteArchive` is the embedded default;
:class:`~demote.archive.postgres.PostgresArchive` shares its ranking, fed from SQL.
"""
