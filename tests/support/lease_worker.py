"""One worker process of the store-level fencing test (tests/demote/state/test_store_fleet.py).

``python -m tests.support.lease_worker KIND TARGET NAMESPACE WORKER START DURATION OUT``

Until ``START + DURATION`` (wall clock) it picks a conversation, takes its lease,
"works" (renewing it now and then, and sometimes pausing past its TTL, as a worker stuck
in GC or a slow hook would), then commits the next state with its lease and releases it
in the same step. It writes every grant, renewal and commit, with wall-clock bounds
around each call, to ``OUT`` as JSON. The test then checks that no two leases overlapped.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from demote import ConversationState
from demote.state import PostgresStateStore, RedisStateStore, SQLiteStateStore

CONVERSATIONS = ["a", "b", "c"]
TTL = 0.3
MAX_ROUNDS = 2_000


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


def main() -> None:
    kind, target, namespace, worker, start, duration, out = sys.argv[1:8]
    store = open_store(kind, target, namespace)
    try:
        log = run(store, int(worker), float(start), float(duration))
    finally:
        store.close()
    with open(out, "w", encoding="utf-8") as f:
        json.dump(log, f)


if __name__ == "__main__":
    main()
