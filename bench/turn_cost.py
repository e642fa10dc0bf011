"""Section 1: per-turn overhead versus history length.

A *turn* is what a memory does on the hot path of one user message: store the new message
and produce the messages for the prompt. Each setup is prepared with a history of ``n``
messages (alternating user/assistant, about 50 words each, a 4,000-token budget), then
``repeats`` turns are timed one by one; the table shows the median, and its ratio to the
*floor* timed beside it (in the same process, its rounds alternating with the setup's):
a plain Python list plus token counts cached per message
(append, then walk back from the end until the budget is spent). A fast setup (the floor,
demote's) is timed in five rounds of 31 turns after 20 untimed ones, and the best round's
median is its figure (a round a garbage collection or another process interrupted says
little about the setup); a slow one, in one round. Each setup runs in a fresh
interpreter per size; a fast one in three, and the fastest is its figure (one process of
a setup can be a third slower than the next throughout, a matter of where its objects
landed, not of its code).

Setups (:mod:`bench.turn_setups`):

- ``floor``: the list above, the least any windowed memory must do.
- ``InMemoryChatMessageHistory``: LangChain's bare history (no window at all).
- ``trim_messages``: that history plus ``trim_messages(strategy="last",
  token_counter=count_tokens_approximately, max_tokens=4000)`` at every turn.
- ``LlamaIndex Memory``: ``Memory.from_defaults(token_limit=4000)`` (no memory blocks;
  ``put`` then ``get``). Its older messages are prepared as already archived, the state a
  long chat reaches.
- ``LlamaIndex ChatMemoryBuffer``: ``put`` then ``get``; only below 1,000 messages (it
  re-reads the whole history at every turn and does not finish in the budget above that).
- ``demote core``: :meth:`demote.Demoter.load` over a list of records, each message
  described once.
- ``DemotingChatMessageHistory`` / ``DemotingMemory``: the adapters, over LangChain's
  in-memory history and LlamaIndex's ``SimpleChatStore``; included when importable, with
  the default token window (``LowWater``: it cuts back to about half the limit when it
  is full, so most turns only grow it).
- ``..., sliding``: the same with ``eviction=PerItem()``, the window that moves at every
  turn once full (as message and turn windows do by default): each turn commits the new
  window start and makes a ``demoted`` event; no observer, callback handler or
  instrumentation handler listens, so the events cost their making and one check for a
  listener.
- ``..., sliding + observer``: the same with a Demoter observer that counts events.

Run alone with ``python -m bench.turn_cost``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    agg_backend,
    environment,
    median_seconds,
    synthetic_chat,
    write_json,
)
from bench.turn_setups import BUDGET, FLOOR, SETUPS, floor

SECTION = "turn_cost"
SIZES = (100, 1_000, 10_000, 100_000)
QUICK_SIZES = (50, 200)
ROUNDS = 5  # rounds of 31 turns for the fast setups (the floor included): the best median


def repeats_for(n: int, quick: bool) -> int:
    if quick:
        return 3
    return 15 if n <= 10_000 else 7


def measure(name: str, n: int, *, quick: bool = False) -> tuple[float, float]:
    """Seconds per turn of setup ``name`` over a history of ``n`` messages, and the floor's.

    A fast setup's rounds alternate with rounds of the floor in the same process, so
    the ratio compares turns timed side by side (a shared machine's slow spells hit
    both); the floor's figure is its best round there.

    Raises what the setup raises (``ImportError``: a package it needs is missing).
    """
    prepare, _ = SETUPS[name]
    history = synthetic_chat(n)
    gc.collect()
    beside = floor(list(history)) if name != FLOOR else None
    turn = prepare(history)
    try:
        turn(0)  # warm-up, not timed (a first turn may describe what it did not see yet)
        t0 = time.perf_counter()
        turn(1)  # how long a turn takes: a fast setup gets more of them
        start, timed, rounds = 2, repeats_for(n, quick), 1
        if not quick and time.perf_counter() - t0 < 0.005:
            # Fast setups: let caches settle (the first turns after loading a long history
            # re-describe it), then time the same number of turns at every size, in ROUNDS
            # rounds: the best round's median (a round that a collection or another
            # process interrupted is not the setup's cost).
            for i in range(2, 21):
                turn(i)
            start, timed, rounds = 21, 31, ROUNDS
        own, base = [], []
        for k in range(rounds):
            own.append(median_seconds(turn, timed, start=start + k * timed))
            if beside is not None:
                base.append(median_seconds(beside, timed, start=start + k * timed))
        if beside is None:
            return min(own), min(own)
        if rounds == 1:  # a slow setup: the floor as it runs alone
            base = [min(median_seconds(beside, 31, start=100 * k) for k in range(ROUNDS))]
        return min(own), min(base)
    finally:
        getattr(turn, "close", lambda: None)()


def _isolated(name: str, n: int) -> tuple[float, float]:
    """:func:`measure` in a fresh interpreter (``python -m bench.turn_cost --measure``)."""
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "bench.turn_cost", "--measure", name, "--n", str(n)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    if "seconds" in answer:
        return float(answer["seconds"]), float(answer["floor"])
    if "missing" in answer:
        raise ImportError(answer["missing"])
    raise RuntimeError(
        answer.get("error") or done.stderr.strip()[-300:] or f"exit {done.returncode}"
    )


def run(
    *,
    quick: bool = False,
    sizes: Sequence[int] | None = None,
    out: Path = RESULTS,
    quiet: bool = False,
    isolate: bool | None = None,
) -> dict[str, Any]:
    """Run the section; returns (and writes) its results.

    ``isolate`` (the default but for ``quick``): each setup at each size is measured in
    a process of its own (:func:`measure`), so no setup runs in a heap that another one
    grew and fragmented (at 100,000 messages that alone made demote's turns a third
    slower than alone), as a memory does in an application.
    """
    if isolate is None:
        isolate = not quick
    began = time.perf_counter()
    sizes = tuple(sizes or (QUICK_SIZES if quick else SIZES))
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    medians: dict[str, dict[int, float]] = {}
    floors: dict[str, dict[int, float]] = {}  # the floor timed beside each setup
    for n in sizes:
        for name, (_, largest) in SETUPS.items():
            if largest is not None and n > largest:
                note = f"{name}: skipped at >= {largest + 1:,} messages (does not finish in time)"
                if note not in notes:
                    notes.append(note)
                continue
            try:
                if isolate:
                    seconds, beside = _isolated(name, n)
                    if seconds < 0.001:  # a fast setup: the best of three processes
                        seconds, beside = min(
                            [(seconds, beside), *(_isolated(name, n) for _ in "ab")]
                        )
                else:
                    seconds, beside = measure(name, n, quick=quick)
            except ImportError as exc:
                note = f"{name}: skipped ({exc})"
                if note not in notes:
                    notes.append(note)
                continue
            except Exception as exc:  # one broken setup must not sink the section
                notes.append(
                    f"{name}: failed at {n:,} messages ({type(exc).__name__}: {exc})"[:300]
                )
                continue
            medians.setdefault(name, {})[n] = seconds
            floors.setdefault(name, {})[n] = beside
            if not quiet:
                print(f"  {name:<42} n={n:>7,}  {seconds * 1e6:>10.1f} us", flush=True)
    for name, by_n in medians.items():
        row: dict[str, Any] = {"setup": name}
        for n, seconds in by_n.items():
            base = floors[name][n]
            row[f"us_{n}"] = seconds * 1e6
            row[f"x_{n}"] = seconds / base if base else None
            row[f"floor_us_{n}"] = base * 1e6  # the floor as timed beside this setup
        rows.append(row)
    payload = {
        "section": SECTION,
        "budget_tokens": BUDGET,
        "sizes": list(sizes),
        "words_per_message": 50,
        "quick": quick,
        "rows": rows,
        "notes": notes,
        "seconds": time.perf_counter() - began,
        "environment": environment(),
    }
    payload["plot"] = _plot(medians, sizes, out)
    write_json(SECTION, payload, out)
    return payload


def _plot(medians: dict[str, dict[int, float]], sizes: Sequence[int], out: Path) -> str | None:
    agg_backend()
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax: Any = fig.add_subplot()
    for name, by_n in medians.items():
        xs = [n for n in sizes if n in by_n]
        ax.plot(xs, [by_n[n] * 1e6 for n in xs], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages in the history")
    ax.set_ylabel("median time per turn (us)")
    ax.set_title(f"Per-turn overhead, {BUDGET:,}-token window")
    ax.legend(fontsize="small")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{SECTION}.png"
    fig.savefig(path, dpi=110)
    return path.name


def report(payload: dict[str, Any]) -> str:
    sizes = payload["sizes"]
    head = "| setup | " + " | ".join(f"{n:,} msgs" for n in sizes) + " |"
    rule = "|---|" + "---:|" * len(sizes)
    lines = [
        f"## 1. Per-turn overhead vs history length ({payload['budget_tokens']:,}-token window, "
        "~50-word messages; median time per turn, and its ratio to the floor)",
        "",
        head,
        rule,
    ]
    for row in payload["rows"]:
        cells = []
        for n in sizes:
            us, x = row.get(f"us_{n}"), row.get(f"x_{n}")
            cells.append("n/a" if us is None else f"{_us(us)} ({x:,.1f}x)" if x else _us(us))
        lines.append(f"| {row['setup']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.extend(payload["notes"])
    lines.append(f"({payload['seconds']:.1f} s)")
    return "\n".join(lines)


def _us(us: float) -> str:
    if us >= 10_000:
        return f"{us / 1000:,.0f} ms"
    if us >= 1000:
        return f"{us / 1000:.1f} ms"
    return f"{us:.0f} us" if us >= 10 else f"{us:.1f} us"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_cost")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", type=int, nargs="+")
    parser.add_argument("--measure", metavar="SETUP", help="one setup, printed as JSON")
    parser.add_argument("--n", type=int, default=1000, help="its history length")
    args = parser.parse_args(argv)
    if args.measure is not None:  # what run() asks each fresh interpreter
        try:
            seconds, beside = measure(args.measure, args.n)
            answer: dict[str, Any] = {"seconds": seconds, "floor": beside}
        except ImportError as exc:
            answer = {"missing": str(exc)}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer))
        return
    print(report(run(quick=args.quick, sizes=args.sizes)))


if __name__ == "__main__":
    main()
