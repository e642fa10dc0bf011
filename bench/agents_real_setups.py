"""Section 7's memory setups, one factory each, and one recorded run replayed under one.

:data:`SETUPS` maps a setup's name to a factory that makes it for one run at one limit
(:class:`Prepared`: its middleware and what to do around the replay); :func:`run_one`
replays a recorded run through ``create_agent`` under it. The setups are described in
:mod:`bench.agents_real`, the section that runs them.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.agent_run import AgentRun, ScriptedModel, SummaryModel, replay
from bench.real_traces import RealTrace

BASELINE = "no memory"
SUMMARY_TEXT = "Summary of the work so far: " + "the agent read files and ran commands; " * 20


@dataclass
class Prepared:
    """One setup made for one run: its middleware and what to do around the replay."""

    middleware: list[Any]
    before_reply: Callable[[], None] | None = None
    summarizers: list[SummaryModel] = field(default_factory=list)
    close: Callable[[], None] | None = None
    overhangs: list[int] = field(default_factory=list)  # each overhang event's tokens


Setup = Callable[[int, Path], Prepared]


def _demote(policy: Callable[[int], Any]) -> Setup:
    def make(limit: int, tmp: Path) -> Prepared:
        from demote import Demoter, SQLiteArchive
        from langchain_demote import DemotingMiddleware

        archive = SQLiteArchive(str(tmp / "archive.db"))
        demoter = Demoter(policy(limit), archive)
        overhangs: list[int] = []

        def seen(event: Any) -> None:
            if event.kind == "overhang":
                overhangs.append(event.tokens_after)

        unsubscribe = demoter.observe(seen)

        def close() -> None:
            demoter.drain(30)
            unsubscribe()
            demoter.close()
            archive.close()

        # Every delivery is waited for before the model answers, so runs repeat exactly.
        return Prepared(
            [DemotingMiddleware(demoter)],
            lambda: demoter.drain(30),
            close=close,
            overhangs=overhangs,
        )

    return make


def _default(limit: int) -> Any:
    from demote import SlidingWindow

    return SlidingWindow.last_tokens(limit)


def _per_item(limit: int) -> Any:
    from demote import PerItem, SlidingWindow

    return SlidingWindow.last_tokens(limit, eviction=PerItem())


def _bulk_half(limit: int) -> Any:
    from demote import Bulk, SlidingWindow

    return SlidingWindow.last_tokens(limit // 2, eviction=Bulk(overflow=limit // 2))


def _readme_clearing(limit: int) -> Any:
    from demote import ClearToolResults, SlidingWindow

    clearing = ClearToolResults(trigger=limit // 2, keep=3, clear_at_least=limit // 8)
    return SlidingWindow(unit="tokens", limit=limit, clearing=clearing)


def _summarization(limit: int, tmp: Path) -> Prepared:
    from langchain.agents.middleware import SummarizationMiddleware

    model = SummaryModel(text=SUMMARY_TEXT)
    middleware = SummarizationMiddleware(
        model=model, trigger=("tokens", limit), keep=("tokens", limit // 2)
    )
    return Prepared([middleware], summarizers=[model])


def _context_editing(limit: int, tmp: Path) -> Prepared:
    from langchain.agents.middleware import ClearToolUsesEdit, ContextEditingMiddleware

    return Prepared([ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=limit, keep=3)])])


def _trim(limit: int, tmp: Path) -> Prepared:
    from bench.agents import trim_middleware

    return Prepared([trim_middleware(limit)])


def _none(limit: int, tmp: Path) -> Prepared:
    return Prepared([])


#: The setups, in report order. The baseline (no memory) is always run: billed is relative
#: to it.
SETUPS: dict[str, Setup] = {
    "demote": _demote(_default),
    "demote PerItem": _demote(_per_item),
    "demote Bulk L/2+L/2": _demote(_bulk_half),
    "demote clearing (README)": _demote(_readme_clearing),
    "SummarizationMiddleware": _summarization,
    "ContextEditingMiddleware": _context_editing,
    "trim_messages": _trim,
    BASELINE: _none,
}


def run_one(
    trace: RealTrace, setup: Setup, limit: int, overhangs: list[int] | None = None
) -> tuple[AgentRun, list[Any], float]:
    """Replay ``trace`` under one setup; the run, the summarizers' requests, seconds.

    ``overhangs`` receives the tokens of each ``overhang`` event a demote setup fired.
    """
    with tempfile.TemporaryDirectory(prefix="demote-bench-") as tmp:
        prepared = setup(limit, Path(tmp))
        began = time.perf_counter()
        marks: list[int] = []

        def before_reply() -> None:
            if prepared.before_reply is not None:
                prepared.before_reply()
            marks.append(sum(len(s.seen) for s in prepared.summarizers))

        try:
            run = replay(
                trace, prepared.middleware, model=ScriptedModel(), before_reply=before_reply
            )
        finally:
            if prepared.close is not None:
                prepared.close()
        seconds = time.perf_counter() - began
        if overhangs is not None:
            overhangs.extend(prepared.overhangs)
    # A summary made for the model call after the recording ends answered nothing.
    summaries = [r for s in prepared.summarizers for r in s.seen][: marks[-1] if marks else 0]
    return run, summaries, seconds
