"""Store-level fencing across processes, on SQLite files, Redis and Postgres.

Four worker processes (tests/support/lease_worker.py) contend for the leases of three
conversations for a few seconds, renewing, sometimes pausing past their TTL, and commit
only with their lease. From their logs (wall-clock bounds around every call) we check
what fencing promises:

- every fencing token is granted once, and a conversation's committed tokens increase;
- no commit or renewal with token t succeeded after a grant of a higher token on the
  same conversation had returned: two leases never overlapped where it matters;
- the final state counts every successful commit (no lost update).

The measured period starts once every worker has imported demote and connected (each
writes a ready file; the test then writes the start time to a go file): on a loaded
machine an import alone can take seconds, and a start fixed in advance left no time to
work. Bounded: at most 2,000 rounds a worker, 2.5 s of work, 90 s for the workers to get
ready, 60 s more to finish.
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
READY_WAIT = 90.0
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


def _start_when_ready(procs: list[subprocess.Popen[bytes]], tmp_path: Path, go: Path) -> None:
    """Wait (at most READY_WAIT s) until every worker is ready, then write the start time."""
    deadline = time.monotonic() + READY_WAIT
    ready = [tmp_path / f"w{n}.json.ready" for n in range(len(procs))]
    while not all(r.exists() for r in ready):
        failed = [p.returncode for p in procs if p.poll() is not None]
        assert not failed, f"a worker exited before it was ready: {failed}"
        assert time.monotonic() < deadline, f"workers not ready within {READY_WAIT} s"
        time.sleep(0.02)
    part = go.with_suffix(".part")  # written whole, then renamed: never read half-written
    part.write_text(repr(time.time() + 0.2), encoding="utf-8")
    part.replace(go)


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
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.lease_worker", kind, target, namespace,
             str(n), str(go), str(DURATION), str(tmp_path / f"w{n}.json")],
            cwd=ROOT,
        )
        for n in range(WORKERS)
    ]  # fmt: skip
    try:
        _start_when_ready(procs, tmp_path, go)
        start = float(go.read_text(encoding="utf-8"))
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
