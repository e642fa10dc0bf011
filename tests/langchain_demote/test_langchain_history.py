"""DemotingChatMessageHistory and with_demotion: reads, memo, async path, capture, ids."""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import ConfigurableFieldSpec
from langchain_core.runnables.history import RunnableWithMessageHistory

from demote import (
    Backoff,
    CapturedTurn,
    ConfigError,
    ConversationIdError,
    ConversationState,
    Demoter,
    SlidingWindow,
    SQLiteStateStore,
)
from langchain_demote import DemotingChatMessageHistory, with_demotion
from tests.conformance.contract import RecordingHook
from tests.langchain_demote.support import FileChatMessageHistory, RecordingChatModel, to_pairs


def turn(i: int) -> list[BaseMessage]:
    return [HumanMessage(f"q{i}"), AIMessage(f"a{i}")]


class CountingDemoter(Demoter):
    """A Demoter that counts its sync and async loads."""

    loads = 0
    aloads = 0

    def load(self, *args: Any, **kwargs: Any) -> Any:
        self.loads += 1
        return super().load(*args, **kwargs)

    async def aload(self, *args: Any, **kwargs: Any) -> Any:
        self.aloads += 1
        return await super().aload(*args, **kwargs)


class AsyncOnlyHistory(BaseChatMessageHistory):
    """An inner store with native async methods whose sync read must not be used."""

    def __init__(self) -> None:
        self.store: list[BaseMessage] = []

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        raise AssertionError("the async path must not read the sync property")

    async def aget_messages(self) -> list[BaseMessage]:
        return list(self.store)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        raise AssertionError("the async path must not write through the sync method")

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.store.extend(messages)

    def clear(self) -> None:
        raise AssertionError("the async path must not clear through the sync method")

    async def aclear(self) -> None:
        self.store = []


class CaptureSink:
    def __init__(self) -> None:
        self.turns: list[CapturedTurn] = []

    def capture(self, turn: CapturedTurn) -> None:
        self.turns.append(turn)


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_window_is_memoised_until_messages_are_added(tmp_path: Path, kind: str) -> None:
    demoter = CountingDemoter(
        SlidingWindow.last_messages(4),
        RecordingHook(),
        state=SQLiteStateStore(tmp_path / "state.db"),  # a file beside the file history
    )
    inner: BaseChatMessageHistory = (
        InMemoryChatMessageHistory() if kind == "memory" else FileChatMessageHistory(tmp_path / "h")
    )
    history = DemotingChatMessageHistory(inner, demoter, "memo")
    for i in range(5):
        history.add_messages(turn(i))
    first = history.messages
    assert history.messages == first and demoter.loads == 1
    history.add_message(HumanMessage("q5"))
    assert history.messages[-1] == HumanMessage("q5") and demoter.loads == 2
    assert len(history.all_messages) == 11


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_the_memo_sees_a_changed_history_of_the_same_length(tmp_path: Path, kind: str) -> None:
    """The memo is keyed on the length and the last message (its identity, else its
    fingerprint): a replaced last message, a rewritten history or a clear is seen."""
    demoter = CountingDemoter(
        SlidingWindow.last_messages(4),
        RecordingHook(),
        state=SQLiteStateStore(tmp_path / "state.db"),  # a file beside the file history
    )
    inner: BaseChatMessageHistory = (
        InMemoryChatMessageHistory() if kind == "memory" else FileChatMessageHistory(tmp_path / "h")
    )
    history = DemotingChatMessageHistory(inner, demoter, "memo")
    for i in range(3):
        history.add_messages(turn(i))
    assert to_pairs(history.messages)[-1] == ("assistant", "a2")
    assert to_pairs(history.messages)[-1] == ("assistant", "a2") and demoter.loads == 1
    # The last message replaced by another of the same length of history.
    kept = inner.messages[:-1]
    inner.clear()
    inner.add_messages([*kept, AIMessage("edited")])
    assert to_pairs(history.messages)[-1] == ("assistant", "edited") and demoter.loads == 2
    # The whole history rewritten, same length.
    inner.clear()
    inner.add_messages([m for i in range(10, 13) for m in turn(i)])
    assert to_pairs(history.messages) == to_pairs([*turn(11), *turn(12)])
    assert demoter.loads == 3
    # Cleared, then as long as before again with other messages.
    history.clear()
    assert history.messages == []
    for i in range(20, 23):
        history.add_messages(turn(i))
    assert to_pairs(history.messages) == to_pairs([*turn(21), *turn(22)])


@pytest.mark.filterwarnings(  # an in-memory test double, not one of LangChain's classes
    "ignore:.*keeps conversations across restarts:demote.errors.DemoteWarning"
)
def test_a_store_that_builds_new_objects_keeps_the_memo() -> None:
    """A store whose every read makes new messages (a file, SQL) still hits the memo: the
    last message is compared by fingerprint when it is not the same object."""
    demoter = CountingDemoter(SlidingWindow.last_messages(4), RecordingHook())

    class Copying(BaseChatMessageHistory):
        def __init__(self) -> None:
            self.store: list[BaseMessage] = []

        @property
        def messages(self) -> list[BaseMessage]:  # type: ignore[override]
            return [m.model_copy() for m in self.store]

        def add_messages(self, messages: Sequence[BaseMessage]) -> None:
            self.store.extend(messages)

        def clear(self) -> None:
            self.store = []

    inner = Copying()
    history = DemotingChatMessageHistory(inner, demoter, "copies")
    for i in range(3):
        history.add_messages(turn(i))
    first = history.messages
    assert history.messages == first and demoter.loads == 1


@pytest.mark.filterwarnings(  # an in-memory test double, not one of LangChain's classes
    "ignore:.*keeps conversations across restarts:demote.errors.DemoteWarning"
)
async def test_async_path_awaits_inner_and_engine() -> None:
    demoter = CountingDemoter(SlidingWindow.last_messages(2), RecordingHook())
    history = DemotingChatMessageHistory(AsyncOnlyHistory(), demoter, "async")
    for i in range(4):
        await history.aadd_messages(turn(i))
    assert to_pairs(await history.aget_messages()) == [("user", "q3"), ("assistant", "a3")]
    assert (demoter.loads, demoter.aloads) == (0, 1)
    assert len(await history.aget_all_messages()) == 8
    await history.aclear()
    assert await history.aget_messages() == []
    assert demoter.state_of("async") == ConversationState(generation=1)  # a tombstone


def test_window_pins_system_and_clear_resets() -> None:
    hook = RecordingHook()
    demoter = Demoter(SlidingWindow.last_turns(2), hook)
    history = DemotingChatMessageHistory(InMemoryChatMessageHistory(), demoter, "c")
    history.add_messages([SystemMessage("rules")])
    for i in range(6):
        history.add_messages(turn(i))
        assert history.messages[0] == SystemMessage("rules")
    assert to_pairs(history.messages[1:]) == to_pairs([*turn(4), *turn(5)])
    assert [m.text for b in hook.batches for m in b.messages] == [
        t for i in range(4) for t in (f"q{i}", f"a{i}")
    ]
    history.clear()
    assert history.messages == [] and history.all_messages == []
    assert demoter.state_of("c") == ConversationState(generation=1)  # a tombstone


def test_capture_gets_each_user_message_with_the_demotion_key() -> None:
    hook, sink = RecordingHook(), CaptureSink()
    demoter = Demoter(SlidingWindow.last_messages(2), hook)
    inner = InMemoryChatMessageHistory()
    for i in range(3):
        # A new instance per turn (as the factory makes one per invoke); some turns read first.
        history = DemotingChatMessageHistory(inner, demoter, "cap", capture=sink)
        if i % 2:
            history.messages  # noqa: B018 - the read primes the known length
        history.add_messages(turn(i))
        history.add_messages([AIMessage("more")])
    history.messages  # noqa: B018 - demotes everything but the last turn
    assert [(t.text, t.index, t.role) for t in sink.turns] == [
        ("q0", 0, "user"),
        ("q1", 3, "user"),
        ("q2", 6, "user"),
    ]
    delivered = {m.index: m.key for b in hook.batches for m in b.messages}
    assert [t.key for t in sink.turns[:2]] == [delivered[0], delivered[3]]
    assert all(t.conversation_id == "cap" for t in sink.turns)


@pytest.mark.parametrize("bad", ["", "a\x00b", 7, None])
def test_bad_conversation_id_is_a_typed_error(bad: Any) -> None:
    inner = InMemoryChatMessageHistory()
    demoter = Demoter(SlidingWindow.last_messages(2))
    with pytest.raises(ConversationIdError):
        DemotingChatMessageHistory(inner, demoter, bad)
    assert inner.messages == [] and demoter.tracked_conversations() == 0


def test_bad_arguments_are_config_errors() -> None:
    demoter = Demoter(SlidingWindow.last_messages(2))
    inner = InMemoryChatMessageHistory()
    with pytest.raises(ConfigError, match="inner"):
        DemotingChatMessageHistory([], demoter, "c")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="demoter"):
        DemotingChatMessageHistory(inner, object(), "c")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="capture"):
        DemotingChatMessageHistory(inner, demoter, "c", capture=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="factory"):
        with_demotion(42, demoter)  # type: ignore[arg-type]


def test_with_demotion_keeps_the_signature_and_uses_the_session_id() -> None:
    def get_session_history(session_id: str) -> BaseChatMessageHistory:
        """Doc."""
        return InMemoryChatMessageHistory()

    demoter = Demoter(SlidingWindow.last_messages(2))
    wrapped = with_demotion(get_session_history, demoter)
    assert list(inspect.signature(wrapped).parameters) == ["session_id"]
    assert wrapped.__name__ == "get_session_history" and wrapped.__doc__ == "Doc."
    history = wrapped("user-42")
    assert isinstance(history, DemotingChatMessageHistory)
    assert history.conversation_id == "user-42"


def test_with_demotion_over_history_factory_config() -> None:
    store: dict[tuple[str, str], InMemoryChatMessageHistory] = {}

    def get_session_history(user_id: str, conversation_id: str) -> BaseChatMessageHistory:
        return store.setdefault((user_id, conversation_id), InMemoryChatMessageHistory())

    demoter = Demoter(SlidingWindow.last_messages(2), RecordingHook())
    factory = with_demotion(get_session_history, demoter)
    expected = json.dumps({"conversation_id": "c", "user_id": "u"}, separators=(",", ":"))
    assert factory("u", "c").conversation_id == expected
    assert factory(conversation_id="c", user_id="u").conversation_id == expected
    model = RecordingChatModel()
    chain = RunnableWithMessageHistory(
        model,
        factory,
        history_factory_config=[
            ConfigurableFieldSpec(id="user_id", annotation=str),
            ConfigurableFieldSpec(id="conversation_id", annotation=str),
        ],
    )
    config = {"configurable": {"user_id": "u", "conversation_id": "c"}}
    for i in range(4):
        chain.invoke([HumanMessage(f"q{i}")], config=config)  # type: ignore[arg-type]
    assert len(store[("u", "c")].messages) == 8
    assert to_pairs(model.seen[-1][:-1]) == to_pairs(store[("u", "c")].messages[4:6])
    assert demoter.state_of(expected).window_start == 4  # as of the last read


class FlakyHook(RecordingHook):
    """Fails every other delivery (the engine logs it and retries on the next load)."""

    calls = 0

    def deliver(self, batch: Any) -> None:
        self.calls += 1
        if self.calls % 2:
            raise RuntimeError("sink down")
        super().deliver(batch)


def test_window_does_not_change_between_the_two_reads_of_a_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """List input: the end-of-turn read must slice like the first, even if a retry lands."""
    hook = FlakyHook()
    # on_hook_error="log"; retried on the next load
    demoter = Demoter(SlidingWindow.last_messages(2), hook, retry=Backoff(0, 0))
    store = InMemoryChatMessageHistory()

    def get_session_history(session_id: str) -> BaseChatMessageHistory:
        return store

    chain = RunnableWithMessageHistory(
        RecordingChatModel(), with_demotion(get_session_history, demoter)
    )
    config = {"configurable": {"session_id": "flaky"}}
    for i in range(8):
        chain.invoke([HumanMessage(f"q{i}")], config=config)  # type: ignore[arg-type]
    assert [m.content for m in store.messages[::2]] == [f"q{i}" for i in range(8)]
    assert len(store.messages) == 16, "no message stored twice"
    assert hook.calls > len(hook.batches) > 0 and "sink down" in caplog.text
