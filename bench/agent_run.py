"""Replay an agent trace through a real ``create_agent``, recording every model request.

The agent is LangChain's own (``langchain.agents.create_agent``) with the middleware under
test; only the chat model and the tools are scripted:

- :class:`ScriptedModel` answers each model call with the trace's next ``AIMessage``
  (tool calls included), whatever it is sent, and records what it was sent: the messages
  (the agent's system prompt first) and the tool definitions bound to it;
- :func:`scripted_tools` makes one tool per name that returns the trace's
  ``ToolMessage`` for the call's arguments (failed ones keep ``status="error"``); a call
  listed in ``hitl`` interrupts for a human first (LangGraph's ``interrupt``), and is
  resumed with the decision given for it (``"reject"`` answers with an error result).

So every middleware's own code runs on the agent's real requests, and what the model
receives is what a provider would be sent. :func:`replay` does the same for a recorded
run (:mod:`bench.real_traces`): its tools answer each call with the recorded result *by
the call's id*, since real runs repeat a call with the same arguments and get different
results. :mod:`bench.agents` and the provider validity
tests share this module.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field, PrivateAttr

from bench.agent_traces import AgentTrace, Request

if TYPE_CHECKING:
    from bench.real_traces import RealTrace

__all__ = [
    "AgentRun",
    "ScriptEnd",
    "ScriptedModel",
    "SummaryModel",
    "replay",
    "run_agent",
    "scripted_tools",
]


class ScriptEnd(RuntimeError):
    """The model was called after its last scripted reply (the recorded run stops there)."""


def _key(name: str, args: Mapping[str, Any]) -> str:
    return name + json.dumps(dict(args), sort_keys=True)


class ScriptedModel(BaseChatModel):
    """Replies with the given ``AIMessage`` objects in order; records every request."""

    replies: list[Any] = Field(default_factory=list)
    seen: list[list[BaseMessage]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    before_reply: Any = None  # Callable[[], None] | None, run before each reply
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _next: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "scripted-agent"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        if not self.tools:
            self.tools.extend(convert_to_openai_tool(t) for t in tools)
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._lock:
            if self._next >= len(self.replies):  # not recorded: nobody answered it
                raise ScriptEnd(
                    f"the script has {len(self.replies)} replies; call {self._next + 1}"
                )
            self.seen.append(list(messages))
            reply = self.replies[self._next].model_copy(deep=True)
            self._next += 1
        if self.before_reply is not None:
            self.before_reply()
        return ChatResult(generations=[ChatGeneration(message=reply)])


class SummaryModel(BaseChatModel):
    """A summarizer's model: answers every call with the same text, records the prompts."""

    text: str = "Summary of the earlier work."
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted-summary"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.seen.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(self.text))])


def scripted_tools(trace: AgentTrace, hitl: Mapping[str, str] | None = None) -> list[BaseTool]:
    """One tool per tool name of ``trace``, answering each call with the trace's result.

    Args:
        trace: The trace whose results the tools return (looked up by tool name and
            arguments, unique per call in the generated traces).
        hitl: Call ids that interrupt for a human first, with the decision they are
            resumed with (``"approve"`` or ``"reject"``).
    """
    from langgraph.types import interrupt

    hitl = dict(hitl or {})
    results: dict[str, ToolMessage] = {}
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in trace.tools}
    for request in trace.requests:
        for step in request.steps:
            by_id = {r.tool_call_id: r for r in step.results}
            for call in step.call.tool_calls:
                if call["id"] in by_id:
                    results[_key(call["name"], call["args"])] = by_id[call["id"]]
                    schemas.setdefault(call["name"], _schema(call["args"]))

    descriptions = {t["function"]["name"]: t["function"]["description"] for t in trace.tools}

    def make(name: str) -> BaseTool:
        def run(**kwargs: Any) -> ToolMessage:
            result = results[_key(name, kwargs)]
            decision = hitl.get(result.tool_call_id)
            if decision is not None and interrupt({"call": result.tool_call_id}) == "reject":
                return ToolMessage(
                    "the user rejected this call",
                    tool_call_id=result.tool_call_id,
                    name=name,
                    status="error",
                )
            return result.model_copy(deep=True)

        return StructuredTool.from_function(
            func=run,
            name=name,
            description=descriptions.get(name, f"The {name} tool."),
            args_schema=schemas[name],
        )

    return [make(name) for name in schemas]


def _schema(args: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {k: {"type": "string"} for k in args},
        "required": sorted(args),
    }


@dataclass
class AgentRun:
    """What one replay recorded."""

    requests: list[list[BaseMessage]]
    tools: list[dict[str, Any]]
    final: list[BaseMessage] = field(default_factory=list)
    interrupts: int = 0


def _abandoned(request: Request, hitl: Mapping[str, str]) -> bool:
    return bool(request.steps) and any(
        hitl.get(c["id"]) == "abandon" for c in request.steps[-1].call.tool_calls
    )


def _replies(trace: AgentTrace, hitl: Mapping[str, str]) -> list[AIMessage]:
    out: list[AIMessage] = []
    for request in trace.requests:
        out.extend(step.call for step in request.steps)
        if not _abandoned(request, hitl):
            out.append(request.answer)
    return out


def run_agent(
    trace: AgentTrace,
    middleware: Sequence[Any] = (),
    *,
    model: ScriptedModel | None = None,
    hitl: Mapping[str, str] | None = None,
    checkpointer: Any = None,
    thread_id: str = "trace",
    before_reply: Callable[[], None] | None = None,
    system_prompt: bool = True,
) -> AgentRun:
    """Run ``trace`` through ``create_agent`` with ``middleware``; record every model request.

    Without a checkpointer each request is invoked with the previous result's messages
    plus the new human message (the caller keeps the history); with one, with the thread
    id, and interrupts are resumed with ``Command(resume=decision)``, except an
    ``"abandon"`` decision: the next request is sent instead, the call left unanswered.
    """
    from langchain.agents import create_agent
    from langgraph.types import Command

    model = model or ScriptedModel()
    hitl = dict(hitl or {})
    model.replies = _replies(trace, hitl)
    model.before_reply = before_reply
    agent = create_agent(
        model,
        scripted_tools(trace, hitl),
        system_prompt=trace.system_prompt if system_prompt else None,
        middleware=list(middleware),
        checkpointer=checkpointer,
    )
    config: dict[str, Any] = {"recursion_limit": 100_000}
    if checkpointer is not None:
        config["configurable"] = {"thread_id": thread_id}
    history: list[BaseMessage] = []
    interrupts = 0
    for request in trace.requests:
        human = HumanMessage(request.human.content)
        payload: Any = {"messages": [human] if checkpointer is not None else [*history, human]}
        state = agent.invoke(payload, config)
        for _ in range(sum(len(s.results) for s in request.steps) + 1):
            pending = state.get("__interrupt__") if isinstance(state, dict) else None
            if not pending:
                break
            interrupts += 1
            decisions = {p.id: hitl.get(p.value["call"], "approve") for p in pending}
            if "abandon" in decisions.values():
                break  # the user sends the next request instead of answering
            state = agent.invoke(Command(resume=decisions), config)
        history = list(state["messages"])
    return AgentRun(model.seen, model.tools, history, interrupts)


def model_requests(run: AgentRun) -> Iterator[list[BaseMessage]]:
    """The recorded requests, oldest first."""
    yield from run.requests


class _ReplayedTool(BaseTool):
    """Answers each call with the recorded result of that call id (arguments unchecked)."""

    results: dict[str, ToolMessage] = Field(default_factory=dict)

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise NotImplementedError("answered by invoke")

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        return self.results[input["id"]].model_copy(deep=True)

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        return self.invoke(input, config)


def replay(
    trace: RealTrace,
    middleware: Sequence[Any] = (),
    *,
    model: ScriptedModel | None = None,
    before_reply: Callable[[], None] | None = None,
) -> AgentRun:
    """Replay a recorded run through ``create_agent`` with ``middleware``, call by call.

    One ``invoke`` per segment, each with the previous result's messages plus the
    segment's human messages (no checkpointer: the caller keeps the history, as
    :func:`run_agent` does). The model answers with the recorded assistant messages in
    order; when the recording stops after a step, the agent's next model call is not
    answered (:class:`ScriptEnd`, not recorded) and the replay ends there.
    """
    from langchain.agents import create_agent

    model = model or ScriptedModel()
    model.replies = trace.replies
    model.before_reply = before_reply
    results = trace.results
    tools = [
        _ReplayedTool(
            name=t["function"]["name"],
            description=t["function"]["description"],
            args_schema=t["function"]["parameters"],
            results=results,
        )
        for t in trace.tools
    ]
    agent = create_agent(model, tools, system_prompt=trace.system, middleware=list(middleware))
    config: dict[str, Any] = {"recursion_limit": 100_000}
    history: list[BaseMessage] = []
    for segment in trace.segments:
        humans = [h.model_copy(deep=True) for h in segment.humans]
        try:
            state = agent.invoke({"messages": [*history, *humans]}, config)
        except ScriptEnd:
            break
        history = list(state["messages"])
    return AgentRun(model.seen, model.tools, history)
