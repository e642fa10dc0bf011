"""Section 7l: the recorded agent runs replayed through LlamaIndex's ``FunctionAgent``.

The same development set as section 7 (:mod:`bench.real_traces`), replayed call by call
through llama-index-core's own ``FunctionAgent`` workflow: one ``agent.run`` per recorded
invoke (earlier human messages of an invoke are put into the memory first), the model a
:class:`ReplayLLM` (a ``MockFunctionCallingLLM`` answering each call with the recorded
assistant message, tool calls and their ids included, and recording what it was sent),
the tools answering each call with its recorded result. Every memory setup runs its own
code on the agent's real requests. Setups, at each limit ``L``:

- ``demote``: ``DemotingMemory`` over ``Demoter(SlidingWindow.last_tokens(L),
  SQLiteArchive)``, the agent's LLM wrapped in ``DemotingLLM`` (the one-line drop-in);
- ``demote, memory only``: the same memory, the LLM not wrapped (the run's own steps are
  then sent in full: what the wrapper exists for);
- ``Memory``: LlamaIndex's ``Memory.from_defaults(token_limit=L)``
  (``chat_history_token_ratio=0.7``, ``token_flush_size=3000``, its defaults);
- ``ChatMemoryBuffer``: ``ChatMemoryBuffer.from_defaults(token_limit=L)``;
- ``no memory``: a ``ChatMemoryBuffer`` that never trims (the reference).

Each request is converted to LangChain messages (:func:`to_langchain`) and measured with
section 7's definitions (:mod:`bench.agent_metrics`: tokens per call with the tool schemas,
peak and p95, calls over the limit, invalid requests through the providers' converters,
billed in both price shapes relative to no memory, grounded), so the figures compare with
the LangChain path's: its ``demote`` row (``DemotingMiddleware``, same policy) is run beside
them. ``python -m bench.llamaindex_agents --limit 4000`` runs it.

Tool results by call: LlamaIndex hands a tool its arguments, not its call id, so each
tool answers with the recorded result of the oldest unanswered call of its name and
arguments (a run that repeats a call with the same arguments in one step may get the
siblings' results swapped; the ids stay right).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from bench import agent_metrics as metrics
from bench import agents_real
from bench.common import RESULTS, environment, progress, table, write_json
from bench.real_traces import RealTrace, held_out, load, sessions_dir, shown, traces_dir

SECTION = "llamaindex_agents"
LIMITS = (4_000, 8_000)
BASELINE = "no memory"
LANGCHAIN = "LangChain DemotingMiddleware"


class ScriptEnd(RuntimeError):
    """The agent called the model after its last recorded reply (the recording stops)."""


def to_llamaindex(message: AIMessage) -> Any:
    """A recorded assistant message as the LlamaIndex message a model would return."""
    from llama_index.core.base.llms.types import ChatMessage, TextBlock, ToolCallBlock

    blocks: list[Any] = []
    text = message.text if isinstance(message.content, list) else str(message.content)
    if text:
        blocks.append(TextBlock(text=text))
    blocks += [
        ToolCallBlock(tool_call_id=c["id"], tool_name=c["name"], tool_kwargs=dict(c["args"]))
        for c in message.tool_calls
    ]
    return ChatMessage(role="assistant", blocks=blocks or [TextBlock(text="")])


def to_langchain(message: Any) -> BaseMessage:
    """A LlamaIndex message as the LangChain message a provider converter reads."""
    from llamaindex_demote.messages import core_role, text_of, tool_calls

    role, text = core_role(message), text_of(message)
    if role == "system":
        return SystemMessage(text)
    if role == "user":
        return HumanMessage(text)
    if role == "tool":
        call = message.additional_kwargs.get("tool_call_id") or ""
        return ToolMessage(text, tool_call_id=str(call))
    calls = [
        {"name": c.get("name") or "", "args": dict(c.get("args") or {}), "id": c["id"]}
        for c in tool_calls(message)
        if c.get("id")
    ]
    return AIMessage(text, tool_calls=calls)


def _replay_llm(
    replies: Sequence[AIMessage], seen: list[list[Any]], pending: Any, before: Any
) -> Any:
    from llama_index.core.llms.mock import MockFunctionCallingLLM

    state = {"next": 0}

    def respond(messages: Sequence[Any], **kwargs: Any) -> Any:
        k = state["next"]
        if k >= len(replies):
            raise ScriptEnd(f"the recording has {len(replies)} replies; call {k + 1}")
        seen.append(list(messages))
        state["next"] = k + 1
        reply = replies[k]
        for c in reply.tool_calls:
            pending.setdefault(_key(c["name"], c["args"]), deque()).append(c["id"])
        if before is not None:
            before()
        return to_llamaindex(reply)

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def _key(name: str, args: Any) -> str:
    # Arguments given as None are dropped: a LlamaIndex tool is not passed them.
    given = {k: v for k, v in dict(args).items() if v is not None}
    return name + json.dumps(given, sort_keys=True, default=str)


def _tools(trace: RealTrace, pending: dict[str, deque[str]]) -> list[Any]:
    from llama_index.core.tools import FunctionTool
    from pydantic import create_model

    results = trace.results
    out = []
    for t in trace.tools:
        fn = t["function"]
        name = fn["name"]
        fields: dict[str, Any] = {k: (Any, None) for k in fn["parameters"]["properties"]}
        schema = create_model(f"Args_{len(out)}", **fields)

        def answer(_name: str = name, **kwargs: Any) -> str:
            queue = pending.get(_key(_name, kwargs))
            if not queue:
                return "(no recorded result)"
            return str(results[queue.popleft()].content)

        out.append(
            FunctionTool.from_defaults(
                fn=answer, name=name, description=fn["description"], fn_schema=schema
            )
        )
    return out


@dataclass
class Made:
    """One setup made for one run: the memory, whether the LLM is wrapped, its cleanup."""

    memory: Any
    wrap: bool = False
    before_reply: Callable[[], None] | None = None
    close: Callable[[], None] | None = None
    aclose: Callable[[], Awaitable[None]] | None = None  # awaited on the run's own loop


def _demote(wrap: bool) -> Callable[[int, Path], Made]:
    def make(limit: int, tmp: Path) -> Made:
        from demote import Demoter, SlidingWindow, SQLiteArchive
        from llamaindex_demote import DemotingMemory

        archive = SQLiteArchive(str(tmp / "archive.db"))
        demoter = Demoter(SlidingWindow.last_tokens(limit), archive)
        memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="run")

        def close() -> None:
            demoter.close()
            archive.close()

        # Every delivery is waited for before the model answers, so runs repeat exactly.
        return Made(memory, wrap, lambda: demoter.drain(30), close)

    return make


def _memory(limit: int, tmp: Path) -> Made:
    from llama_index.core.memory import Memory
    from sqlalchemy.ext.asyncio import create_async_engine

    # Memory's chat store is SQL: the engine is made here so the run can dispose of it.
    engine = create_async_engine("sqlite+aiosqlite:///:memory:")
    memory = Memory.from_defaults(session_id="run", token_limit=limit, async_engine=engine)
    return Made(memory, aclose=engine.dispose)


def _buffer(limit: int, tmp: Path) -> Made:
    from llama_index.core.memory import ChatMemoryBuffer

    return Made(ChatMemoryBuffer.from_defaults(token_limit=limit))


def _none(limit: int, tmp: Path) -> Made:
    from llama_index.core.memory import ChatMemoryBuffer

    return Made(ChatMemoryBuffer.from_defaults(token_limit=10**12))


#: The setups, in report order (the baseline is always run: billed is relative to it).
SETUPS: dict[str, Callable[[int, Path], Made]] = {
    "demote": _demote(True),
    "demote, memory only": _demote(False),
    "Memory": _memory,
    "ChatMemoryBuffer": _buffer,
    BASELINE: _none,
}


async def _replay(trace: RealTrace, made: Made) -> list[list[Any]]:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.base.llms.types import ChatMessage

    from llamaindex_demote import DemotingLLM

    seen: list[list[Any]] = []
    pending: dict[str, deque[str]] = {}
    llm = _replay_llm(trace.replies, seen, pending, made.before_reply)
    agent = FunctionAgent(
        tools=_tools(trace, pending),
        llm=DemotingLLM(llm) if made.wrap else llm,
        system_prompt=trace.system,
        streaming=False,
    )
    try:
        for segment in trace.segments:
            humans = [ChatMessage(role="user", content=str(h.content)) for h in segment.humans]
            if humans[:-1]:
                await made.memory.aput_messages(humans[:-1])
            try:
                await agent.run(humans[-1], memory=made.memory, max_iterations=100_000)
            except Exception as exc:  # the recording stopped after a step
                if (
                    isinstance(exc, ScriptEnd)
                    or "ScriptEnd" in repr(exc)
                    or "recording has" in str(exc)
                ):
                    break
                raise
    finally:
        if made.aclose is not None:
            await made.aclose()
    return seen


def run_one(trace: RealTrace, label: str, limit: int) -> tuple[list[list[BaseMessage]], float]:
    """Replay ``trace`` under one setup: its requests as LangChain messages, seconds."""
    with tempfile.TemporaryDirectory(prefix="demote-bench-li-") as tmp:
        made = SETUPS[label](limit, Path(tmp))
        began = time.perf_counter()
        try:
            seen = asyncio.run(_replay(trace, made))
        finally:
            if made.close is not None:
                made.close()
        seconds = time.perf_counter() - began
    return [[to_langchain(m) for m in request] for request in seen], seconds


def measure(
    trace: RealTrace, requests: list[list[BaseMessage]], limit: int, checker: metrics.Checker
) -> dict[str, Any]:
    """One replayed run's figures (section 7's definitions)."""
    tools = list(trace.tools)
    sizes = metrics.call_tokens(requests, tools, checker.count)
    ground = metrics.grounded(trace.messages, trace.replies, requests)
    return {
        **metrics.size_stats(sizes, limit),
        "sizes": sizes,
        "invalid": checker.invalid(requests),
        "billed": metrics.run_billed(requests, [], tools=tools, count=checker.count),
        "summary_calls": 0,
        "found": ground.found,
        "in_context": ground.in_context,
        "pieces": ground.pieces,
        "replayed": len(requests),
        "worst_over": max((s - limit for s in sizes if s > limit), default=0),
    }


def bench(
    traces: Sequence[RealTrace],
    limits: Sequence[int],
    setups: Sequence[str],
    *,
    quiet: bool = False,
    langchain: bool = True,
) -> list[dict[str, Any]]:
    """Every setup at every limit; one row per (limit, setup), LangChain's demote beside."""
    wanted = [s for s in SETUPS if s in setups or s == BASELINE]
    per: dict[tuple[int, str], list[dict[str, Any]]] = {}
    log = logging.getLogger("demote")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        for trace in progress(list(traces), "dev runs (LlamaIndex)", quiet):
            checker = metrics.Checker()
            base: dict[str, float] | None = None
            for label in sorted(wanted, key=lambda s: s != BASELINE):
                for limit in limits:
                    if label == BASELINE and base is not None:
                        row = dict(per[(limits[0], BASELINE)][-1])
                        row.update(metrics.size_stats(row["sizes"], limit), limit=limit)
                    else:
                        requests, seconds = run_one(trace, label, limit)
                        row = measure(trace, requests, limit, checker)
                        row.update(trace=trace.name, limit=limit, seconds=seconds)
                    if label == BASELINE:
                        base = row["billed"]
                    row["base_billed"] = base
                    per.setdefault((limit, label), []).append(row)
    finally:
        log.setLevel(level)
    rows = [
        agents_real.aggregate(label, limit, per[(limit, label)])
        for limit in limits
        for label in wanted
    ]
    if langchain:  # the LangChain path on the same runs, same policy
        for r in agents_real.bench(traces, limits, ["demote"], quiet=True):
            if r["setup"] == "demote":
                rows.append({**r, "setup": LANGCHAIN})
    return rows


def run(
    *,
    quick: bool = False,
    out: Path = RESULTS,
    quiet: bool = False,
    limits: Sequence[int] | None = None,
    setups: Sequence[str] | None = None,
    directory: Path | None = None,
) -> dict[str, Any]:
    """Run the section; returns (and writes) its results."""
    began = time.perf_counter()
    traces, skipped = load(directory, limit=2 if quick else None)
    limits = tuple(limits or ((4_000,) if quick else LIMITS))
    payload: dict[str, Any] = {
        "section": SECTION,
        "data": shown(directory or traces_dir()),
        "limits": list(limits),
        "quick": quick,
        "skipped": skipped,
        "traces": [t.summary() for t in traces],
        "rows": bench(traces, limits, list(setups or SETUPS), quiet=quiet),
    }
    if sessions_dir().is_dir():
        payload.update(long_sessions(sessions_dir(), quick=quick, quiet=quiet))
    payload["seconds"] = time.perf_counter() - began
    payload["environment"] = environment()
    write_json(SECTION, payload, out)
    return payload


def long_sessions(folder: Path, *, quick: bool = False, quiet: bool = False) -> dict[str, Any]:
    """The long sessions (issue 36) through ``DemotingLLM``: the default and no memory.

    At section 7's session limits, reported for the sessions tuned on and those held out
    apart (the LangChain path's figures are section 7's). Quick: one session at 4,000.
    """
    began = time.perf_counter()
    traces, _ = load(folder, limit=1 if quick else None)
    limits = (4_000,) if quick else agents_real.SESSION_LIMITS
    out: dict[str, Any] = {"session_limits": list(limits)}
    for key, held in (("session_rows_tuned", False), ("session_rows_held_out", True)):
        part = [t for t in traces if held_out(t) is held]
        out[key] = bench(part, limits, ["demote"], quiet=quiet, langchain=False) if part else []
        out[key.replace("rows", "runs")] = len(part)
    out["sessions_seconds"] = time.perf_counter() - began
    return out


COLUMNS = [c for c in agents_real.COLUMNS if c[0] != "grounded_run_pct"]


def _tables(rows: Sequence[dict[str, Any]], limits: Sequence[int]) -> list[str]:
    lines: list[str] = []
    for limit in limits:
        shown = [
            {
                **r,
                "grounded_pct": None if r["grounded"] is None else 100 * r["grounded"],
                "over_pct": 100 * r["over_share"],
                "context_pct": (
                    None if r.get("grounded_context") is None else 100 * r["grounded_context"]
                ),
            }
            for r in rows
            if r["limit"] == limit
        ]
        lines += ["", f"limit {limit:,} tokens", "", table(shown, COLUMNS)]
    return lines


def report(payload: dict[str, Any]) -> str:
    """The section's tables as Markdown."""
    n = len(payload["traces"])
    lines = [f"## 7l. LlamaIndex FunctionAgent on the recorded runs ({n} runs replayed)"]
    lines += _tables(payload["rows"], payload["limits"])
    for key, title in (("session_rows_tuned", "tuned on"), ("session_rows_held_out", "held out")):
        if payload.get(key):
            n = payload[key.replace("rows", "runs")]
            lines += ["", f"### Long sessions through DemotingLLM ({n} {title})"]
            lines += _tables(payload[key], payload["session_limits"])
    lines.append(f"({payload['seconds']:.0f} s)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.llamaindex_agents [--limit L ...] [--setup NAME ...] [--runs N]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.llamaindex_agents")
    parser.add_argument("--limit", type=int, nargs="+", default=list(LIMITS))
    parser.add_argument("--setup", nargs="+", default=None, help=f"default all: {list(SETUPS)}")
    parser.add_argument("--runs", type=int, default=None, help="only the first N runs")
    parser.add_argument("--no-langchain", action="store_true", help="skip the LangChain row")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    unknown = set(args.setup or ()) - set(SETUPS)
    if unknown:
        parser.error(f"unknown setups {sorted(unknown)}; choose from {list(SETUPS)}")
    began = time.perf_counter()
    traces, skipped = load(None, limit=args.runs)
    payload: dict[str, Any] = {
        "limits": args.limit,
        "skipped": skipped,
        "traces": [t.summary() for t in traces],
        "rows": bench(
            traces,
            args.limit,
            args.setup or list(SETUPS),
            quiet=args.quiet,
            langchain=not args.no_langchain,
        ),
    }
    payload["seconds"] = time.perf_counter() - began
    if args.out is not None:
        write_json(SECTION, payload, args.out)
    print(report(payload))


if __name__ == "__main__":
    main()
