"""Section 2: prompt-cache cost of eviction strategies, replayed over LoCoMo.

Every LoCoMo conversation is replayed turn by turn (speaker_a as the user, speaker_b as
the assistant). One model call is made per user message; its prompt is a 200-token system
prompt followed by what the memory under test returns. Prompts are priced with
:mod:`demote.cachecost` (Anthropic: 0.1x reads, 1.25x writes; OpenAI: 0.5x reads from
1,024 tokens in 128-token steps), relative to no caching. Every setup's prompts are
counted with the same counter (demote's ``approx``: ``ceil(chars / 4) + 3`` per message).

Setups, all at the same token limit (4,000 by default):

- demote ``PerItem``, ``Bulk`` at 10 %, 25 % and 50 % overflow, and ``Compact`` with
  ``compact_count`` = 25 % of the limit and the model-free ``TemplateSummarizer`` (summary
  capped at 200 tokens; each summary is waited for before the next turn, so the run
  repeats exactly; a real model summarizer costs its own calls, not counted here).
- LangChain ``trim_messages(history, strategy="last",
  token_counter=count_tokens_approximately, max_tokens=limit)`` over the full history at
  every call.
- LlamaIndex ``Memory.from_defaults(token_limit=limit)`` (no memory blocks; chat history
  capped at 70 % of the limit, flush size 3,000 tokens by default), and the same with
  ``token_flush_size`` = 10 % of the limit. Its tokenizer is given the same 4-characters
  heuristic, so the budgets mean the same thing; everything stays in its default
  in-memory SQLite store.

*Guaranteed* is the smallest window (tokens of conversation in the prompt) seen after the
window first stopped holding the whole conversation. *Steady* costs count only the calls
from that point on (the regime of a long chat). Run alone with ``python -m bench.cache_cost``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    agg_backend,
    aggregate,
    close_llama_memory,
    environment,
    locomo,
    progress,
    table,
    write_json,
)
from demote import Bulk, Compact, PerItem, SlidingWindow
from demote.cli.replay import SYSTEM_PROMPT_ID, ReplayMeter, ReplayResult, plot_windows, replay
from demote.cli.transcript import Transcript
from demote.records import fingerprint
from demote.window.tokens import MESSAGE_OVERHEAD, approximate_tokens

SECTION = "cache_cost"
SYSTEM_PROMPT_TOKENS = 200
COLUMNS = [
    ("setup", "setup", ""),
    ("anthropic", "Anthropic", ".3f"),
    ("openai", "OpenAI", ".3f"),
    ("anthropic_steady", "Anthropic, steady", ".3f"),
    ("openai_steady", "OpenAI, steady", ".3f"),
    ("anthropic_steady_billed", "Anthropic billed/call, steady", ",.0f"),
    ("mean_prompt_tokens", "mean prompt", ",.0f"),
    ("guaranteed_tokens", "guaranteed", ","),
    ("max_window_tokens", "max window", ","),
    ("cuts", "cuts", ","),
]

Setup = Callable[[Transcript, int], ReplayResult]


class _Describer:
    """(fingerprint, tokens) of a message by role and text, cached: the shared counter."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], tuple[str, int]] = {}

    def __call__(self, role: str, text: str) -> tuple[str, int]:
        key = (role, text)
        hit = self._cache.get(key)
        if hit is None:
            hit = (fingerprint(role, text), approximate_tokens(text) + MESSAGE_OVERHEAD)  # type: ignore[arg-type]
            self._cache[key] = hit
        return hit


def _record(
    meter: ReplayMeter,
    window: Sequence[tuple[str, int]],
    total: int,
    out_before: int,
) -> int:
    prompt: list[tuple[Hashable, int]] = [(SYSTEM_PROMPT_ID, SYSTEM_PROMPT_TOKENS), *window]
    out = total - len(window)
    meter.record(
        prompt,
        window_tokens=sum(t for _, t in window),
        window_messages=len(window),
        full=out > 0,
        demoted=max(0, out - out_before),
    )
    return out


def demote_setup(eviction: PerItem | Bulk | Compact) -> Setup:
    def run(t: Transcript, limit: int) -> ReplayResult:
        policy = SlidingWindow.last_tokens(limit, eviction=eviction)
        summarizer = None
        if isinstance(eviction, Compact):
            from demote.summarize import TemplateSummarizer

            summarizer = TemplateSummarizer(max_summary_tokens=200)
        return replay(t, policy, system_prompt_tokens=SYSTEM_PROMPT_TOKENS, summarizer=summarizer)

    return run


def trim_setup(t: Transcript, limit: int) -> ReplayResult:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.messages.utils import count_tokens_approximately, trim_messages

    kinds: dict[str, Callable[[str], Any]] = {
        "user": HumanMessage,
        "assistant": AIMessage,
        "system": SystemMessage,
        "tool": lambda text: ToolMessage(text, tool_call_id="t"),
    }
    meter = ReplayMeter("LangChain trim_messages")
    describe = _Describer()
    history: list[Any] = []
    keys: dict[int, tuple[str, int]] = {}  # id(message) -> (fingerprint, tokens)
    out = 0
    began = time.perf_counter()
    for role, text in t.messages:
        message = kinds[role](text)
        history.append(message)
        keys[id(message)] = describe(role, text)
        if role != "user":
            continue
        kept = trim_messages(
            history,
            strategy="last",
            token_counter=count_tokens_approximately,
            max_tokens=limit,
        )
        window = [keys.get(id(m)) or describe(_role(m.type), str(m.content)) for m in kept]
        out = _record(meter, window, len(history), out)
    return meter.result(messages=len(t), seconds=time.perf_counter() - began)


def _role(kind: str) -> str:
    return {"human": "user", "ai": "assistant"}.get(kind, kind)


def llama_setup(label: str, flush_fraction: float | None) -> Setup:
    def run(t: Transcript, limit: int) -> ReplayResult:
        from llama_index.core.llms import ChatMessage
        from llama_index.core.memory import Memory

        options: dict[str, Any] = {}
        if flush_fraction is not None:
            options["token_flush_size"] = max(1, int(limit * flush_fraction))
        memory = Memory.from_defaults(
            token_limit=limit,
            tokenizer_fn=lambda text: [0] * approximate_tokens(text),
            **options,
        )
        meter = ReplayMeter(label)
        describe = _Describer()
        out, total = 0, 0
        began = time.perf_counter()
        for role, text in t.messages:
            memory.put(ChatMessage(role=role, content=text))
            total += 1
            if role != "user":
                continue
            window = [describe(str(m.role.value), m.content or "") for m in memory.get()]
            out = _record(meter, window, total, out)
        result = meter.result(messages=len(t), seconds=time.perf_counter() - began)
        close_llama_memory(memory)
        return result

    return run


def setups(limit: int) -> dict[str, Setup]:
    def pct(f: float) -> int:
        return math.ceil(limit * f)

    return {
        "demote PerItem": demote_setup(PerItem()),
        "demote Bulk +10%": demote_setup(Bulk(overflow=pct(0.10))),
        "demote Bulk +25%": demote_setup(Bulk(overflow=pct(0.25))),
        "demote Bulk +50%": demote_setup(Bulk(overflow=pct(0.50))),
        "demote Compact 25% (template summary)": demote_setup(Compact(compact_count=pct(0.25))),
        "LangChain trim_messages": trim_setup,
        "LlamaIndex Memory (defaults)": llama_setup("LlamaIndex Memory (defaults)", None),
        "LlamaIndex Memory (flush 10%)": llama_setup("LlamaIndex Memory (flush 10%)", 0.10),
    }


def run(
    *, quick: bool = False, limit: int | None = None, out: Path = RESULTS, quiet: bool = False
) -> dict[str, Any]:
    """Run the section; returns (and writes) its results."""
    began = time.perf_counter()
    limit = limit or (1500 if quick else 4000)
    transcripts = locomo(limit=1 if quick else None)
    if quick:  # the first 240 messages of one conversation
        t = transcripts[0]
        transcripts = [Transcript(t.messages[:240], (), t.source_format, (), t.name)]
    rows: list[dict[str, Any]] = []
    first: list[ReplayResult] = []
    notes: list[str] = []
    for label, setup in setups(limit).items():
        try:
            results = [setup(t, limit) for t in progress(transcripts, label, quiet)]
        except ImportError as exc:
            notes.append(f"{label}: skipped ({exc})")
            continue
        rows.append(aggregate(results, label))
        first.append(_relabel(results[0], label))
    target = _target(rows)
    payload = {
        "section": SECTION,
        "limit_tokens": limit,
        "system_prompt_tokens": SYSTEM_PROMPT_TOKENS,
        "conversations": [t.name for t in transcripts],
        "messages": sum(len(t) for t in transcripts),
        "quick": quick,
        "rows": rows,
        "target": target,
        "notes": notes,
        "seconds": time.perf_counter() - began,
        "environment": environment(),
    }
    payload["plot"] = _plot(first, limit, out, transcripts[0].name)
    write_json(SECTION, payload, out)
    return payload


def _relabel(r: ReplayResult, label: str) -> ReplayResult:
    from dataclasses import replace

    return replace(r, label=label)


def _target(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Bulk's billed tokens per call as a fraction of PerItem's, at the same limit.

    Both cut back to the same limit, so their guaranteed windows are comparable (listed);
    the fraction compares what a call is billed, not the relative cost, since Bulk's
    prompts are larger on average.
    """
    by = {r["setup"]: r for r in rows}
    base = by.get("demote PerItem")
    out: dict[str, Any] = {"goal": "Bulk billed <= 0.2x PerItem (Anthropic) at a comparable window"}
    if base is None:
        return out
    keys = ("anthropic", "openai", "anthropic_steady", "openai_steady")
    for label, row in by.items():
        if label.startswith("demote Bulk"):
            ratios: dict[str, Any] = {
                k: row[f"{k}_billed"] / base[f"{k}_billed"] if base[f"{k}_billed"] else None
                for k in keys
            }
            ratios["guaranteed_tokens"] = row["guaranteed_tokens"]
            ratios["per_item_guaranteed"] = base["guaranteed_tokens"]
            out[label] = ratios
    return out


def _plot(results: list[ReplayResult], limit: int, out: Path, name: str) -> str | None:
    agg_backend()
    try:
        path = out / f"{SECTION}.png"
        out.mkdir(parents=True, exist_ok=True)
        plot_windows(
            results,
            path,
            title=f"Conversation tokens in the prompt, LoCoMo {name}, limit {limit:,}",
            limit=limit,
        )
    except ImportError:
        return None
    return path.name


def report(payload: dict[str, Any]) -> str:
    lines = [
        f"## 2. Prompt-cache cost (LoCoMo, {len(payload['conversations'])} conversations, "
        f"{payload['messages']:,} messages, limit {payload['limit_tokens']:,} tokens, "
        f"{payload['system_prompt_tokens']}-token system prompt; cost relative to no caching)",
        "",
        table(payload["rows"], COLUMNS),
        "",
    ]
    for label, ratios in payload["target"].items():
        if isinstance(ratios, dict):
            a, s = ratios["anthropic"], ratios["anthropic_steady"]
            o = ratios["openai_steady"]
            lines.append(
                f"{label} billed per call vs PerItem: Anthropic {a:.2f}x (steady {s:.2f}x), "
                f"OpenAI steady {o:.2f}x; guaranteed {ratios['guaranteed_tokens']:,} vs "
                f"{ratios['per_item_guaranteed']:,} tokens"
            )
    lines.extend(payload["notes"])
    lines.append(f"({payload['seconds']:.1f} s)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cache_cost")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--limit", type=int)
    args = parser.parse_args(argv)
    print(report(run(quick=args.quick, limit=args.limit)))


if __name__ == "__main__":
    main()
