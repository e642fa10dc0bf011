"""The closing table of ``demote demo``: one column per framework, the probe, the totals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

from demote.cli._table import table
from demote.cli.demo_parts import DemoOptions, PartResult, Probe, Script
from demote.window.policy import SlidingWindow

__all__ = ["print_table"]


def _range(values: Sequence[int]) -> str:
    return f"{min(values):,}-{max(values):,}" if values else "-"


def _steady(part: PartResult, unit: str) -> list[int]:
    if part.log is None:
        return []
    log = part.log
    return log.steady(log.window_messages if unit == "messages" else log.window_tokens)


def _saving(part: PartResult, pricing: str) -> str:
    if part.log is None:
        return "-"
    costs = {c.pricing: c.relative_cost for c in part.log.meter.results()}
    return f"{1 - costs[pricing]:.0%}" if pricing in costs else "-"


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
    lines = [
        f"demote demo, run {run}: {script.name}, {len(script.turns)} turns in the script",
        f"policy:   {label}   {policy.to_json()}",
        f"stores:   {options.directory}/ (state.db, archive.db, langchain-history.jsonl,"
        " llamaindex-chats.jsonl)",
        f"model:    {model}",
        "",
    ]
    rows = [
        ["", *(p.name for p in parts)],
        ["turns this run (+1 question)", *(f"{p.turns:,}" for p in parts)],
        ["messages in history", *(f"{p.history:,}" for p in parts)],
        ["window size (messages)", *(_range(_steady(p, "messages")) for p in parts)],
        ["window size (tokens)", *(_range(_steady(p, "tokens")) for p in parts)],
        ["messages demoted", *(f"{p.demoted:,}" for p in parts)],
        ["archive size", *(f"{p.archived:,}" for p in parts)],
        ["re-delivered", *(f"{p.redelivered:,}" for p in parts)],
        ["prompt-cache saving, anthropic", *(_saving(p, "anthropic") for p in parts)],
        ["prompt-cache saving, openai", *(_saving(p, "openai") for p in parts)],
        ["time", *(f"{p.seconds:.1f} s" for p in parts)],
    ]
    lines += table(rows, gap=4)
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
