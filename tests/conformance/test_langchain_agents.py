"""``create_agent`` with ``DemotingMiddleware``, in the ways LangChain documents agents.

Agents invoked with a thread id (and a checkpointer) and without one (the caller passes
the returned messages back), a tool that interrupts for a human and is resumed with
``Command(resume=...)``, a fork from an earlier checkpoint (time travel), and a stack of
three middlewares with demote in the middle. With a window that never demotes, every
run must match the same run without demote exactly; with a small one, the model is sent
a bounded window and every message that leaves it reaches the hook once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

from demote import Demoter, SlidingWindow
from langchain_demote import DemotingMiddleware
from langchain_demote.middleware import FIRST_MESSAGE_PREFIX
from tests.conformance._langchain import EchoModel, ToolLoopModel, add, contents, lookup
from tests.conformance.contract import RecordingHook

NEVER = SlidingWindow.last_messages(10_000)
SMALL = SlidingWindow.last_turns(2)


@tool
def confirm(topic: str) -> str:
    """Ask the human before looking a topic up."""
    answer = interrupt({"question": f"look up {topic}?"})
    return f"human said {answer} about {topic}"


Invoke = Callable[[Any, Any, Any], Any]


def invoker(flavour: str) -> Invoke:
    if flavour == "sync":
        return lambda agent, payload, config: agent.invoke(payload, config)
    return lambda agent, payload, config: asyncio.run(agent.ainvoke(payload, config))


@pytest.fixture(params=["sync", "async"])
def invoke(request: pytest.FixtureRequest) -> Invoke:
    return invoker(request.param)


def agent_with(
    model: Any,
    policy: SlidingWindow | None,
    hook: RecordingHook | None = None,
    *,
    tools: tuple[Any, ...] = (lookup, add),
    checkpointer: Any = None,
    middleware: tuple[AgentMiddleware[Any, Any, Any], ...] = (),
) -> tuple[Any, Demoter | None]:
    demoter = None if policy is None else Demoter(policy, hook)
    stack = list(middleware)
    if demoter is not None:
        stack.insert(len(stack) // 2, DemotingMiddleware(demoter))
    agent = create_agent(model, list(tools), checkpointer=checkpointer, middleware=stack)
    return agent, demoter


def turn(n: int, tag: str = "t") -> HumanMessage:
    kind = "quick" if n % 3 == 2 else "tell me about"
    return HumanMessage(f"{tag} turn {n}: {kind} topic {n}")


def check_delivered_once(hook: RecordingHook, cid: str, history: list[BaseMessage]) -> None:
    got = hook.records(cid)
    assert [i for _, _, i, _ in got] == list(range(len(got))), "each position once, in order"
    assert [t for _, t, _, _ in got] == [m.text for m in history[: len(got)]]


def check_sent(model: Any, hook: RecordingHook | None = None) -> None:
    """Every model call: no tool result without its call, at most 2 turns of history."""
    for sent in model.seen:
        opened = {c["id"] for m in sent for c in getattr(m, "tool_calls", [])}
        assert all(m.tool_call_id in opened for m in sent if isinstance(m, ToolMessage))
        assert sum(isinstance(m, HumanMessage) for m in sent) <= 2


# -- with and without a thread id -----------------------------------------------------------


def run_threaded(invoke: Invoke, policy: SlidingWindow | None, turns: int) -> Any:
    model, hook = ToolLoopModel(), RecordingHook()
    agent, demoter = agent_with(model, policy, hook, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t1"}}
    for n in range(turns):
        invoke(agent, {"messages": [turn(n)]}, config)
    messages = agent.get_state(config).values["messages"]
    return model, hook, demoter, messages


def run_threadless(invoke: Invoke, policy: SlidingWindow | None, turns: int, tag: str) -> Any:
    model, hook = ToolLoopModel(), RecordingHook()
    agent, demoter = agent_with(model, policy, hook)
    messages: list[BaseMessage] = []
    for n in range(turns):
        messages = invoke(agent, {"messages": [*messages, turn(n, tag)]}, None)["messages"]
    return model, hook, demoter, messages


@pytest.mark.parametrize("threaded", [True, False], ids=["thread", "no-thread"])
def test_never_demoting_window_is_invisible(invoke: Invoke, threaded: bool) -> None:
    runs = []
    for policy in (None, NEVER):
        if threaded:
            model, hook, _, messages = run_threaded(invoke, policy, 5)
        else:
            model, hook, _, messages = run_threadless(invoke, policy, 5, "t")
        runs.append(([contents(s) for s in model.seen], contents(messages)))
        assert hook.batches == []
    assert runs[0] == runs[1]
    assert len(runs[0][1]) == sum(2 if n % 3 == 2 else 5 for n in range(5))


def test_threadless_conversations_are_stable_and_distinct(invoke: Invoke) -> None:
    """Without a thread id the conversation is the state's first message (its id)."""
    model, hook = ToolLoopModel(), RecordingHook()
    agent, demoter = agent_with(model, SMALL, hook)
    assert demoter is not None
    one: list[BaseMessage] = []
    two: list[BaseMessage] = []
    for n in range(6):  # two conversations, interleaved, each passed back whole
        one = invoke(agent, {"messages": [*one, turn(n, "one")]}, None)["messages"]
        two = invoke(agent, {"messages": [*two, turn(n, "two")]}, None)["messages"]
    ids = {FIRST_MESSAGE_PREFIX + one[0].id, FIRST_MESSAGE_PREFIX + two[0].id}  # type: ignore[operator]
    assert len(ids) == 2 and demoter.tracked_conversations() == 2
    for cid, history in zip(sorted(ids, key=lambda c: c != ids_of(one)), (one, two), strict=True):
        state = demoter.state_of(cid)
        assert state.window_start > 0, "a 6-turn chat in a 2-turn window demotes"
        check_delivered_once(hook, cid, history)
    check_sent(model)


def ids_of(messages: list[BaseMessage]) -> str:
    return FIRST_MESSAGE_PREFIX + str(messages[0].id)


def test_threadless_history_rebuilt_without_ids_is_a_new_conversation_each_call() -> None:
    # Documented: ids are what make it one conversation. Fresh message objects without
    # ids get fresh ids from LangGraph, hence a new conversation (never another one's).
    model, hook = EchoModel(), RecordingHook()
    agent, demoter = agent_with(model, SMALL, hook, tools=())
    assert demoter is not None
    texts: list[str] = []
    for n in range(4):
        texts.append(f"turn {n}")
        agent.invoke({"messages": [{"role": "user", "content": t} for t in texts]})
    # Calls 3 and 4 hold more than two turns: each demotes "turn 0" in its own conversation.
    assert demoter.tracked_conversations() == 2
    assert [
        (b.conversation_id.startswith(FIRST_MESSAGE_PREFIX), b.messages[0].text)
        for b in hook.batches
    ] == [(True, "turn 0")] * 2
    assert len({b.conversation_id for b in hook.batches}) == 2


# -- interrupt and resume -------------------------------------------------------------------


def run_interrupting(invoke: Invoke, policy: SlidingWindow | None, turns: int) -> Any:
    model, hook = ToolLoopModel(tool_names=("confirm", "add")), RecordingHook()
    agent, demoter = agent_with(
        model, policy, hook, tools=(confirm, add), checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": "hitl"}}
    questions = []
    for n in range(turns):
        out = invoke(agent, {"messages": [turn(n)]}, config)
        if "__interrupt__" in out:
            questions.append(out["__interrupt__"][0].value["question"])
            out = invoke(agent, Command(resume=f"yes {n}"), config)
        assert "__interrupt__" not in out
    messages = agent.get_state(config).values["messages"]
    return model, hook, demoter, messages, questions


def test_interrupt_and_resume(invoke: Invoke) -> None:
    plain = run_interrupting(invoke, None, 6)
    never = run_interrupting(invoke, NEVER, 6)
    assert plain[4] == never[4] and len(plain[4]) == 4, "every non-quick turn asked the human"
    assert contents(plain[3]) == contents(never[3])
    assert [contents(s) for s in plain[0].seen] == [contents(s) for s in never[0].seen]
    assert any("human said yes 3" in m.text for m in never[3])

    model, hook, demoter, messages, _ = run_interrupting(invoke, SMALL, 6)
    assert demoter is not None and demoter.state_of("hitl").window_start > 0
    check_delivered_once(hook, "hitl", messages)
    check_sent(model)


# -- time travel: a fork from an earlier checkpoint ----------------------------------------


def run_fork(policy: SlidingWindow | None) -> Any:
    model, hook = ToolLoopModel(), RecordingHook()
    agent, demoter = agent_with(model, policy, hook, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "tt"}}
    for n in range(6):
        agent.invoke({"messages": [turn(n)]}, config)
    # The checkpoint that ended turn 2 (the state after the model's last answer).
    past = next(
        s
        for s in agent.get_state_history(config)
        if not s.next and sum(isinstance(m, HumanMessage) for m in s.values["messages"]) == 3
    )
    model.seen.clear()
    agent.invoke({"messages": [HumanMessage("fork: quick what now?")]}, past.config)
    branch = agent.get_state(config).values["messages"]
    return model, hook, demoter, past.values["messages"], branch


def test_fork_from_an_earlier_checkpoint() -> None:
    plain, never = run_fork(None), run_fork(NEVER)
    assert [contents(s) for s in plain[0].seen] == [contents(s) for s in never[0].seen]
    assert contents(plain[4]) == contents(never[4])

    model, _, demoter, before, branch = run_fork(SMALL)
    assert contents(branch[: len(before)]) == contents(before), "the fork continues turn 2"
    assert branch[-2].text == "fork: quick what now?"
    (sent,) = model.seen
    abandoned = {f"t turn {n}" for n in range(3, 6)}
    assert not any(m.text.startswith(tuple(abandoned)) for m in sent), "nothing of the old branch"
    assert sent[-1].text == "fork: quick what now?"
    # The window of the fork is the fork's own last two turns (re-delivery: see the engine).
    humans = [m.text for m in sent if isinstance(m, HumanMessage)]
    assert humans == [turn(2).text, "fork: quick what now?"]
    assert demoter is not None


def test_a_fork_does_not_hand_a_hook_without_key_lookup_the_shared_prefix_again() -> None:
    # RecordingHook has no has_keys: within one process the engine remembers what it
    # delivered, so re-syncing the fork offers the hook only the fork's new messages.
    _, hook, demoter, _, _ = run_fork(SMALL)
    keys = [key for *_, key in hook.records("tt")]
    assert len(keys) == len(set(keys)), "a key of the shared prefix was delivered twice"
    assert demoter is not None
    state = demoter.state_of("tt")
    assert state.generation >= 1, "the fork was re-synced"
    delivered = {i for _, _, i, _ in hook.records("tt")}
    assert set(range(state.delivered)) <= delivered, "every message below the watermark"


# -- a stack of three middlewares, demote in the middle ------------------------------------


class Outer(AgentMiddleware[Any, Any, Any]):
    """Records the messages it is given and the request it hands on."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[BaseMessage]] = []
        self.requests: list[ModelRequest[Any]] = []

    def _note(self, request: ModelRequest[Any]) -> None:
        self.seen.append(list(request.messages))
        self.requests.append(request)

    def wrap_model_call(self, request: ModelRequest[Any], handler: Any) -> Any:
        self._note(request)
        return handler(request)

    async def awrap_model_call(self, request: ModelRequest[Any], handler: Any) -> Any:
        self._note(request)
        return await handler(request)


class Nice(AgentMiddleware[Any, Any, Any]):
    """Edits the list it is given in place: appends a reminder, or inserts one at the head."""

    def __init__(self, where: str = "append") -> None:
        super().__init__()
        self.where = where
        self.requests: list[ModelRequest[Any]] = []

    def _edit(self, request: ModelRequest[Any]) -> None:
        self.requests.append(request)
        if self.where == "append":
            request.messages.append(HumanMessage("remember to be nice!"))
        else:
            request.messages.insert(0, SystemMessage("inserted by the inner middleware"))

    def wrap_model_call(self, request: ModelRequest[Any], handler: Any) -> Any:
        self._edit(request)
        return handler(request)

    async def awrap_model_call(self, request: ModelRequest[Any], handler: Any) -> Any:
        self._edit(request)
        return await handler(request)


def run_stack(invoke: Invoke, policy: SlidingWindow | None, where: str, turns: int) -> Any:
    outer, inner, model = Outer(), Nice(where), EchoModel()
    agent, _ = agent_with(model, policy, RecordingHook(), tools=(), middleware=(outer, inner))
    messages: list[BaseMessage] = []
    for n in range(turns):
        messages = invoke(agent, {"messages": [*messages, HumanMessage(f"Hello {n}")]}, None)[
            "messages"
        ]
    return outer, inner, model, messages


def test_three_middlewares_window_covers_everything(invoke: Invoke) -> None:
    plain = run_stack(invoke, None, "append", 1)
    outer, inner, model, messages = run_stack(invoke, NEVER, "append", 1)
    assert [m.text for m in messages] == [
        "Hello 0",
        "remember to be nice!",
        "2 seen; re: remember to be nice!",
    ]
    assert contents(messages) == contents(plain[3])
    assert inner.requests[0] is outer.requests[0], "handed on untouched: the same request"
    assert [contents(s) for s in model.seen] == [contents(s) for s in plain[2].seen]


def test_three_middlewares_window_cuts(invoke: Invoke) -> None:
    """Appends by the inner middleware reach the state as without demote; its view is cut."""
    plain = run_stack(invoke, None, "append", 5)
    outer, inner, model, messages = run_stack(invoke, SlidingWindow.last_messages(4), "append", 5)
    humans = [m.text for m in messages if isinstance(m, HumanMessage)]
    assert humans == [m.text for m in plain[3] if isinstance(m, HumanMessage)]
    assert humans.count("remember to be nice!") == 5, "every append reached the state"
    last_outer, last_inner, last_sent = outer.seen[-1], inner.requests[-1], model.seen[-1]
    assert len(last_outer) == 4 * 3 + 1, "the outer middleware sees the whole history"
    assert inner.requests[-1] is not outer.requests[-1]
    assert len(last_inner.messages) == len(last_sent) <= 4 + 1, "the inner one sees the window"
    assert last_sent[-1].text == "remember to be nice!" and last_sent[-2].text == "Hello 4"


def test_three_middlewares_other_edits_reach_only_the_model_call(invoke: Invoke) -> None:
    outer, inner, model, messages = run_stack(invoke, SlidingWindow.last_messages(2), "insert", 4)
    assert model.seen[-1][0].text == "inserted by the inner middleware"
    assert inner.requests[-1].messages is not outer.requests[-1].messages
    # The first call covered everything (handed on untouched), as without demote the
    # framework kept that edit; once the window cuts, the edit stays in the model call.
    inserted = [m for m in messages if m.text == "inserted by the inner middleware"]
    assert len(inserted) == 1 and messages[0].text == "inserted by the inner middleware"
    assert len(outer.seen) == 4
