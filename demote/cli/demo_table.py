"""Playing the two halves of ``demote demo`` (LangChain, LlamaIndex), and its closing table.

The halves live with their adapters (``langchain_demote.demo``, ``llamaindex_demote.demo``):
the core never imports a framework, so they are loaded by name when a half is played, and
a missing extra raises :class:`~demote.errors.MissingExtraError` naming it.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

from demote.engine import Demoter
from demote.policy import SlidingWindow

if TYPE_CHECKING:
    from demote.demo import CountingHook, DemoOptions, PartResult, Probe, Script

__all__ = ["finish", "play", "print_table"]

LANGCHAIN_ID = "demo-langchain"
LLAMAINDEX_ID = "demo-llamaindex"


def finish(part: PartResult, hook: CountingHook, cid: str, started: float) -> PartResult:
    """Fill in what a played half delivered, archived and took; return ``part``."""
    part.demoted = hook.delivered.get(cid, 0)
    part.redelivered = hook.redelivered.get(cid, 0)
    part.archived = hook.archive.count(cid)
    part.seconds = time.perf_counter() - started
    return part


def play(
    framework: str,
    demoter: Demoter,
    hook: CountingHook,
    turns: Sequence[tuple[str, str]],
    probe: Probe,
    options: DemoOptions,
    err: IO[str],
) -> PartResult:
    """Play one half: ``framework`` is ``"langchain"`` or ``"llamaindex"``."""
    module = importlib.import_module(f"{framework}_demote.demo")
    result: PartResult = module.play(demoter, hook, turns, probe, options, err)
    return result


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
