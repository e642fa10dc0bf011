"""Section 4, part 1: the latency capture adds to a LangChain turn, and what a close leaves.

The setups (no capture, a :class:`~demote.capture.Recorder` with and without an outbox,
the sink called inline) and how they are timed are described in :mod:`bench.capture_scale`,
the section that runs :func:`capture_latency` and reports it.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import synthetic_chat

BUDGET = 4000
PREFILL = 200
FLUSH_TIMEOUT = 0.05
TARGET_P99_MS = 1.0

BASELINE = "no capture"
QUEUED = "Recorder(sink)"
DURABLE = "Recorder(sink, outbox=SQLiteOutbox)"
INLINE = "inline (sink called in the turn)"


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
