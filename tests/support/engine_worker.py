"""One worker process of the engine fleet tests (tests/demote/fleet/).

``python -m tests.support.engine_worker CONFIG`` (``CONFIG``: a JSON file, see :class:`Config`)

A worker is what a web worker behind a load balancer is: a real :class:`~demote.Demoter`
(sync ``load`` or async ``aload``) on the shared state store (an SQLite file, Redis or
Postgres), loading conversations whose history every worker sees alike. A history is a
deterministic function of its conversation, *epoch* (bumped when a worker clears it) and
length, and the current epoch and length live in the shared sink file, so a round is:
append a turn (or not), read the history, load it.

Reading the history and the committed state is one consistent step here: the worker
holds the sink file's write lock from reading the length until the load's first state
read returns (:class:`Consistent`), as a request that read both at one moment would. Only
that step is serialised; deliveries and commits run concurrently. (Without it, a worker
that read a history which others outgrew before its state read is taken for a rewrite;
tests/demote/fleet/test_stale_copy.py shows what that does.)

The hook writes every delivered key, with the worker and the batch's fencing token, to the
shared sink, which has no unique constraint, so a duplicate delivery is a second row. It
can be slow (``delay``), can refuse a batch whose token is below the highest one it saw
for the conversation (``check_fence``), and can *hold*: on a chosen delivery it writes a
marker file and waits for a release file, which is where the tests pause (SIGSTOP) or kill
(SIGKILL) the process. Every loop is bounded in rounds and wall-clock time.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demote import ConversationState, Demoter, Demotion, SlidingWindow
from demote.records import MessageRecord
from tests.support.fleet_sink import History, Sink
from tests.support.lease_worker import open_store

#: Longest any wait of a worker lasts (a release file, a go file) before it gives up.
MAX_WAIT = 60.0


@dataclass
class Config:
    """What one worker does (the JSON file's fields).

    Attributes:
        name: The worker's name in the sink.
        kind: ``sqlite``, ``redis`` or ``postgres``; ``target`` and ``namespace`` say where.
        sink: The shared sink file; ``dir``: where marker, release and go files live.
        mode: ``sync`` (``load``) or ``async`` (``aload``, a native async hook).
        cids: Conversations loaded in turn, one a round.
        rounds: Most rounds; ``duration``: most seconds; ``gap``: pause between rounds.
        append: Messages appended before each load (a turn is 2).
        go: Write ``ready-<name>`` once set up, then wait for this file (in ``dir``).
        stop: Stop the loop once this file exists.
        clear: ``{"cid", "length", "how"}``: first reset that conversation with
            ``Demoter.clear`` (or ``forget``, as ``how`` says) while its history becomes a
            new epoch of that length, write ``cleared-<name>.json``, then loop.
        delay: Seconds every hook call takes.
        hold: ``{"cid" (or null: any), "nth", "when"}``: on that delivery the hook writes
            ``entered-<name>.json`` and waits for ``release-<name>``, ``"before"`` or
            ``"after"`` it writes to the sink.
        check_fence: The sink refuses a batch below the highest token it saw.
        renew: ``False`` stops the lease keeper (a control: no renewal).
        lease_ttl, window: The Demoter's lease TTL and ``last_messages`` limit.
        hook_wait: The Demoter's ``hook_wait`` (``None``: each load waits its hook out);
            the worker drains the calls that outlive it before it exits.
    """

    name: str
    kind: str
    target: str
    namespace: str
    sink: str
    dir: str
    mode: str = "sync"
    cids: list[str] = field(default_factory=lambda: ["c"])
    rounds: int = 1
    duration: float = 30.0
    gap: float = 0.0
    append: int = 0
    go: str | None = None
    stop: str | None = None
    clear: dict[str, Any] | None = None
    delay: float = 0.0
    hold: dict[str, Any] | None = None
    check_fence: bool = False
    renew: bool = True
    lease_ttl: float = 1.0
    window: int = 2
    hook_wait: float | None = None


def wait_for(path: Path, limit: float = MAX_WAIT) -> None:
    """Block until ``path`` exists (``TimeoutError`` past ``limit`` seconds)."""
    deadline = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


async def await_for(path: Path, limit: float = MAX_WAIT) -> None:
    """:func:`wait_for` without blocking the event loop."""
    deadline = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        await asyncio.sleep(0.01)


class HookBase:
    """The worker's hook: slow, fence-checking or holding as configured."""

    def __init__(self, sink: Sink, config: Config) -> None:
        self.sink = sink
        self.config = config
        self.calls: dict[str | None, int] = {}
        self.dir = Path(config.dir)

    def _holds(self, batch: Demotion) -> str | None:
        """``"before"``/``"after"`` if this call is the one to hold, else ``None``."""
        hold = self.config.hold
        if hold is None or hold.get("cid") not in (None, batch.conversation_id):
            return None
        scope = hold.get("cid")
        self.calls[scope] = self.calls.get(scope, 0) + 1
        return str(hold.get("when", "before")) if self.calls[scope] == hold["nth"] else None

    def _mark(self, batch: Demotion, entered: float) -> Path:
        marker = {
            "pid": os.getpid(),
            "cid": batch.conversation_id,
            "fence": batch.fence,
            "indexes": [m.index for m in batch.messages],
            "entered": entered,
        }
        tmp = self.dir / f".entered-{self.config.name}.tmp"
        tmp.write_text(json.dumps(marker))
        tmp.replace(self.dir / f"entered-{self.config.name}.json")
        return self.dir / f"release-{self.config.name}"

    def _write(self, batch: Demotion, entered: float) -> None:
        ok = self.sink.write(self.config.name, batch, check_fence=self.config.check_fence)
        self.sink.called(self.config.name, batch, entered, ok)
        if not ok:
            raise RuntimeError(f"the sink refused a stale writer (fence {batch.fence})")


class SinkHook(HookBase):
    """The hook of a sync worker (``deliver``)."""

    def deliver(self, batch: Demotion) -> None:
        entered, hold = time.time(), self._holds(batch)
        time.sleep(self.config.delay)
        if hold == "after":
            self._write(batch, entered)
        if hold is not None:
            wait_for(self._mark(batch, entered))
        if hold != "after":
            self._write(batch, entered)


class AsyncSinkHook(HookBase):
    """The hook of an async worker, natively async: it sleeps and waits on the event loop."""

    async def adeliver(self, batch: Demotion) -> None:
        entered, hold = time.time(), self._holds(batch)
        await asyncio.sleep(self.config.delay)
        if hold == "after":
            await asyncio.to_thread(self._write, batch, entered)
        if hold is not None:
            await await_for(self._mark(batch, entered))
        if hold != "after":
            await asyncio.to_thread(self._write, batch, entered)


class Consistent:
    """The shared store, ending the sink's read transaction once a load read its state."""

    def __init__(self, store: Any, sink: Sink) -> None:
        self._store = store
        self._sink = sink

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def get(self, conversation_id: str) -> ConversationState | None:
        try:
            return self._store.get(conversation_id)  # type: ignore[no-any-return]
        finally:
            self._sink.end_read()

    async def aget(self, conversation_id: str) -> ConversationState | None:
        try:
            return await self._store.aget(conversation_id)  # type: ignore[no-any-return]
        finally:
            self._sink.end_read()


def make_demoter(config: Config, store: Any, sink: Sink) -> Demoter:
    hook: HookBase = (AsyncSinkHook if config.mode == "async" else SinkHook)(sink, config)
    demoter = Demoter(
        SlidingWindow.last_messages(config.window),
        hook,
        state=Consistent(store, sink),
        lease_ttl=config.lease_ttl,
        hook_timeout=MAX_WAIT,
        # By default each load waits its (slow) hook out: the leases are what is watched.
        hook_wait=config.hook_wait,
    )
    if not config.renew:
        demoter._delivery.keeper.close()  # the control: nothing renews this worker's leases
    return demoter


def describer(demoter: Demoter) -> Any:
    def describe(message: tuple[str, str]) -> MessageRecord:
        return demoter.describe(message[0], message[1])

    return describe


class Worker:
    """One worker's loop, written once for both drivers (``step`` yields the load)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.sink = Sink(config.sink)
        self.store = open_store(config.kind, config.target, config.namespace)
        self.demoter = make_demoter(config, self.store, self.sink)
        self.describe = describer(self.demoter)
        self.history = History()
        self.dir = Path(config.dir)

    def rounds(self) -> Any:
        """The loop: yields ``(cid, epoch, messages)`` to load; bounded in count and time."""
        c = self.config
        until = time.monotonic() + c.duration
        for r in range(c.rounds):
            if time.monotonic() > until or (c.stop and (self.dir / c.stop).exists()):
                return
            cid = c.cids[r % len(c.cids)]
            epoch, n = self.sink.begin_read(cid, c.append)
            yield cid, epoch, self.history.of(cid, epoch, n)
            if c.gap:
                time.sleep(c.gap)

    def cleared(self, state: ConversationState | None) -> None:
        out = self.dir / f"cleared-{self.config.name}.json"
        generation = None if state is None else state.generation
        out.write_text(json.dumps({"generation": generation, "at": time.time()}))

    def begin_clear(self) -> tuple[str, str]:
        """Start the reset: a new epoch of the history, under the sink's lock.

        Returns the conversation and the Demoter method (``clear`` or ``forget``).
        """
        assert self.config.clear is not None
        cid = self.config.clear["cid"]
        epoch, _ = self.sink.begin_read(cid, 0)
        self.sink.set_history(cid, epoch + 1, int(self.config.clear["length"]))
        return str(cid), str(self.config.clear.get("how", "clear"))

    def record(self, cid: str, window: Any) -> None:
        """Append what the load returned to ``windows-<name>.jsonl`` (degraded included)."""
        seen = {
            "cid": cid,
            "start": window.start,
            "delivered": window.delivered,
            "pending": window.pending,
            "demoted": window.demoted,
            "degraded": window.degraded,
        }
        with (self.dir / f"windows-{self.config.name}.jsonl").open("a") as out:
            out.write(json.dumps(seen) + "\n")

    def ready(self) -> None:
        (self.dir / f"ready-{self.config.name}").touch()

    def run(self) -> None:
        c = self.config
        if c.go:
            self.ready()
            wait_for(self.dir / c.go)
        if c.clear:
            cid, how = self.begin_clear()
            try:
                getattr(self.demoter, how)(cid)
            finally:
                self.sink.end_read()
            self.cleared(self.store.get(cid))
        for cid, epoch, messages in self.rounds():
            t0 = time.time()
            try:
                window = self.demoter.load(cid, messages, self.describe)
            finally:
                self.sink.end_read()
            self.sink.loaded(c.name, cid, epoch, len(messages), t0, window)
            self.record(cid, window)
        # Hook calls that outlived hook_wait end, and what is pending is delivered; not in
        # the control without renewal, whose every commit after a slow call is refused.
        if not self.demoter.drain(MAX_WAIT) and c.renew:
            raise TimeoutError("background deliveries did not end")

    async def arun(self) -> None:
        c = self.config
        if c.go:
            self.ready()
            await await_for(self.dir / c.go)
        if c.clear:
            cid, how = self.begin_clear()
            try:
                await getattr(self.demoter, "a" + how)(cid)
            finally:
                self.sink.end_read()
            self.cleared(await self.store.aget(cid))
        for cid, epoch, messages in self.rounds():
            t0 = time.time()
            try:
                window = await self.demoter.aload(cid, messages, self.describe)
            finally:
                self.sink.end_read()
            self.sink.loaded(c.name, cid, epoch, len(messages), t0, window)
            self.record(cid, window)
        if not await self.demoter.adrain(MAX_WAIT) and c.renew:  # (as in run)
            raise TimeoutError("background deliveries did not end")
        await self.store.aclose()  # this loop's async client, before the loop closes

    def close(self) -> None:
        self.demoter.close()
        self.store.close()
        self.sink.close()


def main() -> None:
    config = Config(**json.loads(Path(sys.argv[1]).read_text()))
    worker = Worker(config)
    try:
        if config.mode == "async":
            asyncio.run(worker.arun())
        else:
            worker.run()
    finally:
        worker.close()


if __name__ == "__main__":
    main()
