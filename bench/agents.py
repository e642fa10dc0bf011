"""Section 7s: agents on generated stress traces. What each setup sends at every call.

Section 7's headline runs on recorded agent runs (:mod:`bench.agents_real`); these
generated traces stay as stress tests: results of 200-5,000 tokens, where one step fills
a 4,000-token window.

The traces (:mod:`bench.agent_traces`, deterministic, offline): one request of 200 tool
steps with results of 200-5,000 tokens, 20 requests of 20 steps each, a run of parallel
calls, and a run with single results of 21,000 tokens. Each is run through LangChain's own
``create_agent`` (:mod:`bench.agent_run`) with a scripted model that replays the trace's
replies and records every request, so each setup's middleware runs its own code on the
agent's real requests:

- demote (``DemotingMiddleware``): the default (``LowWater``), ``PerItem``, ``Bulk``
  (+25 %), ``Compact`` (25 %, with ``ChatModelSummarizer`` over a scripted model; its
  calls are priced too) and clearing
  (``ClearToolResults(trigger=limit/2, keep=3, clear_at_least=limit/4)``), all
  ``SlidingWindow.last_tokens(limit)``;
- LangChain ``SummarizationMiddleware(model, trigger=("tokens", limit), keep=("messages",
  6))`` with a scripted summarizer model (its calls are priced too);
- LangChain ``ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=limit, keep=3)])``;
- ``trim_messages(strategy="last", token_counter=count_tokens_approximately,
  max_tokens=limit)`` on every model call (a ``wrap_model_call`` middleware), as is and
  with ``start_on="human"`` (LangChain's documented form for chat history);
- no memory.

Per model call: the tokens sent, by ``count_tokens_approximately`` over the request's
messages (the system prompt included) and the bound tool definitions; peak, p95 and how
many calls are over the limit; how many requests a provider would reject
(:func:`langchain_demote.provider_rules.violations`: the documented ordering rules and
langchain-anthropic's and langchain-openai's own converters). The billed input of the
whole run with prompt caching at Anthropic's prices (:mod:`demote.cli.cachecost`: reads
0.1x, writes 1.25x, prefix reuse with the previous call, tool definitions first), in
full-price input tokens, summarizer calls included. Run alone with
``python -m bench.agents``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.messages.utils import count_tokens_approximately, trim_messages

from bench.agent_run import AgentRun, ScriptedModel, SummaryModel, run_agent
from bench.agent_traces import AgentTrace, benchmark_traces, summary, text_of
from bench.common import RESULTS, environment, progress, table, write_json
from demote import Bulk, Compact, Demoter, PerItem, SlidingWindow
from demote.cli.cachecost import ANTHROPIC, CacheMeter
from demote.window.policy import ClearToolResults
from langchain_demote.provider_rules import violations

SECTION = "agents"
LIMITS = (4_000, 8_000)
SUMMARY_TOKENS = 200
COLUMNS = [
    ("trace", "trace", ""),
    ("setup", "setup", ""),
    ("calls", "calls", ","),
    ("peak", "peak", ","),
    ("peak_x", "peak/limit", ".2f"),
    ("p95", "p95", ","),
    ("over", "over limit", ","),
    ("invalid", "invalid", ","),
    ("billed", "billed (Anthropic)", ",.0f"),
    ("x_summarization", "vs Summarization", ".2f"),
    ("seconds", "s", ".1f"),
]

Setup = Callable[[int], tuple[list[Any], Callable[[], None] | None, list[SummaryModel]]]


def _summary_model() -> SummaryModel:
    import random

    return SummaryModel(text="Summary: " + text_of(random.Random(7), SUMMARY_TOKENS))


def _demote(policy: Callable[[int], SlidingWindow], compact: bool = False) -> Setup:
    def make(limit: int) -> tuple[list[Any], Callable[[], None] | None, list[SummaryModel]]:
        from langchain_demote import ChatModelSummarizer, DemotingMiddleware

        models: list[SummaryModel] = []
        summarizer = None
        if compact:
            models.append(_summary_model())
            summarizer = ChatModelSummarizer(models[0], max_summary_tokens=SUMMARY_TOKENS * 2)
        demoter = Demoter(policy(limit), summarizer=summarizer)

        def wait() -> None:  # each summary is waited for, so runs repeat exactly
            demoter.drain(30)

        return [DemotingMiddleware(demoter)], wait, models

    return make


def _summarization(limit: int) -> tuple[list[Any], None, list[SummaryModel]]:
    from langchain.agents.middleware import SummarizationMiddleware

    model = _summary_model()
    middleware = SummarizationMiddleware(
        model=model, trigger=("tokens", limit), keep=("messages", 6)
    )
    return [middleware], None, [model]


def _context_editing(limit: int) -> tuple[list[Any], None, list[SummaryModel]]:
    from langchain.agents.middleware import ClearToolUsesEdit, ContextEditingMiddleware

    return [ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=limit, keep=3)])], None, []


def trim_middleware(limit: int, start_on: str | None = None) -> Any:
    """A ``wrap_model_call`` middleware sending ``trim_messages(..., max_tokens=limit)``.

    Also section 7's (:mod:`bench.agents_real`) ``trim_messages`` setup.
    """
    from langchain.agents.middleware import wrap_model_call

    options: dict[str, Any] = {} if start_on is None else {"start_on": start_on}

    @wrap_model_call  # type: ignore[arg-type]
    def trimmed(request: Any, handler: Any) -> Any:
        kept = trim_messages(
            request.messages,
            strategy="last",
            token_counter=count_tokens_approximately,
            max_tokens=limit,
            **options,
        )
        return handler(request.override(messages=kept))

    return trimmed


def _trim(start_on: str | None) -> Setup:
    def make(limit: int) -> tuple[list[Any], None, list[SummaryModel]]:
        return [trim_middleware(limit, start_on)], None, []

    return make


def _none(limit: int) -> tuple[list[Any], None, list[SummaryModel]]:
    return [], None, []


def setups() -> dict[str, Setup]:
    def tokens(limit: int) -> SlidingWindow:
        return SlidingWindow.last_tokens(limit)

    return {
        "demote (default)": _demote(tokens),
        "demote PerItem": _demote(lambda n: SlidingWindow.last_tokens(n, eviction=PerItem())),
        "demote Bulk +25%": _demote(
            lambda n: SlidingWindow.last_tokens(n, eviction=Bulk(overflow=n // 4))
        ),
        "demote Compact 25%": _demote(
            lambda n: SlidingWindow.last_tokens(n, eviction=Compact(compact_count=n // 4)),
            compact=True,
        ),
        "demote clearing": _demote(
            lambda n: SlidingWindow(
                unit="tokens",
                limit=n,
                clearing=ClearToolResults(trigger=n // 2, keep=3, clear_at_least=n // 4),
            )
        ),
        "SummarizationMiddleware": _summarization,
        "ContextEditingMiddleware": _context_editing,
        "trim_messages": _trim(None),
        "trim_messages start_on=human": _trim("human"),
        "no memory": _none,
    }


class _Counter:
    """Each message's (fingerprint, tokens), counted once by ``count_tokens_approximately``."""

    def __init__(self) -> None:
        self._cache: dict[Hashable, tuple[Hashable, int]] = {}

    def __call__(self, message: BaseMessage) -> tuple[Hashable, int]:
        content = (
            message.content if isinstance(message.content, str) else json.dumps(message.content)
        )
        calls = tuple(c["id"] for c in getattr(message, "tool_calls", ()))
        key = (message.type, content, getattr(message, "tool_call_id", None), calls)
        hit = self._cache.get(key)
        if hit is None:
            hit = (key, count_tokens_approximately([message]))
            self._cache[key] = hit
        return hit


class _Checker:
    """:func:`violations` of a request, remembered by the request's messages.

    Setups that send the same request (no memory at both limits, or any setup before it
    first cuts) are checked once; the converters dominate the section's time otherwise.
    """

    def __init__(self, count: _Counter) -> None:
        self.count = count
        self._seen: dict[tuple[Hashable, ...], bool] = {}

    def invalid(self, request: Sequence[BaseMessage]) -> bool:
        key = tuple(self.count(m)[0] for m in request)
        hit = self._seen.get(key)
        if hit is None:
            hit = self._seen[key] = bool(violations(request))
        return hit


def measure(
    run: AgentRun,
    limit: int,
    summarizers: Sequence[SummaryModel],
    *,
    count: _Counter | None = None,
    checker: _Checker | None = None,
) -> dict[str, Any]:
    """Per-call tokens, invalid requests and billed input of one recorded run."""
    count = count or _Counter()
    checker = checker or _Checker(count)
    tool_tokens = count_tokens_approximately([], tools=run.tools) if run.tools else 0
    meter = CacheMeter((ANTHROPIC,))
    sizes: list[int] = []
    billed = 0.0
    invalid = 0
    for request in run.requests:
        prompt: list[tuple[Hashable, int]] = [("tools", tool_tokens), *map(count, request)]
        sizes.append(sum(t for _, t in prompt))
        billed += meter.add(prompt)[0].cost
        invalid += checker.invalid(request)
    summary_meter = CacheMeter((ANTHROPIC,))
    summary_calls = 0
    for model in summarizers:
        for request in model.seen:
            summary_calls += 1
            billed += summary_meter.add([count(m) for m in request])[0].cost
    ordered = sorted(sizes)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0
    return {
        "calls": len(sizes),
        "peak": max(sizes, default=0),
        "peak_x": max(sizes, default=0) / limit,
        "p95": p95,
        "over": sum(s > limit for s in sizes),
        "invalid": invalid,
        "billed": billed,
        "sent_tokens": sum(sizes),
        "summary_calls": summary_calls,
        "tool_tokens": tool_tokens,
    }


def run_setup(
    trace: AgentTrace, setup: Setup, limit: int, checker: _Checker | None = None
) -> dict[str, Any]:
    middleware, before_reply, summarizers = setup(limit)
    began = time.perf_counter()
    run = run_agent(trace, middleware, model=ScriptedModel(), before_reply=before_reply)
    seconds = time.perf_counter() - began
    for m in middleware:
        demoter = getattr(m, "demoter", None)
        if demoter is not None:
            demoter.close()
    count = checker.count if checker is not None else None
    row = measure(run, limit, summarizers, count=count, checker=checker)
    row["seconds"] = seconds
    return row


def run(
    *,
    quick: bool = False,
    out: Path = RESULTS,
    quiet: bool = False,
    limits: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Run the section; returns (and writes) its results."""
    began = time.perf_counter()
    traces = benchmark_traces(quick=quick)
    limits = tuple(limits or ((4_000,) if quick else LIMITS))
    rows: list[dict[str, Any]] = []
    # A Compact window over its hard bound warns at every call (the running turn alone is
    # too large to compact today); the table counts what it sends, the log is noise here.
    log = logging.getLogger("demote")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        for trace in traces:
            checker = _Checker(_Counter())  # per trace: requests repeat across setups
            for limit in limits:
                done: dict[str, dict[str, Any]] = {}
                for label, setup in progress(
                    list(setups().items()), f"{trace.name} @ {limit}", quiet
                ):
                    row = run_setup(trace, setup, limit, checker)
                    done[label] = {"trace": trace.name, "limit": limit, "setup": label, **row}
                base = done["SummarizationMiddleware"]["billed"]
                for row in done.values():
                    row["x_summarization"] = row["billed"] / base if base else None
                    rows.append(row)
    finally:
        log.setLevel(level)
    order = [t.name for t in traces]
    rows.sort(key=lambda r: (r["limit"], order.index(r["trace"])))
    payload = {
        "section": SECTION,
        "limits": list(limits),
        "traces": [summary(t) for t in traces],
        "quick": quick,
        "rows": rows,
        "seconds": time.perf_counter() - began,
        "environment": environment(),
    }
    write_json(SECTION, payload, out)
    return payload


def report(payload: dict[str, Any]) -> str:
    traces = ", ".join(
        f"{t['trace']} ({t['requests']} req, {t['steps']} steps, {t['tokens']:,} tokens)"
        for t in payload["traces"]
    )
    lines = [
        "## 7s. Agents on generated stress traces (tokens sent per model call, system prompt "
        "and tools included; invalid requests by the ordering rules and both providers' "
        "converters; billed input of the whole run with Anthropic prompt caching, in "
        "full-price tokens)",
        "",
        f"Traces: {traces}.",
    ]
    for limit in payload["limits"]:
        rows = [r for r in payload["rows"] if r["limit"] == limit]
        lines += ["", f"### limit {limit:,} tokens", "", table(rows, COLUMNS)]
    lines.append(f"({payload['seconds']:.1f} s)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agents")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--limits", type=int, nargs="+")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    print(report(run(quick=args.quick, out=args.out, limits=args.limits)))


if __name__ == "__main__":
    main()
