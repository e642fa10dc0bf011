"""Connection plumbing the state stores, the archives and the outbox share.

PostgreSQL pools, deadlines and reconnects; recognising an SQLite file as a component's own
before anything is written; truncating a WAL; and the sans-I/O flow drivers every part
that does I/O runs its generators with (:mod:`demote.backends.flow`).
"""
