"""One worker process of the store-level fencing test (tests/demote/state/test_store_fleet.py).

``python -m tests.support.lease_worker KIND TARGET NAMESPACE WORKER GO DURATION OUT``

Once imported and connected it writes ``OUT.ready`` and waits (at most ``GO_WAIT``
seconds) for the file ``GO``, which holds the wall-clock start; the test writes it when
every worker is ready, so however long a loaded machine takes to import, all of them
contend for the whole period. Until ``START + DURATION`` (wall clock) it picks a
conversation, takes its lease, "works" (renewing it now and then, and sometimes pausing
past its TTL, as a worker stuck in GC or a slow hook would), then commits the next state
with its lease and releases it in the same step. It writes every grant, renewal and
commit, with wall-clock bounds around each call, to ``OUT`` as JSON. The test then checks
that no two leases overlapped.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from demote import ConversationState
from demote.state import PostgresStateStore, RedisStateStore, SQLiteStateStore

CONVERSATIONS = ["a", "b", "c"]
TTL = 0.3
MAX_ROUNDS = 2_000
GO_WAIT = 120.0  # seconds a ready worker waits for the test's go file


def open_store(kind: str, target: str, namespace: str) -> Any:
    if kind == "sqlite":
        return SQLiteStateStore(target)
    if kind == "redis":
        return RedisStateStore(target, prefix=namespace)
    return PostgresStateStore(target, table=namespace)


def run(store: Any, worker: int, start: float, duration: float) -> list[list[Any]]:
    rng, holder, log = random.Random(worker), f"p{worker}", []
    time.sleep(max(0.0, start - time.time()))
    end = start + duration
    for _ in range(MAX_ROUNDS):
        if time.time() > end:
            break
        cid = rng.choice(CONVERSATIONS)
        t0 = time.time()
        lease = store.acquire_lease(cid, holder, TTL)
        t1 = time.time()
        if lease is None:
            time.sleep(rng.uniform(0.0, 0.02))
            continue
        log.append(["grant", cid, lease.token, t0, t1])
        for _ in range(rng.randint(0, 3)):
            time.sleep(rng.uniform(0.0, TTL * 0.6))
            r0 = time.time()
            renewed = store.renew_lease(lease, TTL)
            log.append(["renew", cid, lease.token, r0, time.time(), renewed])
            if not renewed:
                break
        if rng.random() < 0.25:
            time.sleep(TTL * 1.5)  # paused past the lease: the commit must be refused
        current = lease.state
        new = ConversationState(
            window_start=(current.window_start if current else 0) + 1,
            anchor=f"{lease.token}",
        )
        c0 = time.time()
        ok = store.compare_and_set(cid, current, new, lease=lease, release=True)
        previous = int(current.anchor) if current and current.anchor else 0
        log.append(["commit", cid, lease.token, c0, time.time(), ok, previous])
    return log


def wait_for_go(go: Path, out: str) -> float:
    """Signal readiness, then the start time the test writes once all workers are ready."""
    Path(out + ".ready").write_text("ready", encoding="utf-8")
    deadline = time.monotonic() + GO_WAIT
    while time.monotonic() < deadline:
        try:
            return float(go.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):  # not written yet (or not completely)
            time.sleep(0.01)
    raise SystemExit(f"no go file {go} within {GO_WAIT} s")


def main() -> None:
    kind, target, namespace, worker, go, duration, out = sys.argv[1:8]
    store = open_store(kind, target, namespace)
    try:
        start = wait_for_go(Path(go), out)
        log = run(store, int(worker), start, float(duration))
    finally:
        store.close()
    with open(out, "w", encoding="utf-8") as f:
        json.dump(log, f)


if __name__ == "__main__":
    main()
