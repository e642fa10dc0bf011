"""Section 2r: what injected recall costs a chat with prompt caching, and what it brings back.

Every LoCoMo conversation is replayed turn by turn (speaker_a as the user, speaker_b as the
assistant) through a real ``DemotingMemory`` over a ``SQLiteArchive`` (the hook), the way
``SimpleChatEngine`` uses it: the user message is stored, the memory is read with the
engine's prefix (a 200-token system prompt) as ``initial_token_count``, the reply is
stored. The request of each call is the system prompt and what the read returned: the
window, and with recall on, the recall message right after the question. Requests are
priced with :mod:`demote.cli.cachecost` (Anthropic: 0.1x reads, 1.25x writes; OpenAI:
0.5x reads from 1,024 tokens), the prefix shared with the previous call read from the
cache. The LangChain middleware builds the same request (:func:`demote.request.compose`).

*Recall hit*: after the whole conversation, each of its questions (LoCoMo's ``qa``, with
evidence) is asked once as the next message, without storing it: a hit when a message
holding its evidence is in what the model is sent (the window or the recall). With recall
off only the window can hold it.

Setups, all on ``SlidingWindow.last_tokens(L)`` (the default window): recall off; recall
on with the defaults (``recall_k=5``, a budget of 1/72 of the limit, reserved out of it:
:data:`demote.request.RECALL_SHARE`); and the same with larger budgets. *Billed x off*
is the bill over the recall-off bill of the same conversations, pooled. Run alone with
``python -m bench.recall_cache``.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core.base.llms.types import ChatMessage

from bench.common import RESULTS, environment, locomo, progress, table, write_json
from demote import Demoter, SlidingWindow, SQLiteArchive
from demote.cli.cachecost import PRICINGS, CacheMeter
from demote.cli.transcript import Transcript
from demote.records import fingerprint
from demote.request import RECALL_PREFIX
from llamaindex_demote import DemotingMemory, to_core
from llamaindex_demote.messages import text_of

SECTION = "recall_cache"
LIMIT = 4000
SYSTEM_PROMPT_TOKENS = 200
_serial = itertools.count()
COLUMNS = [
    ("setup", "setup", ""),
    ("anthropic", "Anthropic", ".3f"),
    ("openai", "OpenAI", ".3f"),
    ("billed_vs_off", "billed x off (Anthropic)", ".2f"),
    ("openai_vs_off", "billed x off (OpenAI)", ".2f"),
    ("recall_calls", "calls with recall", ".0%"),
    ("recall_tokens", "recall tokens/call", ".0f"),
    ("mean_prompt_tokens", "mean prompt", ",.0f"),
    ("hit", "recall hit", ".1%"),
]


@dataclass(frozen=True)
class Setup:
    """One way of running the memory."""

    name: str
    recall: bool
    budget: int | None = None  # None: the default (RECALL_SHARE of the limit)
    k: int = 5


def setups(limit: int) -> list[Setup]:
    return [
        Setup("recall off", False),
        Setup("recall on (defaults)", True),
        Setup(f"recall on, budget {limit // 40} (1/40)", True, limit // 40),
        Setup(f"recall on, budget {limit // 20} (1/20)", True, limit // 20),
        Setup(f"recall on, budget {limit // 10} (1/10)", True, limit // 10),
    ]


def replay(t: Transcript, setup: Setup, limit: int, folder: Path) -> dict[str, Any]:
    """One conversation under one setup: its bills, recall use and recall hits."""
    archive = SQLiteArchive(folder / f"{t.name}-{next(_serial)}.db")
    demoter = Demoter(SlidingWindow.last_tokens(limit), archive, hook_wait=None)
    memory = DemotingMemory.from_defaults(
        demoter=demoter,
        chat_store_key=t.name,
        recall=archive if setup.recall else None,
        recall_k=setup.k,
        recall_budget_tokens=setup.budget,
    )
    meter = CacheMeter(PRICINGS)
    calls = with_recall = recall_tokens = 0

    def tokens(m: ChatMessage) -> int:
        return to_core(m, demoter.describe).tokens

    def priced(sent: Sequence[ChatMessage]) -> list[tuple[str, int]]:
        head = [("system-prompt", SYSTEM_PROMPT_TOKENS)]
        return head + [(fingerprint(m.role.value, text_of(m)), tokens(m)) for m in sent]

    for role, text in t.messages:
        memory.put(ChatMessage(role=role, content=text))
        if role != "user":
            continue
        sent = memory.get(initial_token_count=SYSTEM_PROMPT_TOKENS)
        demoter.drain(5)
        meter.add(priced(sent))
        calls += 1
        recalled = [m for m in sent if text_of(m).startswith(RECALL_PREFIX)]
        if recalled:
            with_recall += 1
            recall_tokens += tokens(recalled[0])
    hits = asked = 0
    for q in t.questions:
        evidence = {t.messages[i][1] for i in q.evidence}
        if not evidence:
            continue
        asked += 1
        sent = memory.get(input=q.text, initial_token_count=SYSTEM_PROMPT_TOKENS)
        shown = "\n".join(text_of(m) for m in sent)
        hits += any(e in shown for e in evidence)
    costs = meter.results()
    archive.close()
    return {
        "conversation": t.name,
        "setup": setup.name,
        "calls": calls,
        "tokens": costs[0].mean_prompt_tokens * calls,
        "anthropic_cost": costs[0].relative_cost * costs[0].mean_prompt_tokens * calls,
        "openai_cost": costs[1].relative_cost * costs[1].mean_prompt_tokens * calls,
        "with_recall": with_recall,
        "recall_tokens": recall_tokens,
        "asked": asked,
        "hits": hits,
    }


def run(
    *, quick: bool = False, out: Path = RESULTS, quiet: bool = False, limit: int = LIMIT
) -> dict[str, Any]:
    conversations = locomo(1 if quick else None)
    if quick:
        conversations = [
            Transcript(c.messages[:300], c.questions[:20], c.source_format, (), c.name)
            for c in conversations
        ]
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="demote-bench-recall-cache-") as tmp:
        chosen = setups(limit)
        pairs = [(s, t) for s in chosen for t in conversations]
        for setup, t in progress(pairs, "recall_cache", quiet):
            runs.append(replay(t, setup, limit, Path(tmp)))
    off = {r["conversation"]: r for r in runs if r["setup"] == "recall off"}
    for setup in chosen:
        mine = [r for r in runs if r["setup"] == setup.name]
        tokens = sum(r["tokens"] for r in mine)
        calls = sum(r["calls"] for r in mine)
        anthropic = sum(r["anthropic_cost"] for r in mine)
        openai = sum(r["openai_cost"] for r in mine)
        rows.append(
            {
                "setup": setup.name,
                "anthropic": anthropic / tokens,
                "openai": openai / tokens,
                "billed_vs_off": anthropic
                / sum(off[r["conversation"]]["anthropic_cost"] for r in mine),
                "openai_vs_off": openai / sum(off[r["conversation"]]["openai_cost"] for r in mine),
                "recall_calls": sum(r["with_recall"] for r in mine) / calls,
                "recall_tokens": sum(r["recall_tokens"] for r in mine) / calls,
                "mean_prompt_tokens": tokens / calls,
                "hit": sum(r["hits"] for r in mine) / max(1, sum(r["asked"] for r in mine)),
            }
        )
    payload = {
        "section": SECTION,
        "limit": limit,
        "system_prompt_tokens": SYSTEM_PROMPT_TOKENS,
        "quick": quick,
        "rows": rows,
        "runs": runs,
        "environment": environment(),
    }
    write_json(SECTION, payload, out)
    return payload


def report(payload: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"## 2r. Injected recall in a cached chat (LoCoMo, {payload['limit']:,} tokens)",
            "",
            table(payload["rows"], COLUMNS),
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--limit", type=int, default=LIMIT)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    print(report(run(quick=args.quick, out=args.out, limit=args.limit)))


if __name__ == "__main__":
    main()
