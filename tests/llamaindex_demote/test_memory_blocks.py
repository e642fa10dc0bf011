"""LlamaIndex memory blocks under ``DemotingMemory``: fed once, placed by pace, within the limit.

Real llama-index-core pieces: ``StaticMemoryBlock``, ``FactExtractionMemoryBlock`` over
``MockFunctionCallingLLM``, ``VectorMemoryBlock`` over a vector store that stores text
(:class:`~tests.llamaindex_demote.blocks_support.TextVectorStore`) with a hashed-word
embedding, and a block of our own (``Ledger``), through ``SimpleChatEngine``.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM
from llama_index.core.memory.memory import BaseMemoryBlock, InsertMethod
from llama_index.core.memory.memory_blocks import (
    FactExtractionMemoryBlock,
    StaticMemoryBlock,
    VectorMemoryBlock,
)
from llama_index.core.storage.chat_store.sql import SQLAlchemyChatStore

from demote import Demoter, SlidingWindow, SQLiteStateStore
from demote.errors import ConfigError
from demote.hooks.simple import FanOutHook, NoopHook
from llamaindex_demote import DemotingMemory, MemoryBlocksHook
from llamaindex_demote.blocks import pieces
from llamaindex_demote.messages import text_of, to_core
from tests.llamaindex_demote.blocks_support import (
    Ledger,
    TextVectorStore,
    WordEmbedding,
    fact_llm,
)

SYSTEM = "Be terse."
PROFILE = "The user is Ana, a hiker."


def make_blocks(store: TextVectorStore | None = None) -> list[Any]:
    return [
        StaticMemoryBlock(name="profile", static_content=PROFILE),
        FactExtractionMemoryBlock(name="facts", llm=fact_llm(), max_facts=1000),
        VectorMemoryBlock(
            name="past",
            vector_store=store if store is not None else TextVectorStore(),
            embed_model=WordEmbedding(),
            similarity_top_k=1,
        ),
        Ledger(name="ledger", fed={}),
    ]


def chat(memory: DemotingMemory, n: int, start: int = 0) -> SimpleChatEngine:
    engine = SimpleChatEngine.from_defaults(
        llm=MockLLM(max_tokens=6), memory=memory, system_prompt=SYSTEM
    )
    for i in range(start, start + n):
        engine.chat(f"message {i}: the tent code is T{i:03d}")
    return engine


def demoted(memory: DemotingMemory) -> list[ChatMessage]:
    memory.demoter.drain(10)
    state = memory.demoter.state_of(memory.chat_store_key)
    return memory.get_all()[: state.delivered]


def ledger_lines(messages: list[ChatMessage]) -> list[str]:
    return [f"{m.role.value}: {text_of(m)}" for m in messages]


def memory_with(blocks: list[Any], limit: int = 1200, **options: Any) -> DemotingMemory:
    return DemotingMemory.from_defaults(
        token_limit=limit, memory_blocks=blocks, session_id="ana", **options
    )


def sections(messages: list[ChatMessage]) -> list[tuple[int, str]]:
    """``(position, block names)`` of each memory-block message in a request."""
    out = []
    for i, m in enumerate(messages):
        text = text_of(m)
        if text.startswith("\n<memory>") or text.startswith("<memory>"):
            names = [n for n in ("profile", "facts", "past", "ledger") if f"<{n}>" in text]
            out.append((i, ",".join(names)))
    return out


# -- fed once, in order -------------------------------------------------------------------


def test_every_demoted_message_reaches_every_block_once_in_order() -> None:
    store = TextVectorStore()
    blocks = make_blocks(store)
    memory = memory_with(blocks)
    chat(memory, 60)
    gone = demoted(memory)
    assert len(gone) >= 40, "the window was cut several times"
    assert blocks[3].fed["ana"] == ledger_lines(gone)
    users = [text_of(m) for m in gone if m.role == MessageRole.USER]
    assert blocks[1].facts == users, "one fact per demoted user message, in order"
    nodes = "\n".join(store.texts("ana"))
    for m in gone:
        assert nodes.count(f">{text_of(m)}<") == 1 if m.role == MessageRole.USER else True
    assert len(store.texts("ana")) > 1, "fed in Memory's flush-sized pieces, not one node"
    assert memory.get_all()[len(gone)] in memory.get(), "what is not demoted is in the window"


def test_the_blocks_are_handed_copies_never_the_chat_stores_messages() -> None:
    blocks = make_blocks()
    memory = memory_with(blocks)
    chat(memory, 40)
    demoted(memory)
    assert all("session_id" not in m.additional_kwargs for m in memory.get_all())


def test_pieces_close_at_a_turn_once_they_hold_the_flush_size() -> None:
    from demote.records import DemotedMessage

    roles = ["user", "assistant", "user", "assistant", "tool", "assistant", "user"]
    batch = [DemotedMessage(r, "x" * 40, i, f"k{i}") for i, r in enumerate(roles)]  # type: ignore[arg-type]
    cut = pieces(batch, 15, lambda t: len(t) // 4)
    assert [[m.index for m in p] for p in cut] == [[0, 1], [2, 3, 4, 5], [6]]
    assert pieces(batch, None, len) == [batch]


# -- where the content goes ---------------------------------------------------------------


def test_each_block_is_placed_by_when_it_changes() -> None:
    memory = memory_with(make_blocks(), limit=2400, chat_history_token_ratio=0.5)
    engine = chat(memory, 60)
    sent = memory.get("what was the tent code of message 3?")
    places = dict((names, i) for i, names in sections(sent))
    assert places["profile"] == 0, "the static block leads (the engine's prompt goes before)"
    assert places["facts"] == 1, "the facts follow it (no note in this window)"
    assert sections(sent)[-1] == (len(sent) - 1, "past,ledger"), "per question: at the end"
    assert text_of(sent[places["facts"] + 1]) == text_of(
        memory.get_all()[memory.demoter.state_of("ana").window_start]
    )
    # A chat engine sends the system prompt, then the memory's messages.
    assert engine.chat_history


def test_between_cuts_the_stable_blocks_stay_byte_identical() -> None:
    memory = memory_with(make_blocks(), limit=2400, chat_history_token_ratio=0.5)
    chat(memory, 50)
    before = memory.get("first question about the tent")
    start = memory.demoter.state_of("ana").window_start
    memory.put(ChatMessage(role=MessageRole.USER, content="one more"))
    memory.put(ChatMessage(role=MessageRole.ASSISTANT, content="ok"))
    after = memory.get("second question about the hike")
    assert memory.demoter.state_of("ana").window_start == start, "no cut in between"
    assert after[: len(before) - 1] == before[:-1], "only the per-question message changed"


def test_the_per_question_blocks_are_read_once_per_question() -> None:
    store = TextVectorStore()
    memory = memory_with(make_blocks(store), limit=2400)
    chat(memory, 50)
    first = memory.get("tent code of message 2?")
    store.down = True  # a second read of the same question would fail
    again = memory.get("tent code of message 2?")
    assert again[-1] is first[-1]


def test_with_recall_the_blocks_follow_the_recall(tmp_path: Path) -> None:
    from demote import SQLiteArchive

    archive = SQLiteArchive(tmp_path / "a.db")
    blocks = make_blocks()
    memory = DemotingMemory.from_defaults(
        token_limit=2400,
        hook=archive,
        recall=archive,
        recall_budget_tokens=200,
        memory_blocks=blocks,
        session_id="ana",
    )
    chat(memory, 60)
    memory.demoter.drain(10)
    memory.put(ChatMessage(role=MessageRole.USER, content="what was the tent code T003?"))
    sent = memory.get()
    recall = next(i for i, m in enumerate(sent) if text_of(m).startswith("Recalled from"))
    assert text_of(sent[recall - 1]) == "what was the tent code T003?"
    assert sections(sent)[-1][0] == recall + 1
    assert archive.count("ana") == len(blocks[3].fed["ana"]), "the archive and blocks both fed"
    archive.close()


# -- within the limit ---------------------------------------------------------------------


def test_the_whole_request_stays_within_the_limit() -> None:
    limit = 900
    memory = memory_with(make_blocks(), limit=limit)
    engine = chat(memory, 80)
    prefix = len(memory.tokenizer_fn(SYSTEM))
    sent = memory.get("which tent?", initial_token_count=prefix)
    size = sum(to_core(m, memory.demoter.describe).tokens for m in sent) + prefix + 4
    assert size <= limit
    blocks_size = sum(to_core(sent[i], memory.demoter.describe).tokens for i, _ in sections(sent))
    assert 0 < blocks_size <= int(limit * 0.3)
    assert engine is not None


def test_priorities_truncate_as_memory_does_and_the_limit_holds_for_priority_zero() -> None:
    class Clip(StaticMemoryBlock):
        async def atruncate(self, content: Any, tokens_to_truncate: int) -> Any:
            return [type(content[0])(text=content[0].text[:40])]

    big = "word " * 400
    blocks = [
        StaticMemoryBlock(name="keep", static_content="short and kept"),
        Clip(name="clip", static_content=big, priority=1),
        StaticMemoryBlock(name="drop", static_content=big * 2, priority=2),
        StaticMemoryBlock(name="huge", static_content=big * 3),  # priority 0, over alone
    ]
    memory = memory_with(blocks, limit=3000)  # 900 tokens for the blocks
    memory.put(ChatMessage(role=MessageRole.USER, content="hello"))
    text = text_of(memory.get()[0])
    assert "short and kept" in text
    assert "<clip>" in text and text.count("word") < 20, "priority 1: truncated first"
    assert "<drop>" not in text, "priority 2: left out"
    assert "<huge>" not in text, "priority 0 over the budget alone: left out, the limit holds"


# -- erase, failures, restarts ------------------------------------------------------------


def test_erase_reaches_every_block() -> None:
    store = TextVectorStore()
    blocks = make_blocks(store)
    other = memory_with(make_blocks(store), limit=1200)  # another conversation, same store
    other = DemotingMemory.from_defaults(
        token_limit=1200, memory_blocks=make_blocks(store), session_id="bo"
    )
    chat(other, 40)
    memory = memory_with(blocks)
    chat(memory, 40)
    demoted(memory), demoted(other)
    report = memory.erase()
    kinds = {t.tier.split(".")[-1]: (t.status, t.removed) for t in report.tiers}
    assert kinds["StaticBlockTier"] == ("erased", 0)
    assert kinds["FactsBlockTier"][0] == "erased" and kinds["FactsBlockTier"][1] > 0
    assert kinds["VectorBlockTier"][0] == "erased" and kinds["VectorBlockTier"][1] > 0
    assert kinds["OwnBlockTier"][0] == "erased"
    assert report.complete
    assert blocks[1].facts == [] and "ana" not in blocks[3].fed
    assert store.texts("ana") == [] and store.texts("bo"), "only this conversation's nodes"


def test_a_block_that_cannot_erase_is_reported_unsupported() -> None:
    class Mute(BaseMemoryBlock[str]):
        async def _aget(self, messages: Any = None, **kwargs: Any) -> str:
            return ""

        async def _aput(self, messages: list[ChatMessage]) -> None:
            pass

    memory = memory_with([Mute(name="mute")])
    chat(memory, 30)
    report = memory.erase()
    assert [(t.tier, t.status) for t in report.tiers] == [
        ("MemoryBlocksHook[0].Mute", "unsupported")
    ]


def test_a_failing_block_keeps_the_batch_pending_and_the_others_are_not_fed_twice() -> None:
    blocks = make_blocks()
    memory = memory_with(blocks)
    blocks[3].failing = True
    chat(memory, 50)
    memory.demoter.drain(10)
    assert memory.demoter.state_of("ana").delivered == 0, "pending while a block fails"
    assert blocks[1].facts, "the others took it"
    facts = list(blocks[1].facts)
    blocks[3].failing = False
    memory.demoter._retry.succeeded("ana")  # no waiting out the backoff here
    memory.get()
    gone = demoted(memory)
    assert blocks[3].fed["ana"] == ledger_lines(gone)
    users = [text_of(m) for m in gone if m.role == MessageRole.USER]
    assert blocks[1].facts == users and blocks[1].facts[: len(facts)] == facts


def test_a_block_that_fails_to_read_is_left_out_and_reported() -> None:
    store = TextVectorStore()
    memory = memory_with(make_blocks(store), limit=2400)
    chat(memory, 50)
    seen: list[Any] = []
    memory.demoter.observe(seen.append)
    store.down = True
    sent = memory.get("a new question about the tent")
    assert "<past>" not in "".join(text_of(m) for m in sent)
    assert any("<profile>" in text_of(m) for m in sent), "the others are still sent"
    memory.demoter.drain(5)
    import time

    deadline = time.monotonic() + 5
    while not any(e.kind == "degraded" for e in seen) and time.monotonic() < deadline:
        time.sleep(0.01)
    degraded = [e for e in seen if e.kind == "degraded"]
    assert degraded and degraded[0].source == "recall" and "Down" in (degraded[0].error or "")


def test_a_restart_on_a_durable_state_feeds_nothing_twice(tmp_path: Path) -> None:
    store = TextVectorStore()
    blocks = make_blocks(store)
    state = tmp_path / "state.db"

    def open_memory(chat_store: Any = None) -> DemotingMemory:
        return DemotingMemory.from_defaults(
            token_limit=1200,
            memory_blocks=blocks,
            state=SQLiteStateStore(state),
            session_id="ana",
            chat_store=chat_store,
        )

    first = open_memory()
    chat(first, 40)
    first.demoter.drain(10)
    first.demoter.close()
    second = open_memory(first.chat_store)  # a new engine on the same state and history
    chat(second, 40, start=40)
    gone = demoted(second)
    assert blocks[3].fed["ana"] == ledger_lines(gone)
    assert blocks[1].facts == [text_of(m) for m in gone if m.role == MessageRole.USER]


def test_concurrent_reads_feed_each_message_once() -> None:
    blocks = make_blocks()
    memory = memory_with(blocks, limit=500)

    async def run() -> None:
        for i in range(60):
            await memory.aput(ChatMessage(role=MessageRole.USER, content=f"question {i}"))
            await memory.aput(ChatMessage(role=MessageRole.ASSISTANT, content=f"answer {i}"))
            await asyncio.gather(*(memory.aget() for _ in range(4)))
        assert await memory.demoter.adrain(30), "deliveries this loop started end on it"

    threads = [threading.Thread(target=lambda: [memory.get() for _ in range(20)]) for _ in range(3)]
    for t in threads:
        t.start()
    asyncio.run(run())
    for t in threads:
        t.join(30)
    gone = demoted(memory)
    assert len(gone) >= 20
    assert blocks[3].fed["ana"] == ledger_lines(gone)


# -- the options of Memory.from_defaults --------------------------------------------------


def test_insert_method_user_is_taken_and_system_is_refused_saying_why() -> None:
    memory_with(make_blocks(), insert_method=InsertMethod.USER)
    with pytest.raises(ConfigError, match="never changes the system block"):
        memory_with(make_blocks(), insert_method="system")
    with pytest.raises(ConfigError, match="insert_method"):
        memory_with(make_blocks(), insert_method="middle")


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("image_token_size_estimate", 256, "as the providers bill them"),
        ("table_name", "t", "BaseChatStore"),
        ("async_database_uri", "sqlite+aiosqlite://", "SQLiteStateStore"),
        ("no_such_option", 1, "unexpected options"),
    ],
)
def test_memory_options_demote_does_not_take_say_what_to_use(
    option: str, value: Any, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        memory_with(make_blocks(), **{option: value})


def test_memorys_sql_store_is_refused_naming_what_to_use() -> None:
    with pytest.raises(ConfigError, match="any BaseChatStore"):
        memory_with(make_blocks(), chat_store=SQLAlchemyChatStore(table_name="t"))


def test_token_flush_size_sizes_the_pieces_the_blocks_are_fed() -> None:
    store = TextVectorStore()
    small = memory_with(make_blocks(store), token_flush_size=40)
    chat(small, 40)
    demoted(small)
    other = TextVectorStore()
    large = memory_with(make_blocks(other), token_flush_size=400)
    chat(large, 40)
    demoted(large)
    assert len(store.texts()) > 2 * len(other.texts()) > 0
    with pytest.raises(ConfigError, match="give memory_blocks="):
        DemotingMemory.from_defaults(token_limit=500, hook=NoopHook(), token_flush_size=40)


def test_tokenizer_fn_counts_the_window() -> None:
    words = DemotingMemory.from_defaults(
        token_limit=400, hook=NoopHook(), tokenizer_fn=lambda t: t.split()
    )
    assert words.demoter.policy.resolved_counter()("a b c") == 3
    with pytest.raises(ConfigError, match="counter="):
        DemotingMemory.from_defaults(
            policy=SlidingWindow.last_tokens(400), tokenizer_fn=lambda t: t.split()
        )


def test_chat_history_token_ratio_is_the_windows_share() -> None:
    memory = memory_with(make_blocks(), limit=1000, chat_history_token_ratio=0.6)
    assert memory._p.reserve() == 400
    with pytest.raises(ConfigError, match="between 0 and 1"):
        memory_with(make_blocks(), chat_history_token_ratio=1.0)
    with pytest.raises(ConfigError, match="counted in turns"):
        DemotingMemory.from_defaults(
            policy=SlidingWindow.last_turns(4),
            memory_blocks=make_blocks(),
            chat_history_token_ratio=0.5,
        )


def test_blocks_are_checked_as_memory_checks_them() -> None:
    with pytest.raises(ConfigError, match="twice"):
        memory_with([StaticMemoryBlock(name="a", static_content="x")] * 2)
    with pytest.raises(ConfigError, match=r"memory_blocks\[0\]"):
        memory_with(["not a block"])
    with pytest.raises(ConfigError, match="no memory block is named"):
        memory_with(make_blocks(), block_changes={"nope": "never"})


def test_a_shared_demoter_must_feed_the_blocks() -> None:
    blocks = make_blocks()
    with pytest.raises(ConfigError, match="MemoryBlocksHook"):
        DemotingMemory.from_defaults(
            demoter=Demoter(SlidingWindow.last_tokens(1200), NoopHook()), memory_blocks=blocks
        )
    demoter = Demoter(
        SlidingWindow.last_tokens(1200), FanOutHook(NoopHook(), MemoryBlocksHook(blocks))
    )
    memory = DemotingMemory.from_defaults(demoter=demoter, memory_blocks=blocks, session_id="ana")
    chat(memory, 40)
    assert blocks[3].fed["ana"] == ledger_lines(demoted(memory))


def test_a_block_of_your_own_can_be_declared_stable() -> None:
    blocks = [Ledger(name="ledger", fed={})]
    memory = memory_with(blocks, block_changes={"ledger": "when_fed"})
    chat(memory, 40)
    sent = memory.get()
    assert sections(sent)[0] == (0, "ledger"), "placed with the stable blocks, not at the end"


def test_saved_and_restored_the_memory_keeps_its_blocks() -> None:
    blocks = make_blocks()
    memory = memory_with(
        blocks, chat_history_token_ratio=0.6, memory_blocks_template="{{ memory_blocks }}"
    )
    chat(memory, 30)
    back = DemotingMemory.from_dict(memory.to_dict())
    assert back._p.blocks is not None
    assert back._p.blocks.blocks == memory._p.blocks.blocks  # type: ignore[union-attr]
    assert back._p.reserve() == memory._p.reserve()
    again = pickle.loads(pickle.dumps(memory))
    assert again.get() == memory.get()
