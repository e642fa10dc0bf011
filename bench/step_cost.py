"""Section 7b: what one load costs as a single agent turn grows to 1,000 steps.

An agent calls the memory before every model call. Inside one request that runs hundreds
of tool calls, the running turn is the whole request, so a planner that re-read the turn
on every call would cost more with every step. This section measures it: one conversation,
one user request, then ``steps`` steps (an assistant message opening one tool call with
arguments, and its ~300-token result), loaded through a ``Demoter`` under
``SlidingWindow.last_tokens(1500)`` after every step, as the middleware does before every
model call. The window is full from the fifth step on, so every measured load cuts the
window and hands what left it to the hook: the same work at every length. Two hooks: the
``NoopHook`` (the engine alone: describing the new step, planning, committing to an
in-memory state store) and a real ``SQLiteArchive`` (each load also writes the two
messages that left the window, and commits).

For each length the row gives the median and 95th percentile of the loads made at the last
``tail`` steps up to it (so the cost *at* 10, 100 and 1,000 steps, not an average over the
run), and the ratio to the 10-step median. The goal (agents issue): at most 1.5x from 10
to 1,000 steps.

``python -m bench.step_cost [--quick]`` prints the table and writes
``bench/results/step_cost.json``; ``python -m bench --sections 7b`` runs it as a section.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS, environment, section_main, table, write_json
from demote import Demoter, NoopHook, SlidingWindow, SQLiteArchive
from demote.records import MessageRecord

LENGTHS = (10, 100, 1000)
QUICK_LENGTHS = (10, 40)
LIMIT = 1500
TAIL = 5  # loads measured at each length: the last TAIL steps up to it


def _step(n: int) -> list[tuple[str, dict[str, Any]]]:
    call = {"id": f"call-{n}", "name": "search", "args": {"query": f"step {n} lookup"}}
    result = f"result {n}: " + " ".join(f"row{n}-{i} value {i * 7}" for i in range(75))
    return [
        ("assistant", {"text": f"looking up step {n}", "opens": (call["id"],), "calls": [call]}),
        ("tool", {"text": result, "answers": call["id"], "tool": "search"}),
    ]


def _describer(d: Demoter) -> Any:
    def describe(m: tuple[str, dict[str, Any]]) -> MessageRecord:
        role, fields = m
        return d.describe(role, **fields)

    return describe


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _measure(hook: Any, lengths: Sequence[int], quiet: bool) -> dict[str, Any]:
    demoter = Demoter(SlidingWindow.last_tokens(LIMIT), hook)
    describe = _describer(demoter)
    history: list[tuple[str, dict[str, Any]]] = [("user", {"text": "run the whole job"})]
    timings: dict[int, list[float]] = {n: [] for n in lengths}
    peak = first_cut = 0
    for step in range(1, max(lengths) + 1):
        history += _step(step)
        t0 = time.perf_counter()
        window = demoter.load("agent", history, describe)
        took = time.perf_counter() - t0
        if window.start > 0 and not first_cut:
            first_cut = step
        peak = max(peak, sum(describe(m).tokens for m in window.messages))
        for n in lengths:
            if n - TAIL < step <= n:
                timings[n].append(took)
        if not quiet and step % 250 == 0:
            print(f"  step_cost: {step} steps", flush=True)
    demoter.close()
    base = statistics.median(timings[lengths[0]])
    rows = [
        {
            "steps": n,
            "messages": 1 + 2 * n,
            "p50_us": statistics.median(timings[n]) * 1e6,
            "p95_us": _pct(timings[n], 0.95) * 1e6,
            "x_first": statistics.median(timings[n]) / base,
        }
        for n in lengths
    ]
    return {"rows": rows, "peak_window_tokens": peak, "first_cut_step": first_cut}


def run(*, quick: bool = False, out: Path = RESULTS, quiet: bool = False) -> dict[str, Any]:
    """Measure one load at each turn length, for each hook; write ``step_cost.json``."""
    lengths = QUICK_LENGTHS if quick else LENGTHS
    began = time.perf_counter()
    setups: dict[str, Any] = {"engine (NoopHook)": _measure(NoopHook(), lengths, quiet)}
    with tempfile.TemporaryDirectory() as tmp:
        archive = SQLiteArchive(Path(tmp) / "archive.db")
        measured = _measure(archive, lengths, quiet)
        measured["archived"] = archive.count("agent")
        archive.close()
    setups["SQLiteArchive hook"] = measured
    payload = {
        "section": "step_cost",
        "limit": LIMIT,
        "tail": TAIL,
        "quick": quick,
        "setups": setups,
        "seconds": time.perf_counter() - began,
        "environment": environment(),
    }
    write_json("step_cost", payload, out)
    return payload


def report(payload: dict[str, Any]) -> str:
    """The section's table."""
    head = (
        f"## 7b. Agents: one load inside one growing turn (last_tokens({payload['limit']}), "
        f"median of the last {payload['tail']} loads at each length)"
    )
    rows = [
        {"setup": name, **row} for name, setup in payload["setups"].items() for row in setup["rows"]
    ]
    body = table(
        rows,
        [
            ("setup", "hook", ""),
            ("steps", "steps in the turn", ",d"),
            ("messages", "messages", ",d"),
            ("p50_us", "p50 µs", ",.0f"),
            ("p95_us", "p95 µs", ",.0f"),
            ("x_first", "vs 10 steps", ".2f"),
        ],
    )
    notes = "; ".join(
        f"{name}: window cut from step {v['first_cut_step']}, "
        f"peak {v['peak_window_tokens']:,} tokens"
        for name, v in payload["setups"].items()
    )
    return f"{head}\n{body}\n{notes}"


def main(argv: Sequence[str] | None = None) -> None:
    section_main("python -m bench.step_cost", run, report, argv)


if __name__ == "__main__":
    main()
