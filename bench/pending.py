"""Pending deliveries after a busy run: 16 application threads over 1,000 LlamaIndex chats.

Each of ``threads`` threads takes conversations from a shared queue and plays ``turns``
turns of each through its own ``DemotingMemory`` (put the question, read the window as a
chat engine does, put the answer) over one shared ``Demoter`` demoting into a real
``SQLiteArchive``: more application threads than ``hook_threads``, so the hook is busy.
A conversation is never loaded again once its turns are played (it has ended).

A message is *missing* when it is before its conversation's final window (the policy over
the whole history) and not in the archive: pending, or never committed. The row reports
how many are missing when the run ends, how long until none are without any further load
(the background retries), and, on a second identical run, how long ``drain()`` takes to
leave none; and how many messages reached the archive twice (goal 0 everywhere). Two
configurations: the defaults (a busy hook queues calls, ``hook_queue=64``), and
``hook_queue=0``, where every call beyond the hook threads is refused, so only the
background retries deliver what is left.

On the release before (no queue, no background retries) the same run left 7,354 of 8,000
demoted messages missing, ten seconds later too, and 7,316 after ``drain()`` (every
refusal backed its conversation off, and an ended conversation was never loaded again);
the issue's run, with a model call per turn, 444.

``python -m bench.pending [--quick]`` prints the rows and writes
``bench/results/pending.json``.
"""

from __future__ import annotations

import argparse
import queue
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS, environment, table, write_json

POLICY_LIMIT = 4  # the window: the last 4 messages


def pending_run(
    *,
    conversations: int = 1000,
    turns: int = 6,
    threads: int = 16,
    hook_threads: int = 8,
    hook_queue: int = 64,
    drain: bool = False,
    settle_timeout: float = 60.0,
) -> dict[str, Any]:
    """One run; with ``drain`` the pending are drained at the end, else waited out."""
    from llama_index.core.base.llms.types import ChatMessage

    from demote import Demoter, Demotion, NoopHook, SlidingWindow, SQLiteArchive
    from llamaindex_demote import DemotingMemory

    policy = SlidingWindow.last_messages(POLICY_LIMIT)
    with tempfile.TemporaryDirectory() as tmp:
        archive = SQLiteArchive(Path(tmp) / "archive.db")
        keys: Counter[str] = Counter()
        lock = threading.Lock()

        class Counting:
            """The archive, counting what reaches it (it is idempotent on the key)."""

            def deliver(self, batch: Demotion) -> None:
                archive.deliver(batch)
                with lock:
                    keys.update(m.key for m in batch.messages)

        demoter = Demoter(policy, Counting(), hook_threads=hook_threads, hook_queue=hook_queue)
        todo: queue.SimpleQueue[str] = queue.SimpleQueue()
        for n in range(conversations):
            todo.put(f"chat-{n}")
        memories: dict[str, DemotingMemory] = {}
        errors: list[BaseException] = []

        def play() -> None:
            while True:
                try:
                    cid = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key=cid)
                    memories[cid] = memory
                    for t in range(turns):
                        text = f"{cid} question {t}: " + "about the garden and the river " * 3
                        memory.put(ChatMessage(role="user", content=text))
                        memory.get()
                        memory.put(ChatMessage(role="assistant", content=f"{cid} answer {t}"))
                except BaseException as exc:  # reported in the row
                    errors.append(exc)
                    return

        began = time.perf_counter()
        workers = [threading.Thread(target=play) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        run_s = time.perf_counter() - began
        plain = Demoter(policy, NoopHook())
        final = {}  # each conversation's final window start, from its whole history
        for cid, memory in memories.items():
            history = memory.chat_store.get_messages(cid)
            final[cid] = plain.load(cid, history, memory._p.describe).start

        def missing() -> int:
            return sum(max(0, final[c] - archive.count(c)) for c in final)

        at_end = missing()
        refused = demoter.stats().failures
        settle_s: float | None = None
        drain_s: float | None = None
        t0 = time.perf_counter()
        if drain:
            drained = demoter.drain(settle_timeout)
            drain_s = time.perf_counter() - t0
            left = missing()
            assert drained or left, "drain() said something was left"
        else:
            left = at_end
            while left and time.perf_counter() - t0 < settle_timeout:
                time.sleep(0.1)
                left = missing()
            if not left:
                settle_s = time.perf_counter() - t0
        stats = demoter.stats()
        demoter.close()
        archive.close()
    return {
        "config": f"hook_threads={hook_threads}, hook_queue={hook_queue}",
        "conversations": conversations,
        "threads": threads,
        "demoted": sum(final.values()),
        "run_s": run_s,
        "missing_at_end": at_end,
        "refused": refused,
        "settle_s": settle_s,
        "drain_s": drain_s,
        "missing_after": left,
        "background_retries": stats.retries,
        "delivered_twice": sum(n - 1 for n in keys.values() if n > 1),
        "errors": [repr(e) for e in errors],
    }


def pending_rows(*, conversations: int = 1000, turns: int = 6) -> list[dict[str, Any]]:
    """For each configuration: a run waited out, and an identical run drained."""
    rows = []
    for hook_queue in (64, 0):
        waited = pending_run(conversations=conversations, turns=turns, hook_queue=hook_queue)
        drained = pending_run(
            conversations=conversations, turns=turns, hook_queue=hook_queue, drain=True
        )
        rows.append(
            {
                **waited,
                "drain_s": drained["drain_s"],
                "drained_missing_at_end": drained["missing_at_end"],
                "missing_after_drain": drained["missing_after"],
                "delivered_twice": waited["delivered_twice"] + drained["delivered_twice"],
                "errors": waited["errors"] + drained["errors"],
            }
        )
    return rows


COLUMNS = [
    ("config", "configuration", ""),
    ("demoted", "demoted", "d"),
    ("run_s", "run s", ".1f"),
    ("missing_at_end", "missing at end", "d"),
    ("refused", "refused calls", "d"),
    ("settle_s", "s to 0, no load", ".2f"),
    ("drained_missing_at_end", "missing (drained run)", "d"),
    ("drain_s", "drain() s", ".2f"),
    ("missing_after_drain", "after drain", "d"),
    ("delivered_twice", "twice", "d"),
]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 conversations, 4 turns")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = pending_rows(conversations=100, turns=4) if args.quick else pending_rows()
    print(table(rows, COLUMNS))
    write_json("pending", {"environment": environment(), "rows": rows}, args.out)


if __name__ == "__main__":
    main()
