"""End to end: RunnableWithMessageHistory over a demoting history, 60+ turns.

What the model receives is recorded by a fake chat model and checked turn by turn: it is
the prompt's system message, a window of the history within the policy, and the question.
Every message that left the window is delivered once; a restart (new Demoter on the same
SQLite state, new inner history on the same file) delivers nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.messages import AIMessageChunk, BaseMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from demote import Bulk, Demoter, FanOutHook, SlidingWindow, SQLiteStateStore
from demote.archive.sqlite import SQLiteArchive
from langchain_demote import with_demotion
from langchain_demote.messages import to_core
from tests.conformance.contract import RecordingHook
from tests.langchain_demote.support import FileChatMessageHistory, RecordingChatModel, to_pairs

TURNS = 62
POLICIES = {
    "messages": SlidingWindow.last_messages(8),
    "tokens-bulk": SlidingWindow.last_tokens(90, eviction=Bulk(overflow=40)),
}
Factory = Callable[[str], BaseChatMessageHistory]


def inner_factory(kind: str, tmp_path: Path) -> Factory:
    store: dict[str, InMemoryChatMessageHistory] = {}

    def get_session_history(session_id: str) -> BaseChatMessageHistory:
        if kind == "memory":
            return store.setdefault(session_id, InMemoryChatMessageHistory())
        return FileChatMessageHistory(tmp_path / f"{session_id}.json")

    return get_session_history


def build(
    factory: Factory, demoter: Demoter
) -> tuple[RunnableWithMessageHistory, RecordingChatModel]:
    model = RecordingChatModel()
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are terse."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | model,
        with_demotion(factory, demoter),
        input_messages_key="question",
        history_messages_key="history",
    )
    return chain, model


def question(i: int) -> str:
    return f"question {i}: " + "why " * (i % 5)


async def run_turns(chain: RunnableWithMessageHistory, mode: str, turns: range) -> None:
    config = {"configurable": {"session_id": "s1"}}
    for i in turns:
        payload = {"question": question(i)}
        if mode == "invoke":
            chain.invoke(payload, config=config)  # type: ignore[arg-type]
        elif mode == "ainvoke":
            await chain.ainvoke(payload, config=config)  # type: ignore[arg-type]
        else:
            chunks = list(chain.stream(payload, config=config))  # type: ignore[arg-type]
            assert chunks


def size(demoter: Demoter, messages: list[BaseMessage]) -> int:
    if demoter.policy.unit == "messages":
        return len(messages)
    return sum(to_core(m, demoter.describe).tokens for m in messages)


def check_model_inputs(
    demoter: Demoter, seen: list[list[BaseMessage]], full: list[BaseMessage], first: int = 0
) -> None:
    """Turn ``first + t`` saw [system, window of full[:2 * turn], question]."""
    policy = demoter.policy
    bound = policy.limit + (policy.eviction.overflow if isinstance(policy.eviction, Bulk) else 0)
    for t, received in enumerate(seen, first):
        assert isinstance(received[0], SystemMessage) and received[0].content == "You are terse."
        assert isinstance(received[-1], HumanMessage) and received[-1].content == question(t)
        window = received[1:-1]
        assert size(demoter, window) <= bound, f"turn {t}: window over the policy"
        before = full[: 2 * t]
        assert to_pairs(window) == to_pairs(before[len(before) - len(window) :])
        if len(window) < len(before):
            assert isinstance(window[0], HumanMessage), "window starts on a turn boundary"
        if t:
            assert window, "the previous turn is always in the window"


def check_delivered_once(
    hook: RecordingHook, factory: Factory, demoter: Demoter
) -> tuple[list[BaseMessage], int]:
    history = with_demotion(factory, demoter)("s1")
    window = history.messages  # a last read delivers whatever the last turn pushed out
    full = history.all_messages
    pinned = next(i for i, m in enumerate(full) if not isinstance(m, SystemMessage))
    assert window[:pinned] == full[:pinned]
    start = len(full) - len(window[pinned:])
    assert start > pinned
    records = hook.records("s1")
    assert [(r, t, i) for r, t, i, _ in records] == [
        (role, text, i) for i, (role, text) in enumerate(to_pairs(full[pinned:start]), pinned)
    ]
    assert len({k for *_, k in records}) == len(records)
    return full, start


@pytest.mark.parametrize("policy_id", list(POLICIES))
@pytest.mark.parametrize("kind", ["memory", "file"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke", "stream"])
async def test_chain_window_bounded_and_demoted_once(
    tmp_path: Path, mode: str, kind: str, policy_id: str
) -> None:
    hook = RecordingHook()
    # A history in a file keeps its demotion state in a file too (demote.restarts).
    state = SQLiteStateStore(tmp_path / "state.db") if kind == "file" else None
    demoter = Demoter(POLICIES[policy_id], hook, on_hook_error="raise", state=state)
    factory = inner_factory(kind, tmp_path)
    chain, model = build(factory, demoter)
    await run_turns(chain, mode, range(TURNS))
    assert len(model.seen) == TURNS
    full, _ = check_delivered_once(hook, factory, demoter)
    assert len(full) == 2 * TURNS
    check_model_inputs(demoter, model.seen, full)
    if mode == "stream":
        assert all(isinstance(m, AIMessageChunk) for m in full[1::2])


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_restart_mid_conversation(tmp_path: Path, mode: str) -> None:
    policy = SlidingWindow.last_messages(6, eviction=Bulk(overflow=4))
    factory = inner_factory("file", tmp_path)
    recorder = RecordingHook()
    halves = (range(0, TURNS // 2), range(TURNS // 2, TURNS))
    seen: list[list[BaseMessage]] = []
    for half in halves:  # each half is a fresh process: new state, archive and demoter
        state = SQLiteStateStore(tmp_path / "state.db")
        archive = SQLiteArchive(tmp_path / "archive.db")
        try:
            demoter = Demoter(policy, FanOutHook(archive, recorder), state=state)
            chain, model = build(factory, demoter)
            before = len(recorder.records())
            await run_turns(chain, mode, half)
            assert len(recorder.records()) > before, "each half demotes something"
            seen += model.seen
            if half is halves[1]:
                full, start = check_delivered_once(recorder, factory, demoter)
                assert [m.index for m in archive.messages("s1")] == list(range(start))
        finally:
            archive.close()
            state.close()
    check_model_inputs(demoter, seen, full)


async def test_list_input_without_history_key_stores_each_message_once(
    tmp_path: Path,
) -> None:
    """List input: the history is read twice per turn and the input sliced by the first."""
    hook = RecordingHook()
    state = SQLiteStateStore(tmp_path / "state.db")  # beside the history's file
    demoter = Demoter(SlidingWindow.last_messages(5), hook, on_hook_error="raise", state=state)
    model = RecordingChatModel()
    factory = inner_factory("file", tmp_path)
    chain = RunnableWithMessageHistory(model, with_demotion(factory, demoter))
    config = {"configurable": {"session_id": "s1"}}
    expected: list[tuple[str, str]] = [("system", "be brief")]
    for i in range(30):
        turn: list[BaseMessage] = [HumanMessage(question(i))]
        if i == 0:
            turn.insert(0, SystemMessage("be brief"))
        if i % 2:
            reply = await chain.ainvoke(turn, config=config)  # type: ignore[arg-type]
        else:
            reply = chain.invoke(turn, config=config)  # type: ignore[arg-type]
        expected += [("user", question(i)), ("assistant", reply.content)]
        received = model.seen[-1]
        assert received[0] == SystemMessage("be brief"), "pinned system message kept"
        assert len(received) <= 1 + 5 + 1
    full, start = check_delivered_once(hook, factory, demoter)
    assert to_pairs(full) == expected
    assert start > 1 + 5
