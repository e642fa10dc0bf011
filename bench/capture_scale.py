"""Section 4: capture off the request path, and the cost of tracking many conversations.

Part 1, capture latency. A *turn* is what a LangChain app does per exchange with
:class:`~langchain_demote.DemotingChatMessageHistory` (``capture=`` set):
``add_messages([user, ai])`` then a ``.messages`` read (the window), over an in-memory
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
import logging
import os
import random
import statistics
import tempfile
import threading
import time
import tracemalloc
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
BUDGET = 4000
PREFILL = 200
SINK_SECONDS = 3.0
FLUSH_TIMEOUT = 0.05
TARGET_P99_MS = 1.0
CONVERSATIONS = 10_000
SCALE_MESSAGES = 12  # per conversation
SCALE_WINDOW = 4  # messages kept
SCALE_WORDS = 20

BASELINE = "no capture"
QUEUED = "Recorder(sink)"
DURABLE = "Recorder(sink, outbox=SQLiteOutbox)"
INLINE = "inline (sink called in the turn)"


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


# -- part 1: capture latency ---------------------------------------------------------------


class _Sink:
    """Sleeps ``seconds`` per item (an extraction call); ``release`` ends every sleep."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0
        self._released = threading.Event()

    def __call__(self, item: object) -> None:
        self.calls += 1
        self._released.wait(self.seconds)

    def release(self) -> None:
        self._released.set()


class _Inline:
    """A capture that makes the sink call inside the turn."""

    def __init__(self, sink: _Sink) -> None:
        self.sink = sink

    def capture(self, turn: object) -> None:
        self.sink(turn)


def _history(capture: Any, prefill: list[tuple[str, str]]) -> Callable[[int], object]:
    """A prepared DemotingChatMessageHistory; returns turn(i)."""
    from langchain_core.chat_history import InMemoryChatMessageHistory
    from langchain_core.messages import AIMessage, HumanMessage

    from demote import Demoter, SlidingWindow
    from langchain_demote import DemotingChatMessageHistory

    kinds = {"user": HumanMessage, "assistant": AIMessage}
    with warnings.catch_warnings():  # LangChain installs its warning filter on import
        warnings.filterwarnings("ignore", message=".*InMemoryChatMessageHistory.*deprecated")
        inner = InMemoryChatMessageHistory(messages=[kinds[r](t) for r, t in prefill])
    memory = DemotingChatMessageHistory(
        inner=inner,
        demoter=Demoter(SlidingWindow.last_tokens(BUDGET)),
        conversation_id="bench",
        capture=capture,
    )
    _ = memory.messages  # the history so far is already planned

    def turn(i: int) -> object:
        text = prefill[i % len(prefill)][1]
        memory.add_messages([HumanMessage(f"user {i} {text}"), AIMessage(f"ai {i} {text}")])
        return memory.messages

    return turn


def _timed(turn: Callable[[int], object], i: int) -> float:
    began = time.perf_counter()
    turn(i)
    return time.perf_counter() - began


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def capture_latency(cfg: dict[str, Any], tmp: Path, quiet: bool) -> dict[str, Any]:
    from demote.capture import Recorder, SQLiteOutbox

    prefill = synthetic_chat(PREFILL)
    sink = _Sink(cfg["sink_seconds"])
    outbox = SQLiteOutbox(tmp / "outbox.db")
    recorders = {
        QUEUED: Recorder(sink, flush_timeout=FLUSH_TIMEOUT),
        DURABLE: Recorder(sink, flush_timeout=FLUSH_TIMEOUT, outbox=outbox),
    }
    for recorder in recorders.values():
        recorder.start()
    turns = {BASELINE: _history(None, prefill)}
    turns.update({name: _history(r, prefill) for name, r in recorders.items()})
    names = list(turns)
    counter = 0
    for turn in turns.values():  # warm-up, not timed
        for _ in range(3):
            turn(counter)
            counter += 1

    per_round: list[dict[str, dict[str, float]]] = []
    for r in range(cfg["rounds"]):
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(cfg["turns_per_round"]):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(_timed(turns[name], counter))
                counter += 1
        stats = {
            name: {
                "p50": _pct(s, 0.5),
                "p99": _pct(s, 0.99),
                "max": max(s),
                "over_1ms": sum(x > 0.001 for x in s),
            }
            for name, s in samples.items()
        }
        per_round.append(stats)
        if not quiet:
            line = ", ".join(f"{n}: p99 {v['p99'] * 1e6:.0f} us" for n, v in stats.items())
            print(f"  round {r + 1}: {line}", flush=True)

    # Inline: each turn takes the sink's full time, so only a few, each after a baseline.
    inline = _history(_Inline(sink), prefill)
    inline(counter)  # warm-up, and one sink call
    counter += 1
    inline_pairs = []
    for _ in range(cfg["inline_turns"]):
        base = _timed(turns[BASELINE], counter)
        inline_pairs.append((_timed(inline, counter + 1), base))
        counter += 2

    # Close while the worker is still inside its first sink call.
    closing: dict[str, dict[str, Any]] = {}
    capture_log = logging.getLogger("demote.capture")
    level = capture_log.level
    capture_log.setLevel(logging.ERROR)  # the "closed with N items" warning is expected
    try:
        for name, recorder in recorders.items():
            began = time.perf_counter()
            recorder.close()
            took = time.perf_counter() - began
            s = recorder.stats
            closing[name] = {
                "close_seconds": took,
                "queued": s.queued,
                "delivered": s.delivered,
                "abandoned": s.abandoned,
            }
        sink.release()  # let the sleeping workers finish their one item and exit
        for recorder in recorders.values():
            thread = getattr(recorder, "_thread", None)
            if thread is not None:
                thread.join(5)
        closing[DURABLE]["left_in_outbox"] = outbox.pending()
        outbox.close()
    finally:
        capture_log.setLevel(level)

    rows: list[dict[str, Any]] = []
    for name in names:
        row: dict[str, Any] = {"setup": name, "turns": cfg["rounds"] * cfg["turns_per_round"]}
        for q in ("p50", "p99"):
            row[f"{q}_us"] = statistics.median(st[name][q] for st in per_round) * 1e6
            row[f"{q}_added_us"] = (
                statistics.median(st[name][q] - st[BASELINE][q] for st in per_round) * 1e6
            )
        row["turns_over_1ms"] = sum(int(st[name]["over_1ms"]) for st in per_round)
        row.update(closing.get(name, {}))
        rows.append(row)
    inline_added = [t - b for t, b in inline_pairs]
    rows.append(
        {
            "setup": INLINE,
            "turns": len(inline_pairs),
            "p50_us": statistics.median(t for t, _ in inline_pairs) * 1e6,
            "p99_us": max(t for t, _ in inline_pairs) * 1e6,
            "p50_added_us": statistics.median(inline_added) * 1e6,
            "p99_added_us": max(inline_added) * 1e6,  # the max of a handful, not a p99
            "turns_over_1ms": sum(t > 0.001 for t, _ in inline_pairs),
        }
    )
    met = {
        name: next(r for r in rows if r["setup"] == name)["p99_added_us"] <= TARGET_P99_MS * 1000
        for name in (QUEUED, DURABLE)
    }
    within = {
        name: sum(st[name]["p99"] - st[BASELINE]["p99"] <= TARGET_P99_MS / 1000 for st in per_round)
        for name in (QUEUED, DURABLE)
    }
    return {
        "rows": rows,
        "rounds": per_round_us(per_round),
        "rounds_within_target": within,
        "target_p99_added_ms": TARGET_P99_MS,
        "target_met": met,
        "sink_calls": sink.calls,
    }


def per_round_us(per_round: list[dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    return [
        {
            name: {k: v if k == "over_1ms" else v * 1e6 for k, v in st.items()}
            for name, st in stats.items()
        }
        for stats in per_round
    ]


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
