"""Store-level fencing across processes, on SQLite files, Redis and Postgres.

Four worker processes (tests/support/lease_worker.py) contend for the leases of three
conversations for a few seconds, renewing, sometimes pausing past their TTL, and commit
only with their lease. From their logs (wall-clock bounds around every call) we check
what fencing promises:

- every fencing token is granted once, and a conversation's committed tokens increase;
- no commit or renewal with token t succeeded after a grant of a higher token on the
  same conversation had returned: two leases never overlapped where it matters;
- the final state counts every successful commit (no lost update).

Bounded: at most 2,000 rounds a worker, 2.5 s of work, 90 s for the whole test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.demote.state.conftest import DURABLE, drop_pg_tables
from tests.support.lease_worker import CONVERSATIONS, open_store

WORKERS = 4
DURATION = 2.5
ROOT = Path(__file__).resolve().parents[3]


def _check(logs: list[list[list[Any]]], final: dict[str, Any]) -> dict[str, int]:
    grants: dict[str, list[tuple[int, float]]] = defaultdict(list)  # token, returned at
    tokens: list[int] = []
    for log in logs:
        for kind, cid, token, _start, end, *_ in log:
            if kind == "grant":
                grants[cid].append((token, end))
                tokens.append(token)
    assert len(tokens) == len(set(tokens)), "a fencing token was granted twice"

    def overtaken(cid: str, token: int, started: float) -> bool:
        return any(t > token and returned < started for t, returned in grants[cid])

    counts = defaultdict(int)
    for log in logs:
        mine = [e[2] for e in log if e[0] == "grant"]
        assert mine == sorted(mine), "one worker's tokens go up"
        for event in log:
            kind, cid, token, started = event[:4]
            if kind == "renew" and event[5]:
                assert not overtaken(cid, token, started), f"renewed an overtaken lease {event}"
            if kind != "commit":
                continue
            ok, previous = event[5], event[6]
            counts["commits" if ok else "refused"] += 1
            if ok:
                counts[cid] += 1
                assert previous < token, f"committed over a later holder's state {event}"
                assert not overtaken(cid, token, started), f"an overtaken lease committed {event}"
            elif overtaken(cid, token, started):
                counts["refused_overtaken"] += 1
    for cid in CONVERSATIONS:
        state = final[cid]
        assert (state.window_start if state else 0) == counts[cid], "lost or phantom commit"
    return dict(counts)


@pytest.mark.slow
@pytest.mark.parametrize("kind", DURABLE)
def test_no_two_processes_ever_hold_overlapping_leases(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if kind == "sqlite":
        target, namespace = str(tmp_path / "state.db"), ""
    elif kind == "redis":
        target, namespace = request.getfixturevalue("redis_url"), f"fleet{uuid.uuid4().hex[:6]}:"
    else:
        target, namespace = request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}"
        request.addfinalizer(lambda: drop_pg_tables(target, namespace))
    open_store(kind, target, namespace).close()  # create the schema once, up front
    start = time.time() + 4.0  # time for every worker to import and connect
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.lease_worker", kind, target, namespace,
             str(n), str(start), str(DURATION), str(tmp_path / f"w{n}.json")],
            cwd=ROOT,
        )
        for n in range(WORKERS)
    ]  # fmt: skip
    try:
        for p in procs:
            assert p.wait(timeout=max(1.0, start + DURATION + 60 - time.time())) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    logs = [json.loads((tmp_path / f"w{n}.json").read_text()) for n in range(WORKERS)]
    store = open_store(kind, target, namespace)
    try:
        final = {cid: store.get(cid) for cid in CONVERSATIONS}
    finally:
        store.close()
    counts = _check(logs, final)
    # Not vacuous: commits happened, and paused workers were refused after a takeover.
    assert counts.get("commits", 0) >= 10, counts
    assert counts.get("refused_overtaken", 0) >= 1, counts
