"""DemotingMemory on its own: construction, reads, writes, recall placement, capture."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.llms import MockLLM
from llama_index.core.memory.types import BaseMemory
from llama_index.core.storage.chat_store import SimpleChatStore

from demote import (
    CapturedTurn,
    ConfigError,
    ConversationIdError,
    Demoter,
    NoopHook,
    Recalled,
    SlidingWindow,
)
from demote.archive.sqlite import SQLiteArchive
from demote.records import fingerprint, make_key
from demote.window.tokens import MESSAGE_OVERHEAD
from llamaindex_demote import RECALL_PREFIX, DemotingMemory, from_core, to_core
from tests.conformance.contract import RecordingHook
from tests.llamaindex_demote.support import to_pairs


def chat(n: int, tag: str = "t") -> list[ChatMessage]:
    out = []
    for i in range(n):
        out += [
            from_core("user", f"{tag} question {i}"),
            from_core("assistant", f"{tag} answer {i}"),
        ]
    return out


class ListRecall:
    """A recall that returns fixed hits and records its queries (sync only)."""

    def __init__(self, hits: list[Recalled]) -> None:
        self.hits = hits
        self.queries: list[tuple[str, str, int]] = []

    def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
        self.queries.append((conversation_id, query, k))
        return self.hits[:k]


class AsyncListRecall(ListRecall):
    def __init__(self, hits: list[Recalled]) -> None:
        super().__init__(hits)
        self.async_queries = 0

    async def asearch(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
        self.async_queries += 1
        return self.hits[:k]


class Captured:
    def __init__(self) -> None:
        self.turns: list[CapturedTurn] = []

    def capture(self, turn: CapturedTurn) -> None:
        self.turns.append(turn)


class AsyncOnlyStore(SimpleChatStore):
    """A chat store whose sync methods fail: proves the async path never uses them."""

    def get_messages(self, key: str) -> list[ChatMessage]:
        raise AssertionError("sync get_messages on the async path")

    def add_message(self, key: str, message: ChatMessage, idx: int | None = None) -> None:
        raise AssertionError("sync add_message on the async path")

    async def aget_messages(self, key: str) -> list[ChatMessage]:
        return self.store.get(key, [])

    async def async_add_message(self, key: str, message: ChatMessage) -> None:
        self.store.setdefault(key, []).append(message)

    async def aset_messages(self, key: str, messages: list[ChatMessage]) -> None:
        self.store[key] = messages

    async def adelete_messages(self, key: str) -> list[ChatMessage] | None:
        return self.store.pop(key, None)


# -- construction --------------------------------------------------------------------------


def test_is_a_llamaindex_memory() -> None:
    memory = DemotingMemory.from_defaults(hook=NoopHook(), policy=SlidingWindow.last_messages(4))
    assert isinstance(memory, BaseMemory)
    assert memory.class_name() == "DemotingMemory"
    assert memory.chat_store_key == "chat_history"
    assert isinstance(memory.chat_store, SimpleChatStore)


def test_shared_demoter_serves_several_memories() -> None:
    demoter = Demoter(SlidingWindow.last_messages(2))
    one = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="one")
    two = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="two")
    assert one.demoter is two.demoter is demoter
    one.put_messages(chat(3, "one"))
    two.put_messages(chat(1, "two"))
    assert to_pairs(one.get()) == [("user", "one question 2"), ("assistant", "one answer 2")]
    assert len(two.get()) == 2
    assert demoter.state_of("one").window_start == 4
    assert demoter.state_of("two").window_start == 0


def test_window_sizing_options() -> None:
    by_tokens = DemotingMemory.from_defaults(hook=NoopHook(), token_limit=1000)
    assert by_tokens.demoter.policy == SlidingWindow.last_tokens(1000)
    llm = MockLLM()
    by_llm = DemotingMemory.from_defaults(hook=NoopHook(), llm=llm)
    assert by_llm.demoter.policy.limit == int(llm.metadata.context_window * 0.75)
    hook = RecordingHook()
    private = DemotingMemory.from_defaults(policy=SlidingWindow.last_turns(2), hook=hook)
    assert private.demoter.hook is hook


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "size the window"),
        (
            {
                "demoter": Demoter(SlidingWindow.last_turns(1)),
                "policy": SlidingWindow.last_turns(1),
            },
            "not both",
        ),
        ({"demoter": "nope"}, "expected a Demoter"),
        ({"policy": SlidingWindow.last_turns(1), "token_limt": 5}, "unexpected options"),
        ({"policy": SlidingWindow.last_turns(1), "hook": NoopHook(), "recall_k": 0}, "recall_k"),
        ({"policy": SlidingWindow.last_turns(1), "hook": NoopHook(), "recall": object()}, "recall"),
        (
            {"policy": SlidingWindow.last_turns(1), "hook": NoopHook(), "capture": object()},
            "capture",
        ),
    ],
)
def test_bad_options(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DemotingMemory.from_defaults(**kwargs)


@pytest.mark.parametrize("bad", ["", "a\x00b"])
def test_bad_conversation_id(bad: str) -> None:
    with pytest.raises(ConversationIdError):
        DemotingMemory.from_defaults(
            hook=NoopHook(), policy=SlidingWindow.last_turns(1), chat_store_key=bad
        )


def test_chat_history_is_stored() -> None:
    memory = DemotingMemory.from_defaults(
        hook=NoopHook(), policy=SlidingWindow.last_messages(2), chat_history=chat(3)
    )
    assert len(memory.get_all()) == 6
    assert len(memory.get()) == 2


# -- reads and writes ----------------------------------------------------------------------


def test_pinned_then_window() -> None:
    hook = RecordingHook()
    memory = DemotingMemory.from_defaults(policy=SlidingWindow.last_messages(4), hook=hook)
    memory.put(from_core("system", "be brief"))
    memory.put_messages(chat(5))
    got = to_pairs(memory.get())
    assert got[0] == ("system", "be brief")
    assert got[1:] == to_pairs(chat(5)[-4:])
    assert [m.index for b in hook.batches for m in b.messages] == list(range(1, 7))
    assert memory.get_all() is not memory.chat_store.get_messages("chat_history")


def test_set_rewrite_does_not_redeliver(tmp_path: Any) -> None:
    with SQLiteArchive(tmp_path / "a.db") as archive:
        memory = DemotingMemory.from_defaults(policy=SlidingWindow.last_messages(4), hook=archive)
        memory.put_messages(chat(6))
        memory.get()
        assert archive.count("chat_history") == 8
        history = memory.get_all()
        # Rewrite: drop the last turn and add a different one (the engine re-syncs).
        memory.set([*history[:-2], *chat(1, "new")])
        seen: list[int] = []
        original = archive.deliver

        def spy(batch: Any) -> None:
            seen.extend(m.index for m in batch.messages)
            original(batch)

        archive.deliver = spy  # type: ignore[method-assign]
        got = to_pairs(memory.get())
        assert got == to_pairs([*history[8:10], *chat(1, "new")])
        assert seen == []  # the archive already holds 0..7 (has_keys)
        assert archive.count("chat_history") == 8


def test_reset_clears_store_and_state() -> None:
    demoter = Demoter(SlidingWindow.last_messages(2))
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="r")
    memory.put_messages(chat(4))
    memory.get()
    assert demoter.state_of("r").window_start == 6
    memory.reset()
    assert memory.get_all() == [] and memory.get() == []
    assert demoter.state_of("r").window_start == 0
    asyncio.run(memory.aput_messages(chat(2)))
    asyncio.run(memory.aget())
    asyncio.run(memory.areset())
    assert asyncio.run(memory.aget_all()) == []
    assert demoter.state_of("r").window_start == 0


def test_async_path_uses_only_async_store_methods() -> None:
    recall = AsyncListRecall([Recalled("user", "old fact", 0, "k0")])
    memory = DemotingMemory.from_defaults(
        hook=NoopHook(),
        policy=SlidingWindow.last_messages(2),
        chat_store=AsyncOnlyStore(),
        recall=recall,
        capture=Captured(),
    )

    async def run() -> list[ChatMessage]:
        await memory.aput(from_core("user", "first"))
        await memory.aput_messages([from_core("assistant", "ok"), from_core("user", "second")])
        await memory.aset(await memory.aget_all())
        return await memory.aget()

    got = asyncio.run(run())
    assert [m.role for m in got] == [MessageRole.USER, MessageRole.USER]  # question, recall
    assert (got[1].content or "").startswith(RECALL_PREFIX)
    assert recall.async_queries == 1 and recall.queries == []


def test_initial_token_count_counts_toward_the_limit() -> None:
    # A chat engine's prefix (SimpleChatEngine passes its system prompt's tokens) is sent
    # with the window: in a token window the window leaves room for it.
    limit = 60

    def sent(prefix: int) -> tuple[list[ChatMessage], int]:
        memory = DemotingMemory.from_defaults(
            hook=NoopHook(), policy=SlidingWindow.last_tokens(limit)
        )
        memory.put_messages(chat(10))
        got = memory.get(initial_token_count=prefix)
        return got, sum(to_core(m, memory.demoter.describe).tokens for m in got)

    alone, alone_tokens = sent(0)
    prefixed, prefixed_tokens = sent(30)
    assert alone_tokens <= limit
    assert len(prefixed) < len(alone)
    assert prefixed_tokens + 30 + MESSAGE_OVERHEAD <= limit  # the prefix as one more message
    memory = DemotingMemory.from_defaults(hook=NoopHook(), policy=SlidingWindow.last_tokens(60))
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="initial_token_count"):
            memory.get(initial_token_count=bad)  # type: ignore[arg-type]


def test_tokenizer_fn_counts_with_the_policy_counter() -> None:
    memory = DemotingMemory.from_defaults(
        hook=NoopHook(),
        policy=SlidingWindow.last_tokens(100, counter=lambda text: len(text.split())),
    )
    assert len(memory.tokenizer_fn("one two three")) == 3
    approx = DemotingMemory.from_defaults(hook=NoopHook(), token_limit=100)
    assert len(approx.tokenizer_fn("x" * 40)) == 10


# -- recall placement ----------------------------------------------------------------------


def _recall_memory(hits: list[Recalled], k: int = 5) -> tuple[DemotingMemory, ListRecall]:
    recall = ListRecall(hits)
    memory = DemotingMemory.from_defaults(
        hook=NoopHook(),
        policy=SlidingWindow.last_messages(4),
        recall=recall,
        recall_k=k,
        chat_store_key="c",
    )
    memory.put(from_core("system", "pinned"))
    memory.put_messages(chat(5))
    return memory, recall


OLD = Recalled("user", "t question 0", 1, "k1", 3.0)


def test_recall_without_input_uses_newest_user_message() -> None:
    memory, recall = _recall_memory([OLD])
    memory.put(from_core("user", "what did I ask first?"))
    got = memory.get()
    assert recall.queries == [("c", "what did I ask first?", 10)]
    # A user message right after the question: no system message after the history began.
    assert to_pairs(got)[-2:] == [
        ("user", "what did I ask first?"),
        ("user", RECALL_PREFIX + "- user: t question 0"),
    ]
    assert to_pairs(got)[0] == ("system", "pinned")
    # Never written back: the store holds only what was put.
    assert all(RECALL_PREFIX not in (m.content or "") for m in memory.get_all())


def test_recall_with_input_not_stored_goes_last() -> None:
    memory, recall = _recall_memory([OLD])
    got = to_pairs(memory.get(input="what did I ask first?"))
    assert recall.queries[-1][1] == "what did I ask first?"
    assert got[-1] == ("user", RECALL_PREFIX + "- user: t question 0")
    assert got[-2] == ("assistant", "t answer 4")


def test_recall_with_input_already_stored_goes_right_after_it() -> None:
    memory, _ = _recall_memory([OLD])
    memory.put(from_core("user", "what did I ask first?"))
    got = to_pairs(memory.get(input="what did I ask first?"))
    assert got[-1][1].startswith(RECALL_PREFIX) and got[-2] == ("user", "what did I ask first?")


def test_recall_can_be_a_system_message_when_asked() -> None:
    recall = ListRecall([OLD])
    memory = DemotingMemory.from_defaults(
        hook=NoopHook(), policy=SlidingWindow.last_messages(4), recall=recall, recall_role="system"
    )
    memory.put_messages(chat(5))
    memory.put(from_core("user", "what did I ask first?"))
    got = to_pairs(memory.get())
    assert got[-1] == ("system", RECALL_PREFIX + "- user: t question 0")
    with pytest.raises(ConfigError, match="recall_role"):
        DemotingMemory.from_defaults(
            hook=NoopHook(),
            policy=SlidingWindow.last_messages(4),
            recall=recall,
            recall_role="tool",  # type: ignore[arg-type]
        )


def test_recall_skips_what_the_window_shows_and_keeps_k() -> None:
    in_window = Recalled("user", "t question 4", 9, "k9", 9.0)
    pinned = Recalled("system", "pinned", 0, "k0", 8.0)
    elsewhere_dup = Recalled("assistant", "t answer 4", -1, "m", 7.0)
    extra = [Recalled("assistant", f"t answer {i}", 2 * i + 2, f"a{i}", 1.0) for i in range(3)]
    # The memory asks for 2 * k hits, drops those already in view, keeps k.
    memory, recall = _recall_memory([in_window, pinned, OLD, *extra], k=2)
    got = to_pairs(memory.get())
    assert recall.queries[-1][2] == 4
    recalled = [text for role, text in got if text.startswith(RECALL_PREFIX)]
    assert recalled == [RECALL_PREFIX + "- user: t question 0\n- assistant: t answer 0"]
    # A hit without a position (mem0) is dropped when its text is on screen.
    memory, _ = _recall_memory([elsewhere_dup, OLD], k=1)
    recalled = [text for role, text in to_pairs(memory.get()) if text.startswith(RECALL_PREFIX)]
    assert recalled == [RECALL_PREFIX + "- user: t question 0"]


def test_no_recall_without_a_user_message() -> None:
    recall = ListRecall([OLD])
    memory = DemotingMemory.from_defaults(
        hook=NoopHook(), policy=SlidingWindow.last_messages(4), recall=recall
    )
    memory.put(from_core("system", "pinned"))
    assert to_pairs(memory.get()) == [("system", "pinned")]
    assert recall.queries == []


# -- capture -------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_capture_each_new_user_message(flavour: str) -> None:
    captured = Captured()
    memory = DemotingMemory.from_defaults(
        hook=NoopHook(),
        policy=SlidingWindow.last_messages(2),
        capture=captured,
        chat_store_key="cap",
        recall=ListRecall([OLD]),
    )
    first = [from_core("system", "sys"), from_core("user", "hello")]
    second = [from_core("assistant", "hi"), from_core("user", "again"), from_core("user", "and")]
    if flavour == "sync":
        memory.put_messages(first)
        memory.get()
        for m in second:
            memory.put(m)
        memory.set(memory.get_all())
    else:

        async def run() -> None:
            await memory.aput_messages(first)
            await memory.aget()
            for m in second:
                await memory.aput(m)
            await memory.aset(await memory.aget_all())

        asyncio.run(run())
    expected = [(1, "hello"), (3, "again"), (4, "and")]
    assert [(t.index, t.text) for t in captured.turns] == expected
    for turn in captured.turns:
        assert turn.conversation_id == "cap" and turn.role == "user"
        assert turn.key == make_key("cap", turn.index, fingerprint("user", turn.text))
