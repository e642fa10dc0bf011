"""A partition between a lease holder and the store: its lease is taken over, its commit refused.

The report (issue 31): two processes share a Redis or PostgreSQL state store,
``lease_ttl=0.5``. Process A delivers a batch and its hook stalls; A's renewals never reach
the store (a partition between A and the store), so its lease expires. Process B loads the
same conversation, takes the lease and enters its own hook. A's hook returns and A commits
its window start while B holds the lease: that commit must be refused.

Here A (tests/support/engine_worker.py, a real Demoter in its own process) reaches the
store through a TCP proxy in this process, which black-holes A's connections once A's
hook holds: A's renewals go unanswered while A itself keeps running (unlike a SIGSTOP,
tests/demote/fleet/test_fleet_leases.py). B, on a direct connection, takes the
conversation over once A's lease has run out, writes its batch to the shared sink and
holds before its commit, so the committed state is still the one A started from and only
the fence can refuse A. The partition then heals and A is let go: its late write is
refused by the sink (which checks fencing tokens), its commit by the store, and its load
says so without being degraded (the commit reached the store). A waits for its hook
(``hook_wait=None``) or returns after ``hook_wait`` and leaves the call to the background
continuation. Nothing is delivered twice and nothing is lost. Every wait is bounded.
"""

from __future__ import annotations

import time
import uuid
from urllib.parse import urlsplit

import pytest

from tests.demote.fleet.conftest import PATIENCE, Fleet
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

#: A's lease time, as in the report; B keeps the fleet's (longer) one, so that its own
#: renewals are never late on a busy machine while it holds.
STALE_TTL = 0.5
HISTORY, KEPT = 20, 2  # the workers keep the last 2 messages: 18 are delivered


def through(proxy: TcpProxy, url: str) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return f"{parts.scheme}://{auth}127.0.0.1:{proxy.port}{parts.path}"


def wait_for(what: str, ready: object) -> None:
    deadline = time.monotonic() + PATIENCE
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"waited {PATIENCE} s for {what}")
        time.sleep(0.01)


@pytest.mark.parametrize("backend", ["redis", "postgres"], indirect=True)
@pytest.mark.parametrize("stale_mode", ["sync", "async"])
@pytest.mark.parametrize("hook_wait", [None, 0.05], ids=["waits", "background"])
def test_a_partitioned_holder_is_taken_over_and_its_commit_refused(
    fleet: Fleet, stale_mode: str, hook_wait: float | None
) -> None:
    cid = f"partition-{uuid.uuid4().hex[:8]}"  # unique on servers other runs share
    fleet.sink.set_history(cid, 0, HISTORY)
    port = urlsplit(fleet.backend.target).port or 6379
    with TcpProxy(port) as proxy:
        fleet.start(
            "a",
            mode=stale_mode,
            cids=[cid],
            check_fence=True,
            hold={"cid": cid, "nth": 1},
            target=through(proxy, fleet.backend.target),
            lease_ttl=STALE_TTL,
            hook_wait=hook_wait,
        )
        _, held = fleet.entered(["a"])
        if hook_wait is not None:  # A's load returns and commits the window move first
            wait_for("A's window move", lambda: fleet.state(cid) is not None)
        before = fleet.state(cid)
        proxy.blackhole()  # from now on nothing A sends reaches the store
        cut = time.time()

        fleet.start(
            "b",
            mode="sync",
            cids=[cid],
            rounds=400,
            gap=0.05,
            stop="stop",
            check_fence=True,
            hold={"cid": cid, "nth": 1, "when": "after"},
            go="go",
        )
        fleet.go(["b"], not_before=cut + STALE_TTL)
        _, took = fleet.entered(["b"])
        assert took["fence"] > held["fence"], "B holds a newer lease"
        assert took["indexes"] == held["indexes"] == list(range(HISTORY - KEPT))
        assert fleet.state(cid) == before, "B wrote its batch and holds before its commit"

        proxy.restore()  # the partition heals: A's calls reach the store again
        fleet.release("a")
        fleet.finish("a")
        assert fleet.state(cid) == before, "the stale holder's commit was refused"
        refused = fleet.sink.rows("SELECT worker, fence, highest FROM refused")
        assert refused == [("a", held["fence"], took["fence"])], "and its late write"
        (window,) = fleet.windows("a")
        assert not window["degraded"], "A's load was answered by the store"
        assert (window["demoted"], window["delivered"], window["pending"]) == (0, 0, 18)

        fleet.touch("stop")
        fleet.release("b")
        fleet.finish("b")
    after = fleet.state(cid)
    assert after is not None and (after.window_start, after.delivered) == (18, 18)
    assert fleet.duplicates() == []
    assert fleet.missing(cid, 18) == []
    assert fleet.sink.rows("SELECT DISTINCT worker, fence FROM delivered") == [("b", took["fence"])]
