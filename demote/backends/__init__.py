"""Connection plumbing the state stores, the archives and the outbox share.

PostgreSQL pools, deadlines and reconnects; recognising an SQLite file as a component's own
before anything is written; truncating a WAL. The flows these serve, their operations and
drivers, are :mod:`demote.flow` (``demote.backends.flow`` still imports, for old code).
"""
