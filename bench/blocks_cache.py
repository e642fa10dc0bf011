"""What LlamaIndex memory blocks cost a chat with prompt caching, by where they are placed.

LoCoMo conversations are replayed turn by turn through a real ``DemotingMemory`` with
three memory blocks: a ``StaticMemoryBlock`` (a profile), a ``FactExtractionMemoryBlock``
(its model a stand-in that keeps each user message it is fed as a fact, so it changes
whenever it is fed) and a per-question block (the demoted lines that share the most
words with the question: what a ``VectorMemoryBlock`` answers, without an embedding
model). Each call's request is the system prompt and what the read returned, priced with
:mod:`demote.cli.cachecost` (Anthropic: 0.1x reads, 1.25x writes; OpenAI: 0.5x reads)
under three placements of the same block content:

- *demote*: as ``DemotingMemory`` sends them: the static block right after the system
  prompt, the facts after the note, the per-question block after the question;
- *Memory, system*: LlamaIndex's default ``insert_method="system"``: every block's section
  in one system message at the head (LlamaIndex's Anthropic LLM makes it part of the
  system prompt);
- *Memory, user*: ``insert_method="user"``: every block's section in front of the newest
  user message.

*x demote* is each placement's bill over demote's. Run with ``python -m bench.blocks_cache``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock
from llama_index.core.bridge.pydantic import Field
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.memory.memory_blocks import FactExtractionMemoryBlock, StaticMemoryBlock

from bench.common import environment, locomo, table
from demote.cli.cachecost import PRICINGS, CacheMeter
from demote.cli.transcript import Transcript
from demote.records import fingerprint
from llamaindex_demote import DemotingMemory, to_core
from llamaindex_demote.messages import text_of

LIMIT = 4000
SYSTEM_PROMPT_TOKENS = 200
PLACEMENTS = ("demote", "Memory, system", "Memory, user")
COLUMNS = [
    ("placement", "placement", ""),
    ("anthropic", "Anthropic (x uncached)", ".3f"),
    ("openai", "OpenAI (x uncached)", ".3f"),
    ("vs_demote", "billed x demote (Anthropic)", ".2f"),
]


def _facts(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
    said = [text_of(m) for m in messages[:-1] if m.role == MessageRole.USER]
    facts = "".join(f"<fact>{s[:120]}</fact>" for s in said)
    return ChatMessage(
        role=MessageRole.ASSISTANT, blocks=[TextBlock(text=f"<facts>{facts}</facts>")]
    )


class Overlap(BaseMemoryBlock[str]):
    """The demoted lines sharing the most words with the newest message (per question)."""

    name: str = "past"
    lines: list[str] = Field(default_factory=list)

    async def _aget(self, messages: list[ChatMessage] | None = None, **kwargs: Any) -> str:
        words = set(re.findall(r"\w{4,}", text_of(messages[-1]).lower())) if messages else set()
        ranked = sorted(self.lines, key=lambda t: -len(words & set(re.findall(r"\w{4,}", t))))
        return "\n".join(ranked[:3])

    async def _aput(self, messages: list[ChatMessage]) -> None:
        self.lines.extend(text_of(m).lower()[:200] for m in messages)


def _sections(sent: list[ChatMessage]) -> tuple[list[ChatMessage], str]:
    """``sent`` without the block messages, and the blocks' text joined."""
    rest, blocks = [], []
    for m in sent:
        (blocks if text_of(m).lstrip().startswith("<memory>") else rest).append(m)
    return rest, "\n".join(text_of(m) for m in blocks)


def placed(sent: list[ChatMessage], placement: str) -> list[ChatMessage]:
    if placement == "demote":
        return sent
    rest, text = _sections(sent)
    if placement == "Memory, system":
        return [ChatMessage(role=MessageRole.SYSTEM, content=text), *rest]
    last = max(i for i, m in enumerate(rest) if m.role == MessageRole.USER)
    question = ChatMessage(role=MessageRole.USER, content=text + "\n" + text_of(rest[last]))
    return [*rest[:last], question, *rest[last + 1 :]]


def replay(t: Transcript, limit: int) -> dict[str, Any]:
    llm = MockFunctionCallingLLM(response_generator=_facts, is_chat_model=True)
    blocks = [
        StaticMemoryBlock(name="profile", static_content="The user and their friend chat."),
        FactExtractionMemoryBlock(name="facts", llm=llm, max_facts=40),
        Overlap(),
    ]
    memory = DemotingMemory.from_defaults(
        token_limit=limit, memory_blocks=blocks, chat_history_token_ratio=0.8, session_id=t.name
    )
    meters = {p: CacheMeter(PRICINGS) for p in PLACEMENTS}

    def priced(sent: Sequence[ChatMessage]) -> list[tuple[str, int]]:
        head = [("system-prompt", SYSTEM_PROMPT_TOKENS)]
        return head + [
            (fingerprint(m.role.value, text_of(m)), to_core(m, memory.demoter.describe).tokens)
            for m in sent
        ]

    for role, text in t.messages:
        memory.put(ChatMessage(role=role, content=text))
        if role != "user":
            continue
        sent = memory.get(initial_token_count=SYSTEM_PROMPT_TOKENS)
        memory.demoter.drain(5)
        for p in PLACEMENTS:
            meters[p].add(priced(placed(sent, p)))
    return {p: meters[p].results() for p in PLACEMENTS}


def run(quick: bool = False, limit: int = LIMIT) -> dict[str, Any]:
    conversations = locomo(2 if quick else None)
    totals = {p: [0.0, 0.0, 0.0] for p in PLACEMENTS}  # tokens, anthropic, openai
    for t in conversations:
        for p, costs in replay(t, limit).items():
            tokens = costs[0].mean_prompt_tokens * costs[0].calls
            totals[p][0] += tokens
            totals[p][1] += costs[0].relative_cost * tokens
            totals[p][2] += costs[1].relative_cost * tokens
    rows = [
        {
            "placement": p,
            "anthropic": totals[p][1] / totals[p][0],
            "openai": totals[p][2] / totals[p][0],
            "vs_demote": totals[p][1] / totals["demote"][1],
        }
        for p in PLACEMENTS
    ]
    return {
        "limit": limit,
        "conversations": len(conversations),
        "rows": rows,
        "environment": environment(),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--limit", type=int, default=LIMIT)
    args = parser.parse_args(argv)
    payload = run(args.quick, args.limit)
    print(
        f"Memory blocks in a cached chat (LoCoMo, {payload['conversations']} conversations, "
        f"{payload['limit']:,} tokens)\n"
    )
    print(table(payload["rows"], COLUMNS))


if __name__ == "__main__":
    main()
