"""RunnableWithMessageHistory with a demoting history is invisible while nothing is demoted.

LangChain documents ``RunnableWithMessageHistory(runnable, get_session_history, ...)`` for
three input shapes (a dict with ``input_messages_key`` and ``history_messages_key``, a list
of messages, a dict whose output holds the reply under ``output_messages_key``), every
``Runnable`` call style, and ``history_factory_config`` for factories of several
arguments. Each case runs twice, once on the plain histories and once through
``with_demotion`` with a window that never demotes, and the two runs must agree on
everything observable: what the model was sent, what the chain returned, what the
histories hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import ConfigurableFieldSpec, Runnable, RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from demote import ConversationIdError, Demoter, SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from demote.errors import ConfigError
from langchain_demote import archive_retriever, with_demotion
from tests.conformance._langchain import EchoModel, contents
from tests.conformance.contract import RecordingHook

STYLES = ("invoke", "ainvoke", "stream", "astream", "batch", "abatch")
SHAPES = ("prompt", "messages", "output_key")
SESSIONS = ("s1", "s2")
TURNS = 6
NEVER = SlidingWindow.last_messages(10_000)

Histories = dict[str, InMemoryChatMessageHistory]


def build(
    shape: str, factory: Callable[..., BaseChatMessageHistory], model: EchoModel, **options: Any
) -> Any:
    if shape == "prompt":
        prompt = ChatPromptTemplate.from_messages(
            [("system", "be terse"), MessagesPlaceholder("history"), ("human", "{question}")]
        )
        return RunnableWithMessageHistory(
            prompt | model,
            factory,
            input_messages_key="question",
            history_messages_key="history",
            **options,
        )
    if shape == "messages":  # input: a list of messages; the history is prepended
        return RunnableWithMessageHistory(model, factory)
    inner: Runnable[Any, Any] = RunnableLambda(lambda d: d["messages"]) | model
    return RunnableWithMessageHistory(
        inner | RunnableLambda(lambda reply: {"answer": reply}),
        factory,
        input_messages_key="messages",
        output_messages_key="answer",
    )


def payload(shape: str, text: str) -> Any:
    if shape == "prompt":
        return {"question": text}
    if shape == "messages":
        return [HumanMessage(text)]
    return {"messages": [HumanMessage(text)]}


def text_of(output: Any) -> str:
    if isinstance(output, dict):
        output = output["answer"]
    return str(output.text if isinstance(output, BaseMessage) else output)


async def call(style: str, chain: Any, inputs: list[Any], configs: list[Any]) -> list[str]:
    """Run ``inputs`` (one per config) in ``style``; the reply texts, in input order."""
    if style in ("batch", "abatch"):
        outs = (
            chain.batch(inputs, config=configs)
            if style == "batch"
            else await chain.abatch(inputs, config=configs)
        )
        return [text_of(o) for o in outs]
    replies = []
    for value, config in zip(inputs, configs, strict=True):
        if style == "invoke":
            replies.append(text_of(chain.invoke(value, config=config)))
        elif style == "ainvoke":
            replies.append(text_of(await chain.ainvoke(value, config=config)))
        else:
            chunks = (
                list(chain.stream(value, config=config))
                if style == "stream"
                else [c async for c in chain.astream(value, config=config)]
            )
            assert chunks
            if isinstance(chunks[0], dict):  # output_key: {"answer": chunk} per chunk
                chunks = [c["answer"] for c in chunks]
            total = chunks[0]
            for c in chunks[1:]:
                total = total + c
            replies.append(text_of(total))
    return replies


def histories_factory(histories: Histories) -> Callable[[str], BaseChatMessageHistory]:
    def get_session_history(session_id: str) -> BaseChatMessageHistory:
        return histories.setdefault(session_id, InMemoryChatMessageHistory())

    return get_session_history


def run(style: str, shape: str, demoting: bool) -> tuple[Any, ...]:
    histories: Histories = {}
    hook = RecordingHook()
    get_session_history = histories_factory(histories)
    factory: Callable[..., BaseChatMessageHistory] = get_session_history
    if demoting:
        factory = with_demotion(get_session_history, Demoter(NEVER, hook))
    model = EchoModel()
    chain = build(shape, factory, model)
    configs = [{"configurable": {"session_id": s}} for s in SESSIONS]
    replies = []
    for turn in range(TURNS):
        inputs = [payload(shape, f"{s} turn {turn}") for s in SESSIONS]
        replies.append(asyncio.run(call(style, chain, inputs, configs)))
    seen = sorted(tuple(contents(m)) for m in model.seen)
    stored = {s: contents(h.messages) for s, h in histories.items()}
    assert hook.batches == [], "a never-demoting window delivers nothing"
    return replies, seen, stored


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("style", STYLES)
def test_never_demoting_window_is_invisible(style: str, shape: str) -> None:
    plain = run(style, shape, demoting=False)
    replies, seen, stored = plain
    assert replies[-1] == [
        f"{2 * TURNS - 1 + (shape == 'prompt')} seen; re: s1 turn 5",
        replies[-1][1],
    ]
    assert all(len(stored[s]) == 2 * TURNS for s in SESSIONS)
    assert len(seen) == len(SESSIONS) * TURNS, "one model call per turn and session"
    assert run(style, shape, demoting=True) == plain


# -- conversation ids the frameworks accept ------------------------------------------------


def test_empty_session_id_works_and_maps_to_its_json(tmp_path: Any) -> None:
    """``session_id=""`` is a valid LangChain session; the core refuses empty ids."""
    config = {"configurable": {"session_id": ""}}
    outcomes = []
    for policy in (None, NEVER, SlidingWindow.last_turns(2)):
        histories: Histories = {}
        archive = SQLiteArchive(tmp_path / f"archive-{len(outcomes)}.db")
        factory: Callable[..., Any] = histories_factory(histories)
        if policy is not None:
            factory = with_demotion(factory, Demoter(policy, archive))
        model = EchoModel()
        chain = build("prompt", factory, model)
        for turn in range(5):
            chain.invoke({"question": f"turn {turn}"}, config=config)
        outcomes.append((list(histories), contents(histories[""].messages)))
        if policy is not None and policy.unit == "turns":
            assert archive.count('""') == 4, "the empty session's conversation id is '\"\"'"
            assert len(model.seen[-1]) == 1 + 4 + 1, "system, two turns, the question"
        archive.close()
    assert outcomes[0] == outcomes[1], "a never-demoting window changes nothing"
    assert outcomes[2][0] == [""]


def test_several_factory_fields_default_to_json_and_can_be_named(tmp_path: Any) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    demoter = Demoter(SlidingWindow.last_turns(1), archive)
    histories: dict[tuple[str, str], InMemoryChatMessageHistory] = {}

    def get_history(user_id: str, conversation_id: str) -> BaseChatMessageHistory:
        return histories.setdefault((user_id, conversation_id), InMemoryChatMessageHistory())

    fields = [
        ConfigurableFieldSpec(id="user_id", annotation=str),
        ConfigurableFieldSpec(id="conversation_id", annotation=str),
    ]
    by_default = with_demotion(get_history, demoter)
    named = with_demotion(
        get_history, demoter, conversation_id=lambda user_id, conversation_id: conversation_id
    )
    for factory, user in ((by_default, "u1"), (named, "u2")):
        chain = build("prompt", factory, EchoModel(), history_factory_config=fields)
        config = {"configurable": {"user_id": user, "conversation_id": f"c-{user}"}}
        for turn in range(3):
            chain.invoke({"question": f"{user} turn {turn}"}, config=config)
    assert archive.count('{"conversation_id":"c-u1","user_id":"u1"}') == 2
    assert archive.count("c-u2") == 2, "conversation_id= names the conversation"
    found = [d.page_content for d in archive_retriever(archive, "c-u2", k=2).invoke("u2 turn 0")]
    assert sorted(found) == ["2 seen; re: u2 turn 0", "u2 turn 0"]
    archive.close()


@pytest.mark.parametrize("bad", ["", None, 7])
def test_conversation_id_override_must_name_a_conversation(bad: Any) -> None:
    hook = RecordingHook()
    histories: Histories = {}
    get_session_history = histories_factory(histories)
    factory = with_demotion(
        get_session_history, Demoter(NEVER, hook), conversation_id=lambda session_id: bad
    )
    with pytest.raises(ConversationIdError, match=r"with_demotion\(conversation_id=...\)"):
        factory("s1")
    with pytest.raises(ConfigError, match="conversation_id"):
        with_demotion(get_session_history, Demoter(NEVER), conversation_id="s1")  # type: ignore[arg-type]
    assert histories == {} and hook.batches == []


def test_reply_texts_are_the_models() -> None:
    # The comparison above is only as strong as the model's replies are telling.
    model = EchoModel()
    assert model.invoke([HumanMessage("a"), AIMessage("b"), HumanMessage("c")]).text == (
        "3 seen; re: c"
    )
