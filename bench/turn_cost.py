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

Setups:

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
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    agg_backend,
    approx_tokens,
    close_llama_memory,
    environment,
    median_seconds,
    synthetic_chat,
    write_json,
)

SECTION = "turn_cost"
BUDGET = 4000
SIZES = (100, 1_000, 10_000, 100_000)
QUICK_SIZES = (50, 200)

Pairs = list[tuple[str, str]]
# prepare(history) -> turn(i): one timed turn that stores message i and reads the window.
Prepare = Callable[[Pairs], Callable[[int], object]]


def floor(history: Pairs) -> Callable[[int], object]:
    texts = [t for _, t in history]
    counts = [approx_tokens(t) + 3 for t in texts]

    def turn(i: int) -> object:
        text = f"new message {i} " + texts[i % len(texts)]
        texts.append(text)
        counts.append(approx_tokens(text) + 3)
        used, start = 0, len(texts)
        while start > 0 and used + counts[start - 1] <= BUDGET:
            start -= 1
            used += counts[start]
        return texts[start:]

    return turn


def _lc(history: Pairs) -> Any:
    from langchain_core.chat_history import InMemoryChatMessageHistory
    from langchain_core.messages import AIMessage, HumanMessage

    kinds = {"user": HumanMessage, "assistant": AIMessage}
    return InMemoryChatMessageHistory(messages=[kinds[r](t) for r, t in history]), HumanMessage


def bare_history(history: Pairs) -> Callable[[int], object]:
    store, human = _lc(history)

    def turn(i: int) -> object:
        store.add_message(human(f"new message {i} " + history[i % len(history)][1]))
        return store.messages

    return turn


def trim(history: Pairs) -> Callable[[int], object]:
    from langchain_core.messages.utils import count_tokens_approximately, trim_messages

    store, human = _lc(history)

    def turn(i: int) -> object:
        store.add_message(human(f"new message {i} " + history[i % len(history)][1]))
        return trim_messages(
            store.messages,
            strategy="last",
            token_counter=count_tokens_approximately,
            max_tokens=BUDGET,
        )

    return turn


def _chat_messages(history: Pairs) -> list[Any]:
    from llama_index.core.llms import ChatMessage

    return [ChatMessage(role=r, content=t) for r, t in history]


def llama_memory(history: Pairs) -> Callable[[int], object]:
    from llama_index.core.async_utils import asyncio_run
    from llama_index.core.llms import ChatMessage
    from llama_index.core.memory import Memory
    from llama_index.core.storage.chat_store.base_db import MessageStatus

    memory = Memory.from_defaults(
        token_limit=BUDGET, tokenizer_fn=lambda text: [0] * approx_tokens(text)
    )
    messages = _chat_messages(history)
    # The steady state of a long chat: all but the newest ~budget already archived.
    keep, used = len(messages), 0
    while keep > 0 and used + approx_tokens(history[keep - 1][1]) <= BUDGET * 0.7:
        keep -= 1
        used += approx_tokens(history[keep][1])
    for lo in range(0, keep, 2000):  # SQLite caps the variables of one statement
        asyncio_run(
            memory.sql_store.add_messages(
                memory.session_id,
                messages[lo : min(keep, lo + 2000)],
                status=MessageStatus.ARCHIVED,
            )
        )
    memory.put_messages(messages[keep:])

    def turn(i: int) -> object:
        memory.put(
            ChatMessage(role="user", content=f"new message {i} " + history[i % len(history)][1])
        )
        return memory.get()

    turn.close = lambda: close_llama_memory(memory)  # type: ignore[attr-defined]
    return turn


def llama_buffer(history: Pairs) -> Callable[[int], object]:
    from llama_index.core.llms import ChatMessage
    from llama_index.core.memory import ChatMemoryBuffer

    memory = ChatMemoryBuffer.from_defaults(
        token_limit=BUDGET,
        chat_history=_chat_messages(history),
        tokenizer_fn=lambda text: [0] * approx_tokens(text),
    )

    def turn(i: int) -> object:
        memory.put(
            ChatMessage(role="user", content=f"new message {i} " + history[i % len(history)][1])
        )
        return memory.get()

    return turn


def demote_core(history: Pairs) -> Callable[[int], object]:
    from demote import Demoter, SlidingWindow
    from demote.records import MessageRecord

    demoter = Demoter(SlidingWindow.last_tokens(BUDGET))
    records = [demoter.describe(r, t) for r, t in history]

    def same(record: MessageRecord) -> MessageRecord:
        return record

    demoter.load("bench", records, same)  # the history so far is already planned

    def turn(i: int) -> object:
        records.append(demoter.describe("user", f"new message {i} " + history[i % len(history)][1]))
        return demoter.load("bench", records, same)

    return turn


# -- adapter slots -------------------------------------------------------------------------
# DemotingChatMessageHistory (langchain_demote) and DemotingMemory (llamaindex_demote) are
# written by another helper; these two setups run when their packages import, and are
# reported as skipped (with the reason) otherwise.


def _observed(demoter: Any) -> None:
    """Attach an observer that only counts (the events' cost once someone listens)."""
    seen = [0]

    def count(event: object) -> None:
        seen[0] += 1

    demoter.observe(count)


def _policy(sliding: bool) -> Any:
    from demote import PerItem, SlidingWindow

    if sliding:
        return SlidingWindow.last_tokens(BUDGET, eviction=PerItem())
    return SlidingWindow.last_tokens(BUDGET)


def demoting_history(
    history: Pairs, observed: bool = False, sliding: bool = False
) -> Callable[[int], object]:
    from demote import Demoter
    from langchain_demote import DemotingChatMessageHistory

    inner, human = _lc(history)
    demoter = Demoter(_policy(sliding))
    if observed:
        _observed(demoter)
    memory = DemotingChatMessageHistory(inner=inner, demoter=demoter, conversation_id="bench")
    _ = memory.messages  # the history so far is already planned

    def turn(i: int) -> object:
        memory.add_message(human(f"new message {i} " + history[i % len(history)][1]))
        return memory.messages

    turn.close = demoter.close  # type: ignore[attr-defined]
    return turn


def demoting_memory(
    history: Pairs, observed: bool = False, sliding: bool = False
) -> Callable[[int], object]:
    from llama_index.core.llms import ChatMessage

    from demote import NoopHook
    from llamaindex_demote import DemotingMemory

    memory = DemotingMemory.from_defaults(
        chat_history=_chat_messages(history),
        policy=_policy(sliding),
        hook=NoopHook(),  # the engine alone
        chat_store_key="bench",
    )
    if observed:
        _observed(memory.demoter)
    memory.get()

    def turn(i: int) -> object:
        memory.put(
            ChatMessage(role="user", content=f"new message {i} " + history[i % len(history)][1])
        )
        return memory.get()

    turn.close = memory.demoter.close  # type: ignore[attr-defined]
    return turn


# Setup name -> (prepare, largest history it is run at, or None for all).
SETUPS: dict[str, tuple[Prepare, int | None]] = {
    "floor (list + cached counts)": (floor, None),
    "InMemoryChatMessageHistory (no window)": (bare_history, None),
    "trim_messages": (trim, None),
    "LlamaIndex Memory": (llama_memory, None),
    "LlamaIndex ChatMemoryBuffer": (llama_buffer, 999),
    "demote core (Demoter.load)": (demote_core, None),
    "DemotingChatMessageHistory": (demoting_history, None),
    "DemotingMemory": (demoting_memory, None),
    # The window that moves every turn (a commit and an event each), then the same with an
    # observer attached (events are made either way; this is their hand-off to the
    # observer thread, which then competes for the GIL).
    "DemotingChatMessageHistory, sliding": (partial(demoting_history, sliding=True), None),
    "DemotingMemory, sliding": (partial(demoting_memory, sliding=True), None),
    "DemotingChatMessageHistory, sliding + observer": (
        partial(demoting_history, observed=True, sliding=True),
        None,
    ),
    "DemotingMemory, sliding + observer": (
        partial(demoting_memory, observed=True, sliding=True),
        None,
    ),
}
FLOOR = "floor (list + cached counts)"
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
