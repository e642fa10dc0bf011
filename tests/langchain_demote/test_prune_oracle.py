"""``prune_state=True`` sends the model exactly what ``prune_state=False`` sends.

Pruning removes what the hook accepted from the agent state; it must change nothing the
model is sent. The property drives random runs of a real ``create_agent`` graph
(``InMemorySaver``, a scripted model whose every tool call has its own id, the
``HumanInTheLoopMiddleware`` for calls a human approves or rejects) twice, once per
setting, and compares every request the model received: tool loops and parallel calls,
a second human message in one turn, interrupts and resumes, time travel to an earlier turn
boundary and into a turn, and restarts (a fresh Demoter and middleware on the same SQLite
state store and checkpointer), under small message and token windows that cut inside
tool turns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from hypothesis import HealthCheck, event, example, given, settings
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import Field

from demote import Backoff, CallbackHook, Demoter, SlidingWindow, SQLiteStateStore
from demote.records import Demotion
from langchain_demote.middleware import DemotingMiddleware
from tests.agent_strategies import (
    Replay,
    Restart,
    ThreadAction,
    ToolCallSpec,
    Travel,
    TurnSpec,
    pruning_policies,
    thread_actions,
)
from tests.langchain_demote.support import ScriptedToolModel

SYSTEM = "You are a test agent."
THREAD = {"configurable": {"thread_id": "t1"}, "recursion_limit": 100}


def _result(q: str, size: int) -> str:
    return f"result of {q}: " + " ".join(f"w{k}" for k in range(size))


@tool
def echo(q: str, size: int) -> str:
    """Answer a query at once."""
    return _result(q, size)


@tool
def risky(q: str, size: int) -> str:
    """Answer a query once a human approved it."""
    return _result(q, size)


class PlannedModel(ScriptedToolModel):
    """Replies from a plan, not from what it is sent (so both runs are asked the same).

    ``plan`` holds the steps of the running turn, then its answer; every tool call gets a
    new id (``call-<n>``), and ``decisions`` maps it to what the human says, for a risky
    one. Every request it receives is recorded in ``calls``; ``bind_tools`` returns it.
    """

    plan: list[Any] = Field(default_factory=list)
    serial: int = 0
    decisions: dict[str, str] = Field(default_factory=dict)

    def reply(self, messages: list[BaseMessage], last_human: int) -> AIMessage:
        if not self.plan:
            return AIMessage("nothing left to do")
        item = self.plan.pop(0)
        if isinstance(item, str):
            return AIMessage(item)
        calls = []
        for spec in item:
            assert isinstance(spec, ToolCallSpec)
            self.serial += 1
            call_id = f"call-{self.serial}"
            self.decisions[call_id] = spec.decision
            args = {"q": call_id, "size": spec.size}
            calls.append({"name": spec.tool, "args": args, "id": call_id, "type": "tool_call"})
        return AIMessage(f"step {self.serial}", tool_calls=calls)


def sent(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """A request as the provider would get it: everything but LangGraph's message ids."""
    return [m.model_dump(exclude={"id"}) for m in messages]


class AgentThread:
    """One agent thread under one ``prune_state`` setting, restartable on its files."""

    def __init__(self, policy: SlidingWindow, prune: bool, tmp: Path) -> None:
        self.policy = policy
        self.prune = prune
        self.path = tmp / f"state-{'pruned' if prune else 'kept'}.db"
        self.saver = InMemorySaver()
        self.model = PlannedModel()
        self.delivered: list[str] = []
        self.demoter: Demoter | None = None
        self.start()

    def start(self) -> None:
        """(Re)build the Demoter, middleware and agent: the same state file and checkpointer."""
        if self.demoter is not None:
            self.demoter.close()
        self.demoter = Demoter(
            self.policy,
            CallbackHook(self._deliver),
            state=SQLiteStateStore(self.path),
            retry=Backoff(0, 0),
        )
        middleware = DemotingMiddleware(self.demoter, prune_state=self.prune)
        self.agent = create_agent(
            self.model,
            [echo, risky],
            system_prompt=SYSTEM,
            checkpointer=self.saver,
            middleware=[middleware, HumanInTheLoopMiddleware(interrupt_on={"risky": True})],
        )

    def _deliver(self, batch: Demotion) -> None:
        self.delivered.extend(m.key for m in batch.messages)

    def close(self) -> None:
        if self.demoter is not None:
            self.demoter.close()

    def generation(self) -> int:
        """The demotion state's generation: moved on by a re-sync or a re-seed."""
        assert self.demoter is not None
        return self.demoter.state_of(THREAD["configurable"]["thread_id"]).generation

    def act(self, action: ThreadAction) -> None:
        if isinstance(action, Restart):
            self.start()
        elif isinstance(action, TurnSpec):
            self._run(action, self._input(action), THREAD)
        elif isinstance(action, Travel):
            boundaries = [s for s in self._history() if not s.next]
            if boundaries:
                at = boundaries[min(action.back, len(boundaries) - 1)]
                self._run(action.turn, self._input(action.turn), at.config)
        else:
            assert isinstance(action, Replay)
            points = [s for s in self._history() if s.next == ("model",)]
            if points:
                at = points[min(action.back, len(points) - 1)]
                self._run(action.turn, None, at.config)

    def _history(self) -> list[Any]:
        return list(self.agent.get_state_history(THREAD))

    @staticmethod
    def _input(turn: TurnSpec) -> dict[str, Any]:
        return {"messages": [HumanMessage(h) for h in turn.humans]}

    def _run(self, turn: TurnSpec, payload: Any, config: Any) -> None:
        self.model.plan = [*turn.steps, turn.answer]
        out = self.agent.invoke(payload, {**THREAD, **config})
        for _ in range(50):  # one resume per interrupting step, at most
            interrupts = out.get("__interrupt__") if isinstance(out, dict) else None
            if not interrupts:
                return
            asked = interrupts[0].value["action_requests"]
            decisions = [
                {"type": "approve"}
                if self.model.decisions.get(a["args"]["q"]) == "approve"
                else {"type": "reject", "message": "no"}
                for a in asked
            ]
            out = self.agent.invoke(Command(resume={"decisions": decisions}), THREAD)
        raise AssertionError("the run kept interrupting")


def check_pairs(messages: list[BaseMessage]) -> None:
    """Every tool result the model is sent has its call, every answered call its result."""
    opened = {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    assert answered <= opened, f"results without their call: {answered - opened}"


def run_both(policy: SlidingWindow, actions: list[ThreadAction], tmp: Path) -> int:
    """Run ``actions`` on a kept and a pruned thread; how many model calls were compared.

    Exactly, until a time travel went back before the window start (either thread's
    demotion state moved to a new generation): a kept thread then plans its whole history
    afresh, which may show messages the pruned checkpoint no longer has, while a pruned
    thread starts again after its pruned prefix. From there on each pruned request is
    checked to be well-formed only.
    """
    threads = [AgentThread(policy, False, tmp), AgentThread(policy, True, tmp)]
    exact = True
    compared = 0
    try:
        for n, action in enumerate(actions):
            done = len(threads[0].model.calls)
            for thread in threads:
                thread.act(action)
            kept, pruned = (t.model.calls for t in threads)
            assert len(pruned) == len(kept), f"after action {n}: {len(pruned)} model calls"
            exact = exact and all(t.generation() == 0 for t in threads)
            for i in range(done, len(kept)):
                if exact:
                    assert sent(pruned[i]) == sent(kept[i]), f"model call {i} (action {n})"
                    compared += 1
                else:
                    check_pairs(pruned[i])
    finally:
        for thread in threads:
            thread.close()
    return compared


def _steps(
    *sizes: int, tool: Literal["echo", "risky"] = "echo"
) -> tuple[tuple[ToolCallSpec, ...], ...]:
    return tuple((ToolCallSpec(tool, size),) for size in sizes)


HUMANS = ("request 0", "also, request 0b")
# Issue 31's reproducer: two one-call steps a turn, four messages kept; the third
# invoke re-planned for the opener from position 0, which was pruned.
ISSUE_31 = [TurnSpec(("q",), _steps(1, 1), f"a{t}") for t in range(3)]
# Time travel inside a turn to a checkpoint whose history ends at the window start: that
# window is empty (no opener shown), and the prune that followed it removed the opener
# the next model call is sent.
REPLAY_TO_WINDOW_START = [
    TurnSpec(HUMANS, (), "a0"),
    TurnSpec(HUMANS, _steps(0, 0, tool="risky"), "a1"),
    Replay(1, TurnSpec(HUMANS, _steps(0, tool="risky"), "a2")),
]


@example(policy=SlidingWindow.last_messages(4), actions=ISSUE_31)
@example(policy=SlidingWindow.last_messages(2), actions=REPLAY_TO_WINDOW_START)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(policy=pruning_policies(), actions=thread_actions())
def test_pruning_sends_the_model_what_keeping_sends(
    policy: SlidingWindow, actions: list[ThreadAction], tmp_path_factory: Any
) -> None:
    compared = run_both(policy, actions, tmp_path_factory.mktemp("oracle"))
    event("model calls compared exactly: " + ("none" if not compared else "some"))
