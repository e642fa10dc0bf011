"""The two halves of ``demote demo`` (LangChain, LlamaIndex) and its closing table.

Split from :mod:`demote.demo` so that the options, script and bookkeeping there stay
framework-free; the frameworks are imported only when a half is played.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from demote.engine import Demoter
from demote.errors import ConfigError
from demote.offline import OfflineResponder
from demote.policy import SlidingWindow

if TYPE_CHECKING:
    from demote.demo import CountingHook, DemoOptions, PartResult, Probe, Script

__all__ = ["play_langchain", "play_llamaindex", "print_table"]

LANGCHAIN_ID = "demo-langchain"
LLAMAINDEX_ID = "demo-llamaindex"


def _chat_model(options: DemoOptions, responder: OfflineResponder) -> Any:
    from demote.demo_langchain import OfflineChatModel

    if options.model is None:
        return OfflineChatModel(responder=responder)
    try:
        from langchain.chat_models import init_chat_model
    except ImportError as exc:
        raise ConfigError(
            "--model needs the 'langchain' package: pip install 'demote[agents]'"
        ) from exc
    try:
        return init_chat_model(options.model)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"--model {options.model!r}: {exc}") from exc


def _finish(part: PartResult, hook: CountingHook, cid: str, started: float) -> PartResult:
    part.demoted = hook.delivered.get(cid, 0)
    part.redelivered = hook.redelivered.get(cid, 0)
    part.archived = hook.archive.count(cid)
    part.seconds = time.perf_counter() - started
    return part


def play_langchain(
    demoter: Demoter,
    hook: CountingHook,
    turns: Sequence[tuple[str, str]],
    probe: Probe,
    options: DemoOptions,
    err: IO[str],
) -> PartResult:
    """Play ``turns`` and the probe through a ``RunnableWithMessageHistory`` chain."""
    from langchain_core.messages import BaseMessage

    from demote.demo import CallLog, PartResult, _progress
    from demote.demo_langchain import JSONLChatMessageHistory, build_chain
    from langchain_demote.history import with_demotion

    started = time.perf_counter()
    responder = OfflineResponder(turns)
    log = CallLog(demoter.tokens)
    histories: dict[str, JSONLChatMessageHistory] = {}

    def get_session_history(session_id: str) -> JSONLChatMessageHistory:
        # The inner store of an existing app: one JSONL file per session.
        if session_id not in histories:
            path = options.directory / "langchain-history.jsonl"
            histories[session_id] = JSONLChatMessageHistory(path)
        return histories[session_id]

    chain = build_chain(
        _chat_model(options, responder),
        with_demotion(get_session_history, demoter),
        recall=hook.archive,
        observe=log,
    )
    config: Any = {"configurable": {"session_id": LANGCHAIN_ID}}
    with _progress(options, err, len(turns), "LangChain ") as bar:
        for user, _ in turns:
            if demoter.state_of(LANGCHAIN_ID).window_start > 0:
                log.mark_full()
            chain.invoke({"question": user}, config=config)
            bar.update()
    answer: BaseMessage = chain.invoke({"question": probe.question}, config=config)
    demoter.drain(timeout=30)
    part = PartResult("LangChain", turns=len(turns), log=log, answer=str(answer.content))
    part.history = len(get_session_history(LANGCHAIN_ID).messages)
    part.recalled = log.recalled()
    return _finish(part, hook, LANGCHAIN_ID, started)


def play_llamaindex(
    demoter: Demoter,
    hook: CountingHook,
    turns: Sequence[tuple[str, str]],
    probe: Probe,
    options: DemoOptions,
    err: IO[str],
) -> PartResult:
    """Play ``turns`` and the probe through a ``SimpleChatEngine`` with DemotingMemory."""
    from llama_index.core.chat_engine import SimpleChatEngine

    from demote.demo import CallLog, PartResult, _progress
    from demote.demo_langchain import SYSTEM_PROMPT
    from demote.demo_llamaindex import JSONLChatStore, OfflineLLM
    from llamaindex_demote.memory import DemotingMemory

    started = time.perf_counter()
    log = CallLog(demoter.tokens)
    llm = OfflineLLM(OfflineResponder(turns), observe=log)
    store = JSONLChatStore(options.directory / "llamaindex-chats.jsonl")
    memory = DemotingMemory.from_defaults(
        demoter=demoter,
        chat_store=store,
        chat_store_key=LLAMAINDEX_ID,
        recall=hook.archive,
        recall_k=3,
    )
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=SYSTEM_PROMPT)
    with _progress(options, err, len(turns), "LlamaIndex") as bar:
        for user, _ in turns:
            if demoter.state_of(LLAMAINDEX_ID).window_start > 0:
                log.mark_full()
            engine.chat(user)
            bar.update()
    answer = engine.chat(probe.question)
    demoter.drain(timeout=30)
    part = PartResult("LlamaIndex", turns=len(turns), log=log, answer=str(answer))
    part.history = len(store.get_messages(LLAMAINDEX_ID))
    part.recalled = log.recalled()
    return _finish(part, hook, LLAMAINDEX_ID, started)


def _range(values: Sequence[int]) -> str:
    return f"{min(values):,}-{max(values):,}" if values else "-"


def _steady(part: PartResult, unit: str) -> list[int]:
    if part.log is None:
        return []
    log = part.log
    return log.steady(log.window_messages if unit == "messages" else log.window_tokens)


def _cost(part: PartResult) -> str:
    if part.log is None:
        return "-"
    costs = {c.pricing: c.relative_cost for c in part.log.meter.results()}
    return ", ".join(f"{name} {1 - cost:.0%}" for name, cost in costs.items())


def _shorten(text: str, width: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_table(
    out: IO[str],
    *,
    script: Script,
    run: int,
    policy: SlidingWindow,
    label: str,
    options: DemoOptions,
    probe: Probe,
    parts: Sequence[PartResult],
    seconds: float,
) -> None:
    """Print what the run did: one column per framework, then the probe, then totals."""
    model = options.model or "offline stand-in (answers only from its prompt)"
    w = [28, *([32] * len(parts))]
    lines = [
        f"demote demo, run {run}: {script.name}, {len(script.turns)} turns in the script",
        f"policy:   {label}   {policy.to_json()}",
        f"stores:   {options.directory}/ (state.db, archive.db, langchain-history.jsonl,"
        " llamaindex-chats.jsonl)",
        f"model:    {model}",
        "",
    ]

    def row(name: str, values: Sequence[str]) -> None:
        cells = [name.ljust(w[0])] + [v.ljust(w[i + 1]) for i, v in enumerate(values)]
        lines.append("".join(cells).rstrip())

    row("", [p.name for p in parts])
    row("turns this run", [f"{p.turns} + 1 question" for p in parts])
    row("messages in history", [f"{p.history:,}" for p in parts])
    row("window size (messages)", [_range(_steady(p, "messages")) for p in parts])
    row("window size (tokens)", [_range(_steady(p, "tokens")) for p in parts])
    row("messages demoted", [f"{p.demoted:,}" for p in parts])
    row("archive size", [f"{p.archived:,}" for p in parts])
    row("re-delivered", [f"{p.redelivered:,}" for p in parts])
    row("prompt-cache saving (est.)", [_cost(p) for p in parts])
    row("time", [f"{p.seconds:.1f} s" for p in parts])
    lines += ["", f"early fact, asked late: {probe.question!r} (answer: {probe.answer})"]
    for p in parts:
        hit = next((r for r in p.recalled if probe.answer.lower() in r.lower()), None)
        shown = hit or (p.recalled[0] if p.recalled else "(nothing recalled)")
        found = "yes" if probe.answer.lower() in p.answer.lower() else "no"
        lines.append(f"  {p.name:<11} recalled: {_shorten(shown)}")
        lines.append(f"  {'':<11} answer:   {_shorten(p.answer)}   [answer found: {found}]")
    total = sum(p.redelivered for p in parts)
    lines += [
        "",
        f"re-delivered: {total}",
        f"done in {seconds:.1f} s. Run again: the next run continues this conversation from "
        f"the stores in {options.directory}/.",
    ]
    out.write("\n".join(lines) + "\n")
