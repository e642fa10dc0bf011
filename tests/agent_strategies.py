"""Hypothesis strategies for random agent runs, as LangChain messages.

An :class:`AgentScript` is a random :class:`~bench.agent_traces.AgentTrace` (requests of
tool steps: one or several parallel calls, results answered in any order, some failed with
``status="error"``, some assistant messages streamed as merged ``AIMessageChunk`` objects)
plus the human-in-the-loop decisions of some calls: ``"approve"`` or ``"reject"`` (the
run interrupts before the tool runs and is resumed) or ``"abandon"`` (the run interrupts
and the user sends the next request instead, leaving the call unanswered; only the last
step of a request, and only when :func:`agent_scripts` is asked for it).

:func:`events` turns a script into what a custom agent loop does to its history: add a
message, read the history at an interrupt, or call the model. :func:`agent_policies`
draws every eviction strategy, every unit, and optionally clearing.

For whole ``create_agent`` runs on a checkpointed thread, :func:`thread_actions` draws what
happens to the thread: turns (:class:`TurnSpec`: tool steps, parallel calls, calls a human
approves or rejects, a second human message), time travel to an earlier turn boundary
(:class:`Travel`) or into a turn (:class:`Replay`), and restarts (:class:`Restart`);
:func:`pruning_policies` draws small windows that cut inside those turns.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)

from bench.agent_traces import AgentTrace, Request, Step, text_of
from demote import Bulk, Compact, PerItem, SlidingWindow
from demote.window.policy import ClearToolResults

__all__ = [
    "AgentScript",
    "Replay",
    "Restart",
    "ThreadAction",
    "ToolCallSpec",
    "Travel",
    "TurnSpec",
    "agent_policies",
    "agent_scripts",
    "events",
    "pruning_policies",
    "streamed",
    "thread_actions",
    "tool_call_specs",
    "turn_specs",
]

Decision = Literal["approve", "reject", "abandon"]
Event = tuple[Literal["add", "read", "call"], BaseMessage | None]

TOOL_NAMES = ("read_file", "search_code", "run_command")
TOOLS = tuple(
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
            },
        },
    }
    for name in TOOL_NAMES
)


@dataclass(frozen=True)
class AgentScript:
    """A random agent run and the human decisions of its interrupting calls."""

    trace: AgentTrace
    hitl: dict[str, Decision] = field(default_factory=dict)

    def abandoned(self, request: Request) -> bool:
        """Whether the request ends with a call the user left unanswered."""
        return bool(request.steps) and any(
            self.hitl.get(c["id"]) == "abandon" for c in request.steps[-1].call.tool_calls
        )


def streamed(message: AIMessage, parts: int = 2) -> AIMessageChunk:
    """``message`` as a model streams it: chunks of text and tool-call arguments, merged."""
    text = str(message.content)
    cut = len(text) // parts
    chunks = [
        AIMessageChunk(content=text[i * cut : (i + 1) * cut if i < parts - 1 else None])
        for i in range(parts)
    ]
    for index, call in enumerate(message.tool_calls):
        args = json.dumps(call["args"])
        half = len(args) // 2
        chunks.append(
            AIMessageChunk(
                content="",
                tool_call_chunks=[
                    {"name": call["name"], "args": args[:half], "id": call["id"], "index": index}
                ],
            )
        )
        chunks.append(
            AIMessageChunk(
                content="",
                tool_call_chunks=[{"name": None, "args": args[half:], "id": None, "index": index}],
            )
        )
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    return merged


_sizes = st.integers(1, 300)


@st.composite
def _step(draw: st.DrawFn, serial: Iterator[int], tag: str) -> tuple[Step, list[str]]:
    width = draw(st.sampled_from([1, 1, 1, 2, 3]))
    calls: list[dict[str, Any]] = []
    results: list[ToolMessage] = []
    for _ in range(width):
        n = next(serial)
        name = draw(st.sampled_from(TOOL_NAMES))
        call_id = f"{tag}-c{n}"
        calls.append(
            {"name": name, "args": {"q": f"query {n}"}, "id": call_id, "type": "tool_call"}
        )
        failed = draw(st.integers(0, 5)) == 0
        size = draw(_sizes)
        results.append(
            ToolMessage(
                ("error: " if failed else "") + text_of(random.Random(n), size),
                tool_call_id=call_id,
                name=name,
                status="error" if failed else "success",
            )
        )
    order = draw(st.permutations(list(range(width))))
    call = AIMessage(
        text_of(random.Random(-next(serial)), draw(st.integers(0, 30))), tool_calls=calls
    )
    if draw(st.integers(0, 3)) == 0:
        call = streamed(call)  # type: ignore[assignment]
    return Step(call, tuple(results[i] for i in order)), [c["id"] for c in calls]


@st.composite
def agent_scripts(
    draw: st.DrawFn,
    *,
    max_requests: int = 4,
    max_steps: int = 8,
    hitl: bool = True,
    abandon: bool = False,
) -> AgentScript:
    """A random agent run (see the module docstring).

    Args:
        max_requests: Most requests in the run.
        max_steps: Most tool steps in one request.
        hitl: Some calls interrupt for a human (approved or rejected on resume).
        abandon: Some requests end with a call the user never answered.
    """
    serial = itertools.count()
    tag = f"s{draw(st.integers(0, 10**6))}"
    requests: list[Request] = []
    decisions: dict[str, Decision] = {}
    n_requests = draw(st.integers(2 if abandon else 1, max(max_requests, 2 if abandon else 1)))
    for r in range(n_requests):
        made = []
        n_steps = draw(st.integers(0, max_steps))
        for s in range(n_steps):
            step, ids = draw(_step(serial, tag))
            made.append(step)
            if hitl and draw(st.integers(0, 5)) == 0:
                last = s == n_steps - 1 and r < n_requests - 1
                choices: list[Decision] = ["approve", "reject"] + (
                    ["abandon"] if abandon and last else []
                )
                decisions[ids[0]] = draw(st.sampled_from(choices))
        human = HumanMessage(f"request {r}: " + text_of(random.Random(r), draw(st.integers(1, 80))))
        answer = AIMessage(
            f"answer {r}: " + text_of(random.Random(r + 99), draw(st.integers(1, 60)))
        )
        if draw(st.integers(0, 4)) == 0:
            answer = streamed(answer)
        requests.append(Request(human, tuple(made), answer))
    if abandon and n_requests > 1 and "abandon" not in decisions.values():
        # Make sure the property is exercised: the first request ends with an abandoned call.
        first = requests[0]
        step, ids = draw(_step(serial, tag))
        requests[0] = Request(first.human, (*first.steps, step), first.answer)
        decisions[ids[0]] = "abandon"
    trace = AgentTrace(
        f"random-{tag}", tuple(requests), system_prompt="You are a test agent.", tools=TOOLS
    )
    return AgentScript(trace, decisions)


def events(script: AgentScript) -> Iterator[Event]:
    """What a custom agent loop does to its history, in order.

    ``("add", message)`` appends to the history; ``("read", None)`` reads it at an
    interrupt (the model is not called); ``("call", None)`` is a model call.
    """
    for request in script.trace.requests:
        yield "add", request.human
        abandoned = script.abandoned(request)
        for i, step in enumerate(request.steps):
            yield "call", None
            yield "add", step.call
            asked = [c["id"] for c in step.call.tool_calls if c["id"] in script.hitl]
            if asked:
                yield "read", None
            if abandoned and i == len(request.steps) - 1:
                break
            for result in step.results:
                if script.hitl.get(result.tool_call_id) == "reject":
                    result = ToolMessage(
                        "the user rejected this call",
                        tool_call_id=result.tool_call_id,
                        name=result.name,
                        status="error",
                    )
                yield "add", result
        else:
            yield "call", None
            yield "add", request.answer


@st.composite
def agent_policies(draw: st.DrawFn, *, clearing: bool | None = None) -> SlidingWindow:
    """A window of any unit and eviction strategy, sized for :func:`agent_scripts` runs.

    Args:
        clearing: ``True``: always with :class:`ClearToolResults`; ``False``: never;
            ``None``: either.
    """
    unit = draw(st.sampled_from(["messages", "turns", "tokens"]))
    limit = draw(
        {
            "messages": st.integers(2, 16),
            "turns": st.integers(1, 3),
            "tokens": st.integers(100, 1500),
        }[unit]
    )
    top = {"messages": 6, "turns": 2, "tokens": 400}[unit]
    eviction = draw(
        st.one_of(
            st.just(PerItem()),
            st.builds(Bulk, overflow=st.integers(0, top)),
            st.builds(Compact, compact_count=st.integers(1, top)),
        )
    )
    clear = draw(st.booleans()) if clearing is None else clearing
    stage = None
    if clear:
        stage = ClearToolResults(
            trigger=draw(st.integers(0, 800)),
            keep=draw(st.integers(0, 3)),
            exclude=tuple(draw(st.lists(st.sampled_from(TOOL_NAMES), max_size=1))),
            clear_at_least=draw(st.integers(0, 300)),
        )
    return SlidingWindow(unit=unit, limit=limit, eviction=eviction, clearing=stage)


# -- whole agent runs on a checkpointed thread (create_agent), for differential tests ------


@dataclass(frozen=True)
class ToolCallSpec:
    """One tool call a scripted model makes: which tool, how long its result, the verdict.

    ``tool`` is ``"echo"`` (runs at once) or ``"risky"`` (a human approves or rejects it
    first: the run interrupts and is resumed with ``decision``).
    """

    tool: Literal["echo", "risky"]
    size: int
    decision: Literal["approve", "reject"] = "approve"


@dataclass(frozen=True)
class TurnSpec:
    """One ``invoke``: its human messages (two: an interjection), the steps, the answer.

    Each step is one assistant message whose calls (one, or several in parallel) the tool
    node answers.
    """

    humans: tuple[str, ...]
    steps: tuple[tuple[ToolCallSpec, ...], ...]
    answer: str


@dataclass(frozen=True)
class Travel:
    """Time travel: continue the thread from its ``back``-th newest turn boundary."""

    back: int
    turn: TurnSpec


@dataclass(frozen=True)
class Replay:
    """Time travel inside a turn: re-run from the ``back``-th newest checkpoint whose next
    node is the model (``invoke(None, that_config)``), the model taking ``steps`` from there.
    """

    back: int
    turn: TurnSpec


@dataclass(frozen=True)
class Restart:
    """A new process: a fresh Demoter and middleware on the same durable state store and
    checkpointer."""


ThreadAction = TurnSpec | Travel | Replay | Restart


@st.composite
def tool_call_specs(draw: st.DrawFn, *, hitl: bool = True) -> ToolCallSpec:
    """One call: mostly ``echo``; with ``hitl``, sometimes a ``risky`` one to approve."""
    risky = hitl and draw(st.integers(0, 4)) == 0
    return ToolCallSpec(
        "risky" if risky else "echo",
        draw(st.integers(0, 60)),
        draw(st.sampled_from(["approve", "approve", "reject"])),
    )


@st.composite
def turn_specs(draw: st.DrawFn, *, max_steps: int = 5, hitl: bool = True) -> TurnSpec:
    """One turn: one human message (sometimes two), 0 to ``max_steps`` tool steps."""
    n = draw(st.integers(0, 10**6))
    humans = (f"request {n}: " + text_of(random.Random(n), draw(st.integers(1, 40))),)
    if draw(st.integers(0, 4)) == 0:
        humans = (*humans, f"also, request {n}b: " + text_of(random.Random(-n), 12))
    steps = draw(
        st.lists(
            st.lists(tool_call_specs(hitl=hitl), min_size=1, max_size=3).map(tuple),
            max_size=max_steps,
        )
    )
    return TurnSpec(humans, tuple(steps), f"answer {n}: " + text_of(random.Random(n + 7), 10))


@st.composite
def thread_actions(
    draw: st.DrawFn,
    *,
    max_actions: int = 8,
    max_steps: int = 5,
    hitl: bool = True,
    travel: bool = True,
    restart: bool = True,
) -> list[ThreadAction]:
    """What happens to one agent thread: turns, with time travel and restarts between.

    The first action is a turn; a ``Travel``, ``Replay`` or ``Restart`` comes only after
    one (the thread then has checkpoints to go back to).
    """
    actions: list[ThreadAction] = [draw(turn_specs(max_steps=max_steps, hitl=hitl))]
    kinds = ["turn", "turn", "turn"]
    if travel:
        kinds += ["travel", "replay"]
    if restart:
        kinds.append("restart")
    for _ in range(draw(st.integers(1, max_actions - 1))):
        kind = draw(st.sampled_from(kinds))
        turn = draw(turn_specs(max_steps=max_steps, hitl=hitl))
        if kind == "turn":
            actions.append(turn)
        elif kind == "travel":
            actions.append(Travel(draw(st.integers(1, 3)), turn))
        elif kind == "replay":
            actions.append(Replay(draw(st.integers(1, 6)), turn))
        else:
            actions.append(Restart())
    return actions


@st.composite
def pruning_policies(draw: st.DrawFn) -> SlidingWindow:
    """Small windows (messages or tokens, per item or in bulk) that cut inside tool turns."""
    unit = draw(st.sampled_from(["messages", "messages", "tokens", "turns"]))
    limit = draw(
        {
            "messages": st.integers(2, 8),
            "tokens": st.integers(40, 400),
            "turns": st.integers(1, 2),
        }[unit]
    )
    top = {"messages": 4, "tokens": 150, "turns": 1}[unit]
    eviction = draw(st.one_of(st.just(PerItem()), st.builds(Bulk, overflow=st.integers(0, top))))
    stage = None
    if draw(st.integers(0, 3)) == 0:
        stage = ClearToolResults(
            trigger=draw(st.integers(0, 200)),
            keep=draw(st.integers(0, 2)),
            clear_at_least=draw(st.integers(0, 100)),
        )
    return SlidingWindow(unit=unit, limit=limit, eviction=eviction, clearing=stage)
