"""Fenced leases across worker processes: a slow hook, a paused worker, a killed worker.

Four or more processes (tests/support/engine_worker.py), each a real Demoter, load the
same conversations on one shared state store (SQLite file, Redis, Postgres), half of them
through ``load`` and half through ``aload``. The sink records every delivered key with its
worker and fencing token and has no unique constraint, so a duplicate is visible. The same
cases between two Demoters of one process are in tests/demote/engine/test_engine_leases.py.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.demote.fleet.conftest import TTL, Fleet, mode

pytestmark = pytest.mark.slow

WORKERS = 4


def run_slow_hooks(fleet: Fleet, *, renew: bool) -> list[str]:
    """Four workers take turns on two conversations; every hook call takes 2.2 x TTL."""
    cids = ["s0", "s1"]
    names = fleet.take_turns(
        cids, workers=WORKERS, rounds=200, duration=5.0, gap=0.1, delay=2.2 * TTL, renew=renew
    )
    fleet.finish(*names)
    return cids


def contended(fleet: Fleet) -> int:
    """Loads of a conversation by one worker while another's hook had outlived the TTL."""
    rows = fleet.sink.rows(
        "SELECT COUNT(*) FROM loads l JOIN calls c ON l.cid = c.cid AND l.worker != c.worker "
        "WHERE l.t0 > c.entered + ? AND l.t1 < c.left",
        TTL,
    )
    return int(rows[0][0])


def test_a_hook_slower_than_the_lease_is_never_delivered_twice(fleet: Fleet) -> None:
    cids = run_slow_hooks(fleet, renew=True)
    assert contended(fleet) >= 1, "no worker tried while a slow hook held the lease"
    assert fleet.duplicates() == []
    fleet.assert_nothing_lost(cids)
    assert fleet.duplicates() == []


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_without_renewal_the_same_workers_deliver_twice(fleet: Fleet) -> None:
    # The control: the harness sees duplicates when nothing renews the lease.
    cids = run_slow_hooks(fleet, renew=False)
    assert fleet.duplicates() != []
    fleet.assert_nothing_lost(cids)  # fencing still keeps every commit honest


@pytest.mark.parametrize("victim_mode", ["sync", "async"])
def test_a_paused_worker_loses_its_lease_and_its_late_commit_and_write_are_refused(
    fleet: Fleet, victim_mode: str
) -> None:
    # The victim's hook holds; we stop the whole process (its lease keeper too) past the
    # TTL. Three workers then load the conversation at once: one takes over, writes to the
    # sink and holds before committing, so the committed state is still the victim's
    # starting point when the victim resumes: only the fence can refuse its commit.
    fleet.sink.set_history("p", 0, 20)
    fleet.start("v", mode=victim_mode, cids=["p"], check_fence=True, hold={"cid": "p", "nth": 1})
    _, held = fleet.entered(["v"])
    fleet.signal("v", signal.SIGSTOP)
    stopped = time.time()
    takers = [f"t{n}" for n in range(WORKERS - 1)]
    for n, name in enumerate(takers):
        fleet.start(
            name,
            mode=mode(n),
            cids=["p"],
            check_fence=True,
            hold={"cid": "p", "nth": 1, "when": "after"},
            go="takeover",
        )
    fleet.go(takers, "takeover", not_before=stopped + 1.5 * TTL)
    taker, took = fleet.entered(takers)
    others = [n for n in takers if n != taker]
    fleet.finish(*others)  # they found the lease held and returned at once
    assert took["fence"] > held["fence"] and took["indexes"] == held["indexes"] == list(range(18))
    assert took["entered"] >= held["entered"] + TTL, "taken over only after the TTL"
    before = fleet.state("p")
    assert before is None  # nothing committed yet: the taker still holds its commit

    fleet.release("v")
    fleet.signal("v", signal.SIGCONT)
    fleet.finish("v")
    refused = fleet.sink.rows("SELECT worker, fence, highest FROM refused")
    assert refused == [("v", held["fence"], took["fence"])], "the sink refused the late write"
    assert fleet.state("p") is None, "the paused worker's commit was refused"
    (victim,) = fleet.sink.rows("SELECT demoted, pending FROM loads WHERE worker = 'v'")
    assert victim == (0, 18)

    fleet.release(taker)
    fleet.finish(taker)
    after = fleet.state("p")
    assert after is not None and (after.window_start, after.delivered) == (18, 18)
    assert fleet.duplicates() == []
    assert fleet.missing("p", 18) == []
    writers = fleet.sink.rows("SELECT DISTINCT worker, fence FROM delivered")
    assert writers == [(taker, took["fence"])]


def test_kill_9_inside_the_hook_another_worker_takes_over_and_nothing_is_lost(
    fleet: Fleet,
) -> None:
    cids = ["k0", "k1"]
    names = fleet.take_turns(
        cids,
        workers=WORKERS,
        only={"w1": {"hold": {"cid": None, "nth": 2}}},  # an async worker
        rounds=300,
        duration=30.0,
        gap=0.05,
        delay=0.02,
        stop="stop",
    )
    _, held = fleet.entered(["w1"])
    fleet.signal("w1", signal.SIGKILL)
    killed = time.time()
    cid, fence, first = held["cid"], held["fence"], held["indexes"][0]

    def taken_over() -> list[tuple[str, int, float]]:
        return fleet.sink.rows(
            "SELECT worker, fence, at FROM delivered WHERE cid = ? AND idx = ?", cid, first
        )

    fleet.wait_until(lambda: taken_over() != [], "another worker to deliver the killed batch")
    time.sleep(0.5)
    fleet.touch("stop")
    fleet.finish(*(n for n in names if n != "w1"))
    assert fleet.procs["w1"].wait(10) == -signal.SIGKILL
    ((worker, new_fence, at),) = taken_over()
    assert worker != "w1" and new_fence > fence
    assert at >= held["entered"] + 0.8 * TTL, "not before the killed worker's lease ran out"
    assert at >= killed
    assert fleet.duplicates() == []
    fleet.assert_nothing_lost(cids)
    assert fleet.duplicates() == []
