"""Outage section, the slow-sink row: chat-turn latency while the sink takes 2 s a call.

A steady chat (several conversations, turns paced round-robin, sync loads on a
``SQLiteStateStore``) demotes into a real ``SQLiteArchive`` behind a hook that, for a
period of ``during`` seconds, takes ``delay`` seconds per call. The row reports p50, p99
and max turn latency before, during and after that period, the turns that failed (goal
0), how long demotion took to catch up once the sink was fast again (every conversation's
watermark at its window start), and how many messages reached the archive twice (goal 0).

``python -m bench.slow_sink [--quick]`` prints the row and writes
``bench/results/slow_sink.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS, environment, synthetic_chat, table, write_json
from demote import Demoter, Demotion, SlidingWindow, SQLiteArchive, SQLiteStateStore
from demote.records import MessageRecord


class SlowArchive:
    """The archive behind a switch: while ``slow`` is set, each call first sleeps."""

    def __init__(self, archive: SQLiteArchive, delay: float) -> None:
        self.archive = archive
        self.delay = delay
        self.slow = threading.Event()
        self.keys: Counter[str] = Counter()
        self._lock = threading.Lock()

    def deliver(self, batch: Demotion) -> None:
        if self.slow.is_set():
            time.sleep(self.delay)
        self.archive.deliver(batch)
        with self._lock:
            self.keys.update(m.key for m in batch.messages)


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "turns": len(values),
        "p50_ms": statistics.median(values) * 1e3 if values else float("nan"),
        "p99_ms": _pct(values, 0.99) * 1e3,
        "max_ms": max(values) * 1e3 if values else float("nan"),
    }


def slow_sink_row(
    *,
    before: float = 5.0,
    during: float = 10.0,
    after: float = 10.0,
    delay: float = 2.0,
    conversations: int = 4,
    interval: float = 0.02,
) -> dict[str, Any]:
    """Run the steady chat through a slow period of the sink; the outage row."""
    pool = synthetic_chat(4000, words=30)
    with tempfile.TemporaryDirectory() as tmp:
        archive = SQLiteArchive(Path(tmp) / "archive.db")
        sink = SlowArchive(archive, delay)
        state = SQLiteStateStore(Path(tmp) / "state.db")
        demoter = Demoter(SlidingWindow.last_messages(10), sink, state=state)

        def describe(m: tuple[str, str]) -> MessageRecord:
            return demoter.describe(m[0], m[1])

        histories: dict[str, list[tuple[str, str]]] = {f"c{n}": [] for n in range(conversations)}
        latencies: dict[str, list[float]] = {"before": [], "during": [], "after": []}
        failed = 0
        caught_up: float | None = None
        start = time.monotonic()
        slow_from, slow_until = start + before, start + before + during
        end = slow_until + after
        turn = 0
        while time.monotonic() < end:
            now = time.monotonic()
            phase = "before" if now < slow_from else "during" if now < slow_until else "after"
            if phase == "during" and not sink.slow.is_set():
                sink.slow.set()
            elif phase == "after" and sink.slow.is_set():
                sink.slow.clear()
            cid = f"c{turn % conversations}"
            history = histories[cid]
            history += pool[(2 * turn) % len(pool) : (2 * turn) % len(pool) + 2]
            t0 = time.perf_counter()
            try:
                demoter.load(cid, history, describe)
            except Exception:
                failed += 1
            latencies[phase].append(time.perf_counter() - t0)
            turn += 1
            if phase == "after" and caught_up is None:
                states = [demoter.state_of(c) for c in histories]
                if all(s.delivered >= s.window_start for s in states):
                    caught_up = time.monotonic() - slow_until
            time.sleep(interval)
        demoter.drain(30)
        duplicates = sum(n - 1 for n in sink.keys.values() if n > 1)
        demoter.close()
        state.close()
        archive.close()
    return {
        "store": f"slow sink ({delay:g} s a call)",
        "outage_s": during,
        **{phase: _summary(values) for phase, values in latencies.items()},
        "failed_turns": failed,
        "catch_up_s": caught_up,
        "delivered_twice": duplicates,
    }


COLUMNS = [
    ("phase", "phase", ""),
    ("turns", "turns", "d"),
    ("p50_ms", "p50 ms", ".2f"),
    ("p99_ms", "p99 ms", ".2f"),
    ("max_ms", "max ms", ".1f"),
]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run (1 s, 2 s, 3 s)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    row = slow_sink_row(before=1.0, during=2.0, after=3.0) if args.quick else slow_sink_row()
    rows = [{"phase": p, **row[p]} for p in ("before", "during", "after")]
    print(row["store"], f"for {row['outage_s']:g} s")
    print(table(rows, COLUMNS))
    print(
        f"failed turns: {row['failed_turns']}, demotion caught up "
        f"{row['catch_up_s']:.2f} s after the sink was fast again, "
        f"delivered twice: {row['delivered_twice']}"
        if row["catch_up_s"] is not None
        else f"failed turns: {row['failed_turns']}, demotion had not caught up"
    )
    write_json("slow_sink", {"environment": environment(), "row": row}, args.out)


if __name__ == "__main__":
    main()
