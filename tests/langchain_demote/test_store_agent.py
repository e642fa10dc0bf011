"""StoreHook and StoreRecall on real ``create_agent`` graphs, with ``InMemoryStore``.

An agent with ``DemotingMiddleware(Demoter(..., StoreHook(store)), recall=StoreRecall(...))``
(the store given, or the agent's own ``store=`` read from the run) demotes into the store
and is sent what it recalls from it, sync and async, with and without a semantic index and
a system prompt; every request passes both providers' converters. The recall tool over a
``StoreRecall`` searches and fetches the run's own conversation only. Under concurrency
(threads on one Demoter, tasks on one loop) every demoted message is put once and is one
item; the async paths never block the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from functools import partial
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore

from demote import Demoter, SlidingWindow
from demote.archive.render import CUT_MARK
from demote.window.tokens import approximate_tokens
from langchain_demote import DemotingMiddleware, StoreHook, StoreRecall, recall_tool
from langchain_demote.messages import message_text
from langchain_demote.middleware import RECALL_PREFIX
from langchain_demote.provider_rules import violations
from tests.langchain_demote.support import RecordingChatModel
from tests.langchain_demote.test_langchain_recall_tool import (
    END,
    SECRET,
    ScriptedModel,
    archive_trace,
    everything_seen,
    fetch_placeholder,
    read_file,
    tool_answers,
    trace,
)
from tests.langchain_demote.test_store_hook import (
    DIMS,
    CountingStore,
    Words,
    expected_keys,
    indexed_store,
    items,
    thread,
)

FACT = "We hiked the Alps in June; the tent leaked at the second camp."
QUESTION = "Where did we hike, and what leaked?"


class Model(RecordingChatModel):
    """A fake chat model that records what it is sent, for agents with tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Model:
        return self


def converse(agent: Any, config: Any, mode: str, small_talk: int) -> None:
    """The fact, ``small_talk`` turns of small talk, then the question, one invoke each."""
    turns = [FACT, *(f"Small talk {i} about nothing much." for i in range(small_talk)), QUESTION]
    for turn in turns:
        state = {"messages": [HumanMessage(turn)]}
        if mode == "sync":
            agent.invoke(state, config)
        else:
            asyncio.run(agent.ainvoke(state, config))


def _store(kind: str) -> CountingStore:
    return (
        CountingStore(index={"dims": DIMS, "embed": Words()})
        if kind == "index"
        else CountingStore()
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("kind", "source", "system_prompt"),
    [
        ("plain", "given", None),
        ("index", "given", "You are terse."),
        ("plain", "runtime", "You are terse."),
        ("index", "runtime", None),
    ],
)
def test_an_agent_demotes_into_its_store_and_is_sent_what_it_recalls(
    mode: str, kind: str, source: str, system_prompt: str | None
) -> None:
    store = _store(kind)
    demoter = Demoter(SlidingWindow.last_turns(2), StoreHook(store), hook_wait=None)
    recall = StoreRecall(store if source == "given" else None)
    model = Model(messages=itertools.repeat("Noted."))
    agent = create_agent(
        model,
        [recall_tool(recall)],
        system_prompt=system_prompt,
        checkpointer=InMemorySaver(),
        store=store,
        middleware=[DemotingMiddleware(demoter, recall=recall, recall_k=2)],
    )
    config: Any = {"configurable": {"thread_id": "hiker.7"}}
    converse(agent, config, mode, small_talk=8)

    last = model.seen[-1]
    assert message_text(last[-2]) == QUESTION
    recalled = [m for m in last if message_text(m).startswith(RECALL_PREFIX)]
    assert len(recalled) == 1 and f"- user: {FACT}" in message_text(recalled[0])
    assert isinstance(recalled[0], HumanMessage) and last.index(recalled[0]) == len(last) - 1
    for sent in model.seen:  # every request, recall included, is one both providers take
        assert violations(sent) == [], violations(sent)[:3]
        assert [isinstance(m, SystemMessage) for m in sent[:1]] == [bool(system_prompt)]
    # Every demoted message is one item, put once.
    thread_messages = agent.get_state(config).values["messages"]
    delivered = demoter.state_of("hiker.7").delivered
    # At the last model call the window was the turn before and the question (the
    # answer came after it): everything else was demoted.
    assert delivered == len(thread_messages) - 4
    keys = expected_keys(demoter, "hiker.7", thread_messages, delivered)
    assert sorted(i.key for i in items(store)) == sorted(keys)
    assert {tuple(i.namespace) for i in items(store)} == {("demote", "hiker%2E7")}
    assert set(store.puts.values()) == {1}


# -- the recall tool over the store ---------------------------------------------------------


def _placeholder_window(store: InMemoryStore, cid: str) -> list[BaseMessage]:
    from langchain_core.messages import AIMessage

    from demote.window.clearing import placeholder_text

    [key] = [i.key for i in items(store) if SECRET[cid] in i.value["text"]]
    return [
        HumanMessage("continue the deploy"),
        AIMessage("", tool_calls=[{"name": "read_file", "args": {"path": "cfg"}, "id": "p1"}]),
        ToolMessage(placeholder_text(key, "read_file", 912), tool_call_id="p1"),
        HumanMessage("what was the staging deploy token?"),
    ]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", ["plain", "index"])
@pytest.mark.parametrize(("mine", "theirs"), [("a", "b"), ("b", "a")])
def test_the_recall_tool_searches_and_fetches_the_runs_own_conversation(
    mode: str, kind: str, mine: str, theirs: str
) -> None:
    store = _store(kind)
    for cid in ("a", "b"):
        archive_trace(StoreHook(store), cid, trace(cid))
    model = ScriptedModel(plan=[{"query": "staging deploy token"}, fetch_placeholder])
    agent = create_agent(
        model,
        [read_file, recall_tool(StoreRecall(store), budget_tokens=200)],
        checkpointer=InMemorySaver(),
    )
    state = {"messages": _placeholder_window(store, mine)}
    config: Any = {"configurable": {"thread_id": mine}}
    if mode == "sync":
        result = agent.invoke(state, config)["messages"]
    else:
        result = asyncio.run(agent.ainvoke(state, config))["messages"]
    searched, fetched = tool_answers(result)
    assert SECRET[mine] in searched and approximate_tokens(searched) <= 200
    [key] = [i.key for i in items(store) if SECRET[mine] in i.value["text"]]
    assert CUT_MARK.format(key=key) in searched  # cut, naming the key to fetch
    assert "staging deploy token is " + SECRET[mine] in fetched and fetched.endswith(END[mine])
    seen = everything_seen(model, result)
    assert SECRET[theirs] not in seen and END[theirs] not in seen


# -- exactly once under concurrency ---------------------------------------------------------

THREADS = 8
ROUNDS = 25
CONVERSATIONS = ["c0", "c1", "c2"]


def test_threads_on_one_demoter_put_each_demoted_message_once() -> None:
    store = CountingStore()
    demoter = Demoter(SlidingWindow.last_messages(6), StoreHook(store))
    full = {cid: thread(THREADS * ROUNDS, tag=cid) for cid in CONVERSATIONS}
    grown = dict.fromkeys(CONVERSATIONS, 0)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for r in range(ROUNDS):
                cid = CONVERSATIONS[(n + r) % len(CONVERSATIONS)]
                with lock:  # a turn arrives: the history grows by one exchange
                    grown[cid] += 4
                    history = full[cid][: grown[cid]]
                demoter.load(cid, history, lambda m: to_core(m, demoter.describe))
        except BaseException as exc:
            errors.append(exc)

    from langchain_demote.messages import to_core

    workers = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not errors, errors[:1]
    deadline = time.monotonic() + 30
    for cid in CONVERSATIONS:  # settle: the last load's deliveries, then one more load
        history = full[cid][: grown[cid]]
        while time.monotonic() < deadline:
            window = demoter.load(cid, history, lambda m: to_core(m, demoter.describe))
            if window.pending == 0:
                break
            time.sleep(0.01)
        delivered = demoter.state_of(cid).delivered
        assert window.pending == 0 and delivered == window.start >= len(history) - 6
        keys = expected_keys(demoter, cid, history, delivered)
        assert sorted(i.key for i in items(store, ("demote", cid))) == sorted(keys)
    assert set(store.puts.values()) == {1}, store.puts.most_common(3)
    assert sum(store.puts.values()) == len(items(store))


async def test_tasks_on_one_loop_put_each_demoted_message_once() -> None:
    from langchain_demote.messages import to_core

    store = CountingStore()
    demoter = Demoter(SlidingWindow.last_messages(6), StoreHook(store), hook_wait=None)
    full = thread(60, tag="x")
    grown = {"n": 0}

    async def work() -> None:
        for _ in range(20):
            grown["n"] = min(grown["n"] + 4, len(full))
            history = full[: grown["n"]]
            await demoter.aload("x", history, lambda m: to_core(m, demoter.describe))

    await asyncio.gather(*(work() for _ in range(6)))
    history = full[: grown["n"]]
    window = await demoter.aload("x", history, lambda m: to_core(m, demoter.describe))
    assert window.pending == 0 and window.start >= len(history) - 6
    keys = expected_keys(demoter, "x", history, window.start)
    assert sorted(i.key for i in items(store)) == sorted(keys)
    assert set(store.puts.values()) == {1}


# -- the event loop -------------------------------------------------------------------------


async def test_the_async_paths_never_block_the_loop() -> None:
    blockbuster = pytest.importorskip("blockbuster")
    from langchain_demote.messages import to_core

    plain, indexed = InMemoryStore(), indexed_store()
    demoters = [
        Demoter(SlidingWindow.last_messages(4), StoreHook(s), hook_wait=None)
        for s in (plain, indexed)
    ]
    recalls = [StoreRecall(plain), StoreRecall(indexed)]
    messages = thread(6)
    with blockbuster.blockbuster_ctx(["demote", "langchain_demote"]):
        for demoter, recall in zip(demoters, recalls, strict=True):
            window = await demoter.aload("c", messages, partial(to_core, describe=demoter.describe))
            assert window.pending == 0
            assert await recall.asearch("c", "weather in city2", k=2)
            key = (await recall.asearch("c", "city3", k=1))[0].key
            assert (await recall.afetch("c", key)) is not None
            report = await demoter.aerase("c")
            assert report.complete and report.tiers[0].removed == len(messages) - 4
            assert await recall.asearch("c", "weather in city2") == []
