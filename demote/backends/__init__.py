"""Connection plumbing the state stores, the archives and the outbox share.

PostgreSQL pools, deadlines and reconnects; recognising an SQLite file as a component's own
before anything is written; truncating a WAL.
"""
