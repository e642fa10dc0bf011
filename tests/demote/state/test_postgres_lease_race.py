"""A lease granted while its previous holder commits must come with the committed state.

``acquire_lease`` returns the state "read in the same atomic step" as the grant; the
engine plans its delivery from it. On Postgres the grant is one statement whose state read
uses the statement's snapshot. It used to start, while the holder's fenced commit (which
releases the lease) was in flight, wait for that commit on the lease row and then
succeed, joining the state from before the commit: the engine delivered again what the
previous holder had just delivered (the fleet tests in tests/demote/fleet/ saw duplicate
keys, on Postgres only) and its commit was refused. Now a lease the snapshot shows held
is not granted.

The race is made deterministic here: the previous holder's commit is the store's own
statement run in an open transaction; the new grant starts, waits on the lease row, and
the transaction then commits.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from demote import ConversationState
from demote.state import PostgresStateStore
from tests.demote.state.conftest import drop_pg_tables


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStateStore]:
    table = f"t_{uuid.uuid4().hex[:12]}"
    made = PostgresStateStore(postgres_url, table=table)
    try:
        yield made
    finally:
        made.close()
        drop_pg_tables(postgres_url, table)


def _blocked_by(url: str, pid: int) -> bool:
    """Is some session waiting for a lock that backend ``pid`` holds?"""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("first_commit", [True, False], ids=["first-commit", "later-commit"])
def test_a_lease_granted_during_the_previous_holders_commit_carries_that_commit(
    store: PostgresStateStore, postgres_url: str, first_commit: bool
) -> None:
    import psycopg

    old = None if first_commit else ConversationState(window_start=2, delivered=2)
    if old is not None:
        assert store.compare_and_set("c", None, old)
    lease = store.acquire_lease("c", "a", 30)
    assert lease is not None and lease.state == old
    new = ConversationState(window_start=4, delivered=4, anchor="x")
    sql = store._sql  # the store's own fenced compare-and-set with release
    statement = sql.cas(old is not None, True, True)
    params = sql.cas_params("c", old, new, lease)

    box: dict[str, Any] = {}
    with psycopg.connect(postgres_url, autocommit=True) as holder:
        with holder.transaction():
            assert holder.execute(statement, params).fetchone() == (1,)
            # The commit is in flight. Another worker asks for the lease meanwhile.
            thread = threading.Thread(
                target=lambda: box.update(lease=store.acquire_lease("c", "b", 30)), daemon=True
            )
            thread.start()
            deadline = time.monotonic() + 5
            while thread.is_alive() and not _blocked_by(postgres_url, holder.info.backend_pid):
                assert time.monotonic() < deadline, "the grant neither waited nor returned"
                time.sleep(0.02)
        # Committed: the holder's state is in and its lease is gone.
        thread.join(10)
    assert store.get("c") == new
    granted = box["lease"]
    # Either the grant saw the lease still held (None: try again later), or it comes
    # with the state the holder committed. A grant with the older state hands the
    # holder's batch to a second worker.
    assert granted is None or granted.state == new, granted
    if granted is not None:
        store.release_lease(granted)
    again = store.acquire_lease("c", "b", 30)
    assert again is not None and again.state == new
