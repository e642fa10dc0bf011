"""A contract planner for adapter tests: windows cut at steps, old tool results cleared.

The step-and-clearing planner is built in parallel to the engine and adapters that serve
its plans. Until it lands, adapter tests can run on this small stand-in, which fills the
agent fields of :class:`~demote.window.planner.Plan` the way their docstrings define them, for
``PerItem`` token windows only: inside the running turn the window starts at the oldest
step boundary that fits ``limit`` with ``reserved`` and the opener; the newest step stays
whatever its size (the excess is the overhang); with ``policy.clearing``, once the tool
results in the window pass ``trigger`` tokens, all but the newest ``keep`` are cleared
(counted as :data:`~demote.window.clearing.PLACEHOLDER_TOKENS`). It reads the whole history
(``needed_from`` is 0), so it is a test tool, not a model of the real planner's cost.

:func:`steps_planner_landed` says whether the real planner already cuts inside a turn,
so tests parametrized over both run the real one for real once it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

import demote.engine
import demote.engine._views
from demote.records import ConversationState, MessageRecord
from demote.window.clearing import PLACEHOLDER_TOKENS
from demote.window.planner import Plan
from demote.window.planner import plan as real_plan
from demote.window.policy import PerItem, SlidingWindow

__all__ = ["step_plan", "steps_planner_landed", "use_contract_planner"]


def _boundaries(records: Sequence[MessageRecord], base: int, lo: int, end: int) -> list[int]:
    """Step starts in ``[lo, end)``: assistant messages with every earlier call answered."""
    open_calls: set[str] = set()
    out = []
    for i in range(lo, end):
        rec = records[i - base]
        if rec.role == "assistant" and not open_calls:
            out.append(i)
        open_calls.update(rec.opens)
        if rec.answers is not None:
            open_calls.discard(rec.answers)
    return out


def step_plan(
    policy: SlidingWindow,
    state: ConversationState,
    records: Sequence[MessageRecord],
    *,
    base: int = 0,
    index: Any = None,
    reserved: int = 0,
) -> Plan:
    """The real plan of the turns, refined at steps and clearing (see the module)."""
    p = real_plan(policy, state, records, base=base, reserved=reserved)
    if p.rewritten or policy.unit != "tokens" or not isinstance(policy.eviction, PerItem):
        return p
    end, lo = p.end, p.window_start
    users = [i for i in range(max(p.pinned, base), end) if records[i - base].role == "user"]
    deliver_from = p.deliver_from
    if state.delivered > state.window_start:
        deliver_from = max(deliver_from, state.delivered)
    if not users:
        return replace(p, deliver_from=deliver_from)
    opener = users[-1]  # the running turn's (records are read from 0: see the module)

    # Clearing, over the window region the turn plan left.
    clearing = policy.clearing
    watermark = state.cleared
    if clearing is not None:
        results = [
            i
            for i in range(lo, end)
            if records[i - base].role == "tool" and records[i - base].tool not in clearing.exclude
        ]
        if sum(records[i - base].tokens for i in results) > clearing.trigger:
            clearable = results[: max(0, len(results) - clearing.keep)]
            if clearable:
                watermark = max(watermark, clearable[-1] + 1)
    cleared = (
        {i for i in range(lo, min(watermark, end)) if records[i - base].role == "tool"}
        if clearing is not None
        else set()
    )

    def tokens(i: int) -> int:
        return PLACEHOLDER_TOKENS if i in cleared else records[i - base].tokens

    # The cut: the oldest start that fits, else the newest step.
    # A window that started inside an earlier turn keeps no tail of it once a new turn
    # began (that tail's opener is gone): it starts at the new turn, or later.
    whole = lo <= opener and (lo <= p.pinned or records[lo - base].role == "user")
    candidates = ([lo] if whole else [opener] if lo <= opener else []) + [
        b for b in _boundaries(records, base, max(lo, opener + 1), end) if b >= lo
    ]
    if not candidates:
        candidates = [lo]

    def size(start: int) -> int:
        head = tokens(opener) if start > opener else 0
        return head + sum(tokens(i) for i in range(start, end)) + reserved

    start = next((c for c in candidates if size(c) <= policy.limit), candidates[-1])
    overhang = max(0, size(start) - policy.limit)
    placeholders = tuple(sorted(i for i in cleared if i >= start))
    return replace(
        p,
        window_start=start,
        deliver_from=deliver_from,
        size=size(start) - reserved,
        opener=opener if start > opener else None,
        cleared=watermark,
        placeholders=placeholders,
        deliver_to=max(start, watermark),
        overhang=overhang,
    )


def _read_all(state: ConversationState) -> int:
    return 0


def use_contract_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the engine plan with :func:`step_plan` for the rest of the test."""
    for module in (demote.engine, demote.engine._views):
        monkeypatch.setattr(module, "plan", step_plan)
        monkeypatch.setattr(module, "needed_from", _read_all)


def steps_planner_landed() -> bool:
    """Does the real planner cut inside a long turn yet (keeping its opener)?"""
    from demote.records import fingerprint

    def rec(role: str, text: str, opens: tuple[str, ...] = (), answers: str | None = None) -> Any:
        fp = fingerprint(role, text, opens, answers)
        return MessageRecord(role, text, fp, 100, opens, answers)  # type: ignore[arg-type]

    records = [rec("user", "go")]
    for n in range(10):
        records += [rec("assistant", f"s{n}", (f"c{n}",)), rec("tool", f"r{n}", answers=f"c{n}")]
    p = real_plan(SlidingWindow.last_tokens(500), ConversationState(), records)
    return p.window_start > 0 and p.opener == 0
