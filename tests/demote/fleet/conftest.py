"""The fleet harness: worker processes on one shared store and one shared sink.

``fleet`` starts workers of tests/support/engine_worker.py (each a real Demoter in its own
process), coordinates them through files in the test's directory (ready, go, entered,
release, stop), pauses or kills them, and reads the shared sink to count what was
delivered. Every wait is bounded; workers still running at the end are killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from demote import ConversationState
from tests.demote.state.conftest import DURABLE, drop_pg_tables
from tests.support.engine_worker import Config, Worker
from tests.support.fleet_sink import Sink, key
from tests.support.lease_worker import open_store

ROOT = Path(__file__).resolve().parents[3]
#: Lease TTL of the workers: long enough that a renewal is never late on a busy 2-core
#: machine (the keeper renews every third of it), short enough to wait out.
TTL = 1.0
#: Longest a test waits for any one thing (a marker, a worker's exit).
PATIENCE = 60.0


def mode(n: int) -> str:
    """Workers alternate: ``load`` (even), ``aload`` with a native async hook (odd)."""
    return ("sync", "async")[n % 2]


@dataclass(frozen=True)
class Backend:
    kind: str
    target: str
    namespace: str


@pytest.fixture(params=DURABLE)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The shared state store: an SQLite file, a Redis prefix or a Postgres table."""
    kind = request.param
    if kind == "sqlite":
        made = Backend(kind, str(tmp_path / "state.db"), "")
    elif kind == "redis":
        made = Backend(kind, request.getfixturevalue("redis_url"), f"f{uuid.uuid4().hex[:8]}:")
    else:
        made = Backend(kind, request.getfixturevalue("postgres_url"), f"f_{uuid.uuid4().hex[:12]}")
        request.addfinalizer(lambda: drop_pg_tables(made.target, made.namespace))
    open_store(made.kind, made.target, made.namespace).close()  # the schema, up front
    return made


class Fleet:
    """Starts, signals and reads the workers of one test."""

    def __init__(self, backend: Backend, directory: Path) -> None:
        self.backend = backend
        self.dir = directory
        self.sink = Sink(directory / "sink.db")
        self.sink.create()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- workers -------------------------------------------------------------------------

    def config(self, name: str, **fields: Any) -> Config:
        b = self.backend
        fields.setdefault("lease_ttl", TTL)
        target = fields.pop("target", b.target)  # another way to the same store (a proxy)
        return Config(
            name, b.kind, target, b.namespace, str(self.sink.path), str(self.dir), **fields
        )

    def start(self, name: str, **fields: Any) -> subprocess.Popen[bytes]:
        path = self.dir / f"config-{name}.json"
        path.write_text(json.dumps(asdict(self.config(name, **fields))))
        with (self.dir / f"stderr-{name}.txt").open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.engine_worker", str(path)],
                cwd=ROOT,
                stderr=err,
            )
        self.procs[name] = proc
        return proc

    def take_turns(
        self,
        cids: list[str],
        *,
        workers: int = 4,
        only: dict[str, Any] | None = None,
        **fields: Any,
    ) -> list[str]:
        """Start ``workers`` workers, sync and async in turn, each appending a turn and
        loading ``cids`` in turn (from its own first), and let them go at once.

        ``only`` gives one worker (``w<n>``) fields of its own. Returns their names.
        """
        names = [f"w{n}" for n in range(workers)]
        for n, name in enumerate(names):
            mine = {**fields, **(only or {}).get(name, {})}
            k = n % len(cids)
            self.start(name, mode=mode(n), cids=cids[k:] + cids[:k], append=2, go="go", **mine)
        self.go(names)
        return names

    def run_here(self, name: str, **fields: Any) -> None:
        """Run a worker in this process (the final load: no concurrency left)."""
        worker = Worker(self.config(name, **fields))
        try:
            worker.run()
        finally:
            worker.close()

    def go(self, names: list[str], file: str = "go", *, not_before: float = 0.0) -> None:
        """Wait until ``names`` are set up, then let them start at once (not before then)."""
        for name in names:
            self.wait_until(lambda n=name: (self.dir / f"ready-{n}").exists(), f"{name} ready")
        time.sleep(max(0.0, not_before - time.time()))
        self.touch(file)

    def touch(self, file: str) -> None:
        (self.dir / file).touch()

    def release(self, name: str) -> None:
        self.touch(f"release-{name}")

    def entered(self, names: list[str]) -> tuple[str, dict[str, Any]]:
        """The first of ``names`` whose hook held, and its marker."""
        found: list[str] = []

        def any_marker() -> bool:
            found[:] = [n for n in names if (self.dir / f"entered-{n}.json").exists()]
            return bool(found)

        self.wait_until(any_marker, f"a hook of {names} to hold")
        name = found[0]
        return name, json.loads((self.dir / f"entered-{name}.json").read_text())

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.procs[name].pid, sig)

    def finish(self, *names: str) -> None:
        """Wait for workers to exit; each must exit cleanly."""
        for name in names or list(self.procs):
            proc = self.procs[name]
            try:
                code = proc.wait(timeout=PATIENCE)
            except subprocess.TimeoutExpired:
                pytest.fail(f"worker {name} did not finish within {PATIENCE} s")
            err = (self.dir / f"stderr-{name}.txt").read_text(errors="replace")
            assert code == 0, f"worker {name} exited with {code}:\n{err[-3000:]}"

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:  # SIGKILL ends a stopped process too
                proc.kill()
                proc.wait(10)

    def wait_until(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + PATIENCE
        while not ready():
            if time.monotonic() > deadline:
                pytest.fail(f"waited {PATIENCE} s for {what}")
            time.sleep(0.01)

    # -- what happened -------------------------------------------------------------------

    def windows(self, name: str) -> list[dict[str, Any]]:
        """What each load of worker ``name`` returned, in order."""
        path = self.dir / f"windows-{name}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines]

    def state(self, cid: str) -> ConversationState | None:
        store = open_store(self.backend.kind, self.backend.target, self.backend.namespace)
        try:
            return store.get(cid)  # type: ignore[no-any-return]
        finally:
            store.close()

    def duplicates(self) -> list[tuple[Any, ...]]:
        """Keys the sink holds more than once: (key, cid, index, workers, fences)."""
        return self.sink.rows(
            "SELECT key, cid, idx, group_concat(worker), group_concat(fence) FROM delivered "
            "GROUP BY key HAVING COUNT(*) > 1"
        )

    def missing(self, cid: str, upto: int) -> list[int]:
        """Indexes below ``upto`` of ``cid``'s current history that the sink lacks."""
        epoch, _ = self.sink.history(cid)
        held = {k for (k,) in self.sink.rows("SELECT key FROM delivered WHERE cid = ?", cid)}
        return [i for i in range(upto) if key(cid, epoch, i) not in held]

    def final_load(self, cids: list[str]) -> dict[str, tuple[int, int, int]]:
        """Load every conversation once more, alone: {cid: (start, delivered, pending)}."""
        self.run_here("final", cids=cids, rounds=len(cids))
        rows = self.sink.rows(
            "SELECT cid, start, delivered, pending FROM loads WHERE worker = 'final'"
        )
        return {cid: (start, delivered, pending) for cid, start, delivered, pending in rows}

    def assert_nothing_lost(self, cids: list[str]) -> None:
        """Below each watermark all is in the sink; a final load delivers all pending."""
        for cid in cids:
            state = self.state(cid) or ConversationState()
            assert self.missing(cid, state.delivered) == [], f"lost below the watermark of {cid}"
        final = self.final_load(cids)
        for cid in cids:
            start, delivered, pending = final[cid]
            assert pending == 0 and delivered == start, (cid, final[cid])
            assert self.missing(cid, start) == [], f"lost from {cid} after the final load"


@pytest.fixture
def fleet(backend: Backend, tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(backend, tmp_path)
    try:
        yield made
    finally:
        made.kill_all()
        made.sink.close()
