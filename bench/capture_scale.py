"""Section 4: capture off the request path, and the cost of tracking many conversations.

Part 1, capture latency (:mod:`bench.capture_latency`). A *turn* is what a LangChain app
does per exchange with :class:`~langchain_demote.DemotingChatMessageHistory` (``capture=``
set): ``add_messages([user, ai])`` then a ``.messages`` read (the window), over an in-memory
history prefilled with 200 messages (4,000-token window, so most turns demote). The new
user message goes to ``capture.capture(turn)``. The sink behind it sleeps
``SINK_SECONDS`` (3 s) per item, standing in for an LLM fact-extraction call (mem0's
``add``). Four setups, timed turn by turn, interleaved in the same run (the order rotates
every turn):

- ``no capture``: the baseline every other setup is compared with;
- ``Recorder(sink)``: the Recorder itself is the capture (it implements ``capture``, as
  :class:`~demote.mem0.Mem0Capture` does in front of its Recorder); ``capture`` queues;
- ``Recorder(sink, outbox=SQLiteOutbox(...))``: the same, each item written durably first;
- ``inline``: the sink called inside the turn, the way llama-index-memory-mem0 makes its
  extraction call. Each of these turns costs the full 3 s, so only a handful run
  (``INLINE_TURNS``), each paired with a baseline turn just before it.

*Added* latency is a setup's percentile minus the baseline's, per round; the table shows
the median over rounds. The Recorders are closed with a small ``flush_timeout`` while
their worker is still in the first 3-s call: what was queued is abandoned (no outbox) or
left in the outbox for the next start, and the table says how many.

Part 2, scale. 10,000 conversations are driven through real :meth:`demote.Demoter.load`
calls (12 to 14 short messages each, a 4-message window, a load every second message: 4
or 5 demotions, 8 to 10 messages demoted per conversation), once over
:class:`~demote.state.InMemoryStateStore` and once over
:class:`~demote.state.SQLiteStateStore`. Memory per conversation: for the in-memory store,
the ``tracemalloc`` growth that survives dropping the Demoter and the histories, divided
by 10,000 (the Demoter's own per-conversation caches are reported apart); for SQLite, the
file size (WAL checkpointed) divided by 10,000. Then the SQLite-backed Demoter serves
loads on those conversations, picked at random, each load one appended message (most
loads demote one message and commit a write transaction), from 1 and 2 threads,
alternated and repeated. Each thread draws from its own half of the conversations (one
conversation is rarely served by two threads at once). Both the GIL and the store's one
connection (behind a lock) serialise the threads.

Run alone with ``python -m bench.capture_scale``.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.capture_latency import (
    BASELINE,
    BUDGET,
    FLUSH_TIMEOUT,
    PREFILL,
    TARGET_P99_MS,
    capture_latency,
)
from bench.common import (
    RESULTS,
    agg_backend,
    environment,
    section_main,
    synthetic_chat,
    table,
    write_json,
)

SECTION = "capture"
SINK_SECONDS = 3.0
CONVERSATIONS = 10_000
SCALE_MESSAGES = 12  # per conversation
SCALE_WINDOW = 4  # messages kept
SCALE_WORDS = 20


def _settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "rounds": 2,
            "turns_per_round": 100,
            "inline_turns": 1,
            "sink_seconds": 0.2,
            "conversations": 300,
            "load_seconds": 0.2,
            "load_repeats": 1,
        }
    return {
        "rounds": 7,
        "turns_per_round": 1000,
        "inline_turns": 3,
        "sink_seconds": SINK_SECONDS,
        "conversations": CONVERSATIONS,
        "load_seconds": 0.5,
        "load_repeats": 10,
    }


# -- part 2: many conversations -------------------------------------------------------------


def _conversation(
    cid: str, n: int, start: int, pool: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """``n`` alternating messages, texts from ``pool`` (from ``start``), made unique."""
    return [
        (("user", "assistant")[j % 2], f"{cid} #{j} {pool[(start + j) % len(pool)][1]}")
        for j in range(n)
    ]


def _drive(demoter: Any, cids: list[str], pool: list[tuple[str, str]]) -> dict[str, list[Any]]:
    """Load every conversation every second message; returns the histories."""

    def describe(m: tuple[str, str]) -> Any:
        return demoter.describe(m[0], m[1])

    histories: dict[str, list[Any]] = {}
    for n, cid in enumerate(cids):
        full = _conversation(cid, SCALE_MESSAGES + n % 3, n * 7, pool)
        history = full[:SCALE_WINDOW]
        demoter.load(cid, history, describe)
        for j in range(SCALE_WINDOW, len(full), 2):
            history.extend(full[j : j + 2])
            demoter.load(cid, history, describe)
        histories[cid] = history
    return histories


def memory_per_conversation(n: int, pool: list[tuple[str, str]]) -> dict[str, Any]:
    from demote import Demoter, SlidingWindow
    from demote.state import InMemoryStateStore
    from demote.window.tokens import TokenCache

    cids = [f"conversation-{i:06d}" for i in range(n)]
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        store = InMemoryStateStore()
        demoter = Demoter(SlidingWindow.last_messages(SCALE_WINDOW), state=store)
        histories = _drive(demoter, cids, pool)
        loaded = tracemalloc.get_traced_memory()[0]
        demoted = sum(demoter.state_of(cid).delivered for cid in cids)
        del histories
        gc.collect()
        with_caches = tracemalloc.get_traced_memory()[0]
        demoter.tokens = TokenCache(demoter.policy.counter)  # drop the token-count cache
        gc.collect()
        without_tokens = tracemalloc.get_traced_memory()[0]
        del demoter
        gc.collect()
        store_only = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert store.count() == n
    return {
        "conversations": n,
        "demoted_per_conversation": demoted / n,
        "store_bytes_per_conversation": (store_only - start) / n,
        "demoter_cache_bytes_per_conversation": (with_caches - store_only) / n,
        "token_cache_bytes_per_conversation": (with_caches - without_tokens) / n,
        "everything_bytes_per_conversation": (loaded - start) / n,
    }


def sqlite_scale(
    cfg: dict[str, Any], pool: list[tuple[str, str]], tmp: Path, quiet: bool
) -> dict[str, Any]:
    from demote import Demoter, SlidingWindow
    from demote.state import SQLiteStateStore

    n = cfg["conversations"]
    cids = [f"conversation-{i:06d}" for i in range(n)]
    path = tmp / "state.db"
    store = SQLiteStateStore(path)
    demoter = Demoter(SlidingWindow.last_messages(SCALE_WINDOW), state=store)
    began = time.perf_counter()
    histories = _drive(demoter, cids, pool)
    drive_seconds = time.perf_counter() - began
    demoted = sum(demoter.state_of(cid).delivered for cid in cids)

    def describe(m: tuple[str, str]) -> Any:
        return demoter.describe(m[0], m[1])

    def worker(mine: list[str], seed: int, deadline: float, counts: list[int], k: int) -> None:
        rng = random.Random(seed)
        done = 0
        while time.perf_counter() < deadline:
            cid = rng.choice(mine)
            history = histories[cid]
            history.append((("user", "assistant")[len(history) % 2], f"{cid} +{len(history)}"))
            demoter.load(cid, history, describe)
            done += 1
        counts[k] = done

    def loads_per_second(threads: int, seed: int) -> float:
        counts = [0] * threads
        deadline = time.perf_counter() + cfg["load_seconds"]
        began = time.perf_counter()
        pool_threads = [
            threading.Thread(
                target=worker, args=(cids[k::threads], seed * 10 + k, deadline, counts, k)
            )
            for k in range(threads)
        ]
        for t in pool_threads:
            t.start()
        for t in pool_threads:
            t.join()
        return sum(counts) / (time.perf_counter() - began)

    throughput: dict[int, list[float]] = {1: [], 2: []}
    for rep in range(cfg["load_repeats"]):
        for threads in (1, 2) if rep % 2 == 0 else (2, 1):
            throughput[threads].append(loads_per_second(threads, rep * 2 + threads))
        if not quiet:
            print(
                f"  loads/s rep {rep + 1}: 1 thread {throughput[1][-1]:,.0f}, "
                f"2 threads {throughput[2][-1]:,.0f}",
                flush=True,
            )
    assert store.count() == n
    store.close()  # the last connection checkpoints the WAL into the file
    size = sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if os.path.exists(p))
    return {
        "conversations": n,
        "demoted_per_conversation": demoted / n,
        "drive_seconds": drive_seconds,
        "drive_loads_per_second": _loads_in_drive(n) / drive_seconds,
        "file_bytes": size,
        "file_bytes_per_conversation": size / n,
        "loads_per_second": {str(k): statistics.median(v) for k, v in throughput.items()},
        "loads_per_second_range": {str(k): [min(v), max(v)] for k, v in throughput.items()},
        # Each repetition runs 1 and 2 threads back to back: the ratio is paired per run.
        "two_thread_ratios": [b / a for a, b in zip(throughput[1], throughput[2], strict=True)],
        "loads_per_second_runs": {str(k): v for k, v in throughput.items()},
        "load_seconds_per_run": cfg["load_seconds"],
    }


def _loads_in_drive(n: int) -> int:
    total = 0
    for i in range(n):
        size = SCALE_MESSAGES + i % 3
        total += 1 + len(range(SCALE_WINDOW, size, 2))
    return total


# -- the section ----------------------------------------------------------------------------


def run(*, quick: bool = False, out: Path = RESULTS, quiet: bool = False) -> dict[str, Any]:
    """Run the section; returns (and writes) its results."""
    began = time.perf_counter()
    cfg = _settings(quick)
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        try:
            latency: dict[str, Any] | None = capture_latency(cfg, tmp, quiet)
        except ImportError as exc:
            latency = None
            notes.append(f"capture latency: skipped ({exc})")
        latency_seconds = time.perf_counter() - began
        pool = synthetic_chat(500, words=SCALE_WORDS, seed=1)
        memory = memory_per_conversation(cfg["conversations"], pool)
        scale = sqlite_scale(cfg, pool, tmp, quiet)
    payload = {
        "section": SECTION,
        "quick": quick,
        "settings": cfg,
        "budget_tokens": BUDGET,
        "prefill_messages": PREFILL,
        "flush_timeout": FLUSH_TIMEOUT,
        "scale_window_messages": SCALE_WINDOW,
        "scale_messages_per_conversation": f"{SCALE_MESSAGES}-{SCALE_MESSAGES + 2}",
        "latency": latency,
        "memory": memory,
        "sqlite": scale,
        "notes": notes,
        "latency_seconds": latency_seconds,
        "seconds": time.perf_counter() - began,
        "environment": environment(),
    }
    payload["plot"] = _plot(payload, out)
    write_json(SECTION, payload, out)
    return payload


def _plot(payload: dict[str, Any], out: Path) -> str | None:
    agg_backend()
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(10, 4), layout="constrained")
    left: Any
    right: Any
    left, right = fig.subplots(1, 2, width_ratios=[2, 1])
    latency = payload["latency"]
    if latency is not None:
        rows = [r for r in latency["rows"] if r["setup"] != BASELINE]
        labels = [r["setup"].replace(" (sink called in the turn)", "") for r in rows]
        y = range(len(rows))
        left.barh(
            [i + 0.2 for i in y], [max(r["p50_added_us"], 0.1) for r in rows], 0.4, label="p50"
        )
        left.barh(
            [i - 0.2 for i in y], [max(r["p99_added_us"], 0.1) for r in rows], 0.4, label="p99"
        )
        left.set_yticks(list(y), labels, fontsize="small")
        left.set_xscale("log")
        left.axvline(TARGET_P99_MS * 1000, color="grey", linestyle="--", linewidth=1)
        left.set_xlabel("latency added per turn vs no capture (us, log)")
        sink = payload["settings"]["sink_seconds"]
        left.set_title(f"Capture with a {sink:g}-s sink")
        left.invert_yaxis()
        left.legend(fontsize="small")
    lps = payload["sqlite"]["loads_per_second"]
    right.bar(["1 thread", "2 threads"], [lps["1"], lps["2"]])
    right.set_ylabel("Demoter.load per second")
    right.set_title(f"SQLite, {payload['sqlite']['conversations']:,} conv.")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{SECTION}.png"
    fig.savefig(path, dpi=110)
    return path.name


def _fmt_us(us: float) -> str:
    if abs(us) >= 1_000_000:
        return f"{us / 1e6:.2f} s"
    if abs(us) >= 1000:
        return f"{us / 1000:.1f} ms"
    return f"{us:.0f} us" if abs(us) >= 10 else f"{us:.1f} us"


def report(payload: dict[str, Any]) -> str:
    cfg = payload["settings"]
    lines = [
        f"## 4. Capture and scale (a {cfg['sink_seconds']:g}-s sink behind a Recorder vs "
        "inline; 10,000 conversations tracked)"
        if not payload["quick"]
        else f"## 4. Capture and scale (quick: {cfg['sink_seconds']:g}-s sink, "
        f"{cfg['conversations']:,} conversations)",
        "",
    ]
    latency = payload["latency"]
    if latency is not None:
        rows = []
        for r in latency["rows"]:
            left = ""
            if "abandoned" in r:
                left = f"{r['abandoned']} of {r['queued']} abandoned"
                if "left_in_outbox" in r:
                    left += f", {r['left_in_outbox']} left in the outbox"
                left += f" (close {r['close_seconds'] * 1000:.0f} ms)"
            rows.append(
                {
                    **r,
                    "p50": _fmt_us(r["p50_us"]),
                    "p99": _fmt_us(r["p99_us"]),
                    "p50_added": "-" if r["setup"] == BASELINE else _fmt_us(r["p50_added_us"]),
                    "p99_added": "-" if r["setup"] == BASELINE else _fmt_us(r["p99_added_us"]),
                    "left": left,
                }
            )
        lines.append(
            table(
                rows,
                [
                    ("setup", "setup", ""),
                    ("turns", "turns timed", ","),
                    ("p50", "p50 turn", ""),
                    ("p99", "p99 turn", ""),
                    ("p50_added", "p50 added", ""),
                    ("p99_added", "p99 added", ""),
                    ("turns_over_1ms", "turns > 1 ms", ","),
                    ("left", "at close", ""),
                ],
            )
        )
        met, within = latency["target_met"], latency["rounds_within_target"]
        lines += [
            "",
            f"Turn = add_messages([user, ai]) + .messages on DemotingChatMessageHistory "
            f"({PREFILL} messages prefilled, {BUDGET:,}-token window). Added = the setup's "
            f"percentile minus the no-capture turn's, median of {cfg['rounds']} interleaved "
            f"rounds of {cfg['turns_per_round']:,} turns. Inline: {cfg['inline_turns']} turn(s) "
            "only, each paired with a no-capture turn; its p99 column is the max. "
            f"Recorders closed with flush_timeout={FLUSH_TIMEOUT:g} s while the sink was busy. "
            "With the outbox each enqueue is one SQLite commit; WAL checkpoints run on a "
            "background thread of the outbox, which competes for the 2 cores here.",
            "Target p99 added <= 1 ms: "
            + ", ".join(
                f"{k}: {'met' if v else 'NOT met'} ({within[k]} of {cfg['rounds']} rounds)"
                for k, v in met.items()
            )
            + ".",
            "",
        ]
    mem, sq = payload["memory"], payload["sqlite"]
    lps, spread, ratios = (
        sq["loads_per_second"],
        sq["loads_per_second_range"],
        sq["two_thread_ratios"],
    )
    scale_rows = [
        {
            "what": "InMemoryStateStore, bytes per conversation (tracemalloc)",
            "value": f"{mem['store_bytes_per_conversation']:,.0f} B",
        },
        {
            "what": "  + the Demoter's in-process caches, per conversation",
            "value": f"{mem['demoter_cache_bytes_per_conversation']:,.0f} B "
            f"(token counts {mem['token_cache_bytes_per_conversation']:,.0f} B)",
        },
        {
            "what": "SQLiteStateStore, file bytes per conversation",
            "value": f"{sq['file_bytes_per_conversation']:,.0f} B",
        },
        {
            "what": "SQLite Demoter.load per second, 1 thread",
            "value": f"{lps['1']:,.0f} ({spread['1'][0]:,.0f}-{spread['1'][1]:,.0f})",
        },
        {
            "what": "SQLite Demoter.load per second, 2 threads",
            "value": f"{lps['2']:,.0f} ({spread['2'][0]:,.0f}-{spread['2'][1]:,.0f})",
        },
        {
            "what": "2 threads / 1 thread, median of paired runs",
            "value": f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
        },
    ]
    lines.append(table(scale_rows, [("what", "tracked conversations", ""), ("value", "", "")]))
    lines += [
        "",
        f"{sq['conversations']:,} conversations, {SCALE_MESSAGES}-{SCALE_MESSAGES + 2} "
        f"messages each, {SCALE_WINDOW}-message window, "
        f"{sq['demoted_per_conversation']:.1f} messages demoted per conversation by real "
        "loads. Loads/s: a random tracked conversation, one message appended, then "
        f"Demoter.load (most demote one message: a write transaction); median of "
        f"{cfg['load_repeats']} alternated {cfg['load_seconds']:g}-s runs (min-max in "
        "brackets); the GIL and the "
        "store's single locked connection serialise the two threads.",
        *payload["notes"],
        f"({payload['seconds']:.1f} s)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    section_main("python -m bench.capture_scale", run, report, argv)


if __name__ == "__main__":
    main()
