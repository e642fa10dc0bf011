"""The LlamaIndex request oracle: every feature on, each request checked as providers build it.

Random multi-run agent threads go through llama-index-core's own ``FunctionAgent`` with a
system prompt, two tools (a worker and ``recall_tool``) and ``DemotingLLM`` over one
``DemotingMemory`` with injected recall from the archive it demotes to, clearing, and the
default cache-true window (its digest) or ``Compact`` with a model-free summarizer, and
LlamaIndex memory blocks fed by the same demoter (a ``StaticMemoryBlock``, a
``FactExtractionMemoryBlock`` over a mock LLM and a ``VectorMemoryBlock`` over a vector
store that stores text); and random chats through ``SimpleChatEngine`` with a system
prompt and the same memory. The model is a scripted
mock (the one thing that cannot run here) that records every request.

Every request must: have no system message after the first non-system one and a user
message first after them; pair every tool result with its call; stay within the limit by
the memory's own counter (tool schemas included) unless an ``overhang`` event said what
could not be cut; convert without error through llama-index-llms-openai's own message
converter; keep one system prompt for the whole thread (what LlamaIndex's Anthropic LLM
sends as its ``system`` field: every system message's text, joined); and between two cuts
start with the previous request (up to its recall, or its per-question memory block), as
the OpenAI converter builds it; the memory blocks count toward the limit like the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.memory.memory_blocks import (
    FactExtractionMemoryBlock,
    StaticMemoryBlock,
    VectorMemoryBlock,
)
from llama_index.core.prompts import RichPromptTemplate
from llama_index.core.tools import FunctionTool

from demote import ClearToolResults, Compact, Demoter, SlidingWindow, SQLiteArchive
from demote.hooks.simple import FanOutHook
from demote.request import RECALL_PREFIX
from demote.summarize import TemplateSummarizer
from llamaindex_demote import DemotingLLM, DemotingMemory, MemoryBlocksHook, recall_tool
from llamaindex_demote.messages import answered_call, opened_calls, text_of, to_core
from tests.llamaindex_demote.agent_support import Collect
from tests.llamaindex_demote.blocks_support import TextVectorStore, WordEmbedding, fact_llm
from tests.strategies import examples

llms_openai = pytest.importorskip("llama_index.llms.openai.utils")

pytestmark = pytest.mark.filterwarnings(
    "ignore::pydantic.warnings.PydanticDeprecationWarning:inspect"
)

ORACLE = settings(
    max_examples=examples(10, cost=60),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
SYSTEM = "You are a careful agent. Use the tools; keep answers short."
TOPICS = ("invoice", "flight", "locker", "deploy", "garden", "ticket")
_serial = itertools.count()


def work(q: str) -> str:
    """Do one unit of work on ``q`` (a topic, a seed and a size) and report."""
    topic, seed, size = q.split(":")
    words = [
        f"{TOPICS[(int(seed) + k) % 6]} ZX-{int(seed) % 97:02d}{k:03d} value"
        for k in range(int(size) // 3)
    ]
    return f"{topic} report: " + " ".join(words)


@dataclass(frozen=True)
class Turn:
    topic: str
    steps: tuple[tuple[int, ...], ...]
    recall_step: bool


@st.composite
def turns(draw: st.DrawFn) -> Turn:
    sizes = st.sampled_from((20, 80, 300, 900))
    steps = draw(st.lists(st.lists(sizes, min_size=1, max_size=3), max_size=4))
    return Turn(draw(st.sampled_from(TOPICS)), tuple(tuple(s) for s in steps), draw(st.booleans()))


class Scripted:
    """A scripted function-calling LLM: replies in order, records what it is sent.

    With each request it records where the conversation's committed state stood: what
    may move the request's middle is a cut (the window's start, its summary, the clearing
    watermark; committed in the foreground or, for a ``Compact`` summary, in the
    background) and a delivery (the hook feeds the fact block, whose section sits after
    the note and changes when it is fed: the watermark).
    """

    def __init__(self, memory: DemotingMemory) -> None:
        self.replies: list[ChatMessage] = []
        self.calls: list[tuple[list[ChatMessage], tuple[Any, ...]]] = []
        self.memory = memory

    def respond(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        s = self.memory.demoter.state_of(self.memory.chat_store_key)
        moved = (s.window_start, s.summary, s.cleared, s.delivered, s.generation)
        self.calls.append((list(messages), moved))
        return self.replies.pop(0)

    def script(self, turn: Turn, n: int) -> None:
        for s, sizes in enumerate(turn.steps):
            blocks: list[Any] = [
                ToolCallBlock(
                    tool_call_id=f"call_{next(_serial):06d}",
                    tool_name="work",
                    tool_kwargs={"q": f"{turn.topic}:{n * 7 + s * 3 + j}:{size}"},
                )
                for j, size in enumerate(sizes)
            ]
            self.replies.append(ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks))
        if turn.recall_step:
            call = ToolCallBlock(
                tool_call_id=f"call_{next(_serial):06d}",
                tool_name="recall",
                tool_kwargs={"query": f"{turn.topic} value"},
            )
            self.replies.append(ChatMessage(role=MessageRole.ASSISTANT, blocks=[call]))
        done = TextBlock(text=f"Done with the {turn.topic} (turn {n}).")
        self.replies.append(ChatMessage(role=MessageRole.ASSISTANT, blocks=[done]))


def _blocks(messages: Sequence[Any]) -> list[str]:
    out = []
    for m in messages:
        content = m.get("content")
        blocks = [{"text": content}] if isinstance(content, str) else list(content or [])
        for b in blocks:
            b = {k: v for k, v in dict(b).items() if k != "cache_control"}
            out.append(json.dumps([m.get("role"), b], sort_keys=True, default=str))
    return out


_MARK = json.dumps(RECALL_PREFIX)[1:-1]
_ASKED = "<past>"  # the per-question block's section: it changes with the question, as recall


def check(
    calls: Sequence[tuple[list[ChatMessage], tuple[Any, ...]]],
    memory: DemotingMemory,
    limit: int,
    tools_tokens: int,
    overhang: bool,
) -> list[str]:
    broken: list[str] = []
    systems: set[str] = set()
    previous: tuple[list[str], tuple[tuple[Any, ...], int]] | None = None
    for n, (sent, moves) in enumerate(calls):
        where = f"call {n}"
        roles = [m.role for m in sent]
        first = next((i for i, r in enumerate(roles) if r != MessageRole.SYSTEM), None)
        if first is None or roles[first] != MessageRole.USER:
            broken.append(f"{where}: the first message after the system block is not a user's")
        if first is not None and MessageRole.SYSTEM in roles[first:]:
            broken.append(f"{where}: a system message after the conversation began")
        opened: set[str] = set()
        for i, m in enumerate(sent):
            answer = answered_call(m) if m.role == MessageRole.TOOL else None
            if m.role == MessageRole.TOOL and answer not in opened:
                broken.append(f"{where}: result [{i}] without its call just before")
            if m.role != MessageRole.TOOL:
                if opened and i and sent[i - 1].role == MessageRole.TOOL:
                    opened = set()
                opened = set(opened_calls(m)) if opened_calls(m) else opened
        size = sum(to_core(m, memory.demoter.describe).tokens for m in sent) + tools_tokens
        if size > limit and not overhang:
            broken.append(f"{where}: {size} tokens over the {limit}-token limit")
        try:
            dicts = llms_openai.to_openai_message_dicts(list(sent))
        except Exception as exc:
            broken.append(f"{where}: a provider converter raised {type(exc).__name__}: {exc}")
            continue
        systems.add("\n".join(text_of(m) for m in sent if m.role == MessageRole.SYSTEM))
        blocks = _blocks(dicts)
        # The state is read when the model is called, after the request was built: a
        # summary committed in the background between the two reads moves the request
        # without showing between this call's read and the last one's, but between the
        # last two. The request is checked against the previous one only when the state
        # stood still across both of their reads.
        # A window planned while another load of the conversation delivers (a Compact
        # summary's, in the background) is served at once, its cut not committed yet: a
        # change in what the request clears is that cut, seen in the request itself.
        cleared = sum("result cleared:" in text_of(m) for m in sent)
        steady = n < 2 or calls[n - 2][1] == moves
        if previous is not None and previous[1] == (moves, cleared) and steady:
            before = previous[0]
            mark = next((i for i, b in enumerate(before) if _MARK in b or _ASKED in b), None)
            same = mark is not None and mark < len(blocks) and blocks[mark] == before[mark]
            must = before if (mark is None or same) else before[:mark]
            if blocks[: len(must)] != must:
                broken.append(f"{where}: between cuts the request does not extend the previous")
        previous = (blocks, (moves, cleared))
    if len(systems) > 1:
        broken.append(f"{len(systems)} distinct system prompts in one thread")
    return broken


def _memory(tmp: Path, limit: int, window: str, key: str) -> tuple[DemotingMemory, SQLiteArchive]:
    archive = SQLiteArchive(tmp / f"archive-{next(_serial)}.db")
    clearing = ClearToolResults(trigger=limit // 2, keep=2, clear_at_least=limit // 8)
    summarizer = None
    if window == "compact":
        eviction: Any = Compact(compact_count=limit // 4)
        summarizer = TemplateSummarizer(max_summary_tokens=limit // 10)
        policy = SlidingWindow(unit="tokens", limit=limit, eviction=eviction, clearing=clearing)
    else:
        policy = SlidingWindow(unit="tokens", limit=limit, clearing=clearing)
    blocks = [
        StaticMemoryBlock(name="profile", static_content="The user runs a small shop."),
        FactExtractionMemoryBlock(name="facts", llm=fact_llm(), max_facts=1000),
        # Each retrieved passage shown by its head: a whole flushed batch is larger than
        # the blocks' budget at these limits, and a priority-0 block that does not fit
        # is left out, not truncated.
        VectorMemoryBlock(
            name="past",
            vector_store=TextVectorStore(),
            embed_model=WordEmbedding(),
            similarity_top_k=1,
            format_template=RichPromptTemplate("{{ text[:300] }}"),
        ),
    ]
    feed = MemoryBlocksHook(blocks, flush_tokens=limit // 10)
    demoter = Demoter(policy, FanOutHook(archive, feed), summarizer=summarizer, hook_wait=None)
    # A recall budget of a fifth of the limit, so recall has room to place hits (the
    # default share is small: it is priced for cached chats); the blocks get another.
    memory = DemotingMemory.from_defaults(
        demoter=demoter,
        chat_store_key=key,
        recall=archive,
        recall_budget_tokens=limit // 5,
        memory_blocks=blocks,
        chat_history_token_ratio=0.8,
    )
    return memory, archive


@contextlib.contextmanager
def collecting() -> Iterator[Collect]:
    """demote's instrumentation events while the block runs."""
    root = get_dispatcher()
    events = Collect()
    root.add_event_handler(events)
    try:
        yield events
    finally:
        root.event_handlers.remove(events)


@pytest.fixture
def collect() -> Iterator[Collect]:
    with collecting() as events:
        yield events


async def _ask(agent: FunctionAgent, question: str, memory: DemotingMemory) -> Any:
    return await agent.run(question, memory=memory, max_iterations=50)


def run_agent(
    tmp: Path,
    collect: Collect,
    plan: Sequence[Turn],
    limit: int,
    window: str,
    sent: list[list[ChatMessage]] | None = None,
) -> list[str]:
    sent = [] if sent is None else sent
    memory, archive = _memory(tmp, limit, window, f"agent-{next(_serial)}")
    scripted = Scripted(memory)
    llm = MockFunctionCallingLLM(response_generator=scripted.respond, is_chat_model=True)
    tools = [FunctionTool.from_defaults(work), recall_tool(archive, conversation_id=memory)]
    agent = FunctionAgent(tools=tools, llm=DemotingLLM(llm), system_prompt=SYSTEM)
    for n, turn in enumerate(plan):
        scripted.script(turn, n)
        question = f"Turn {n}: what about the {turn.topic}? Last time it was ZX-{n:02d}."
        asyncio.run(_ask(agent, question, memory))
        assert memory.demoter.drain(10)
    counter = memory.demoter.policy.resolved_counter()
    tools_tokens = sum(
        counter(json.dumps(t.metadata.to_openai_tool(), default=str, separators=(",", ":")))
        for t in tools
    )
    bound = limit + 2 * (limit // 4) if window == "compact" else limit
    overhang = bool(collect.kinds("overhang"))
    archive.close()
    sent.extend(m for m, _ in scripted.calls)
    return check(scripted.calls, memory, bound, tools_tokens, overhang)


@pytest.mark.slow
@ORACLE
@given(
    plan=st.lists(turns(), min_size=2, max_size=6),
    limit=st.sampled_from((1500, 3000)),
    window=st.sampled_from(("default", "compact")),
)
def test_every_agent_request_with_every_feature_on(
    tmp_path_factory: pytest.TempPathFactory, plan: list[Turn], limit: int, window: str
) -> None:
    # Its own event handler, not the fixture: Hypothesis prints a failing call's arguments.
    with collecting() as collect:
        broken = run_agent(tmp_path_factory.mktemp("li-oracle"), collect, plan, limit, window)
    assert not broken, "\n".join(broken[:10])


def test_a_long_agent_thread_with_recall_cuts_and_stays_valid(
    tmp_path: Path, collect: Collect
) -> None:
    plan = [
        Turn(TOPICS[n % 6], ((300, 80), (900,)) if n % 3 else ((20,),), n % 4 == 1)
        for n in range(12)
    ]
    sent: list[list[ChatMessage]] = []
    broken = run_agent(tmp_path, collect, plan, 1500, "default", sent)
    texts = ["\n".join(text_of(m) for m in request) for request in sent]
    for section in ("<profile>", "<facts>", "<past>"):
        assert any(section in t for t in texts), f"the memory blocks were sent: {section}"
    assert collect.kinds("demoted"), "the window was cut"
    assert collect.kinds("recalled"), "recall placed something"
    assert not broken, "\n".join(broken[:10])


@ORACLE
@given(
    messages=st.lists(st.sampled_from(TOPICS), min_size=6, max_size=30),
    limit=st.sampled_from((300, 800)),
)
def test_every_chat_request_with_a_system_prompt(
    tmp_path_factory: pytest.TempPathFactory, messages: list[str], limit: int
) -> None:
    with collecting() as collect:
        _chat(tmp_path_factory.mktemp("li-chat"), collect, messages, limit)


def _chat(tmp: Path, collect: Collect, messages: list[str], limit: int) -> None:
    memory, archive = _memory(tmp, limit, "default", "chat")
    scripted = Scripted(memory)
    llm = MockFunctionCallingLLM(response_generator=scripted.respond, is_chat_model=True)
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=SYSTEM)
    for n, topic in enumerate(messages):
        reply = TextBlock(text=f"Noted about the {topic}: ZX-{n:03d} and more words here.")
        scripted.replies.append(ChatMessage(role=MessageRole.ASSISTANT, blocks=[reply]))
        engine.chat(f"Message {n} on the {topic}: code ZX-{n:03d}, please remember it.")
    archive.close()
    broken = check(scripted.calls, memory, limit, 0, bool(collect.kinds("overhang")))
    assert not broken, "\n".join(broken[:10])
    sent = [m for m, _ in scripted.calls]
    assert all(text_of(m[0]) == SYSTEM for m in sent), "the engine's prompt leads every request"
    assert all("<profile>" in text_of(m[1]) for m in sent), "the static block right after it"
