"""Deterministic agent traces, generated offline, as LangChain messages.

An agent trace is what a LangChain agent's state holds after a run: per request, one
``HumanMessage``, then tool *steps* (an ``AIMessage`` with ``tool_calls`` and one
``ToolMessage`` per call, parallel calls included), then the final ``AIMessage``. The
system prompt and the tool definitions are kept apart (``create_agent`` puts the system
prompt in front of the messages at each model call; the tools are bound to the model).

The traces of the agent benchmark (:func:`benchmark_traces`):

- ``long_request``: one request, 200 tool steps, results of 200 to 5,000 tokens;
- ``many_requests``: 20 requests of 20 steps each;
- ``parallel``: steps of 2 to 5 parallel calls;
- ``oversized``: a short request whose results include single ones of 21,000 tokens
  (real tool results reach that size).

Sizes are in the tokens of LangChain's ``count_tokens_approximately`` (4 characters a
token): a result of ``n`` tokens has ``4 * n`` characters of text. Everything derives
from a seed with :class:`random.Random`, so a trace is the same on every machine.

:func:`model_calls` is the per-model-call replay: the messages the agent has at each
model call (everything before each ``AIMessage``). Tests import this module
(``bench.agent_traces``) for the same traces.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

__all__ = [
    "SYSTEM_PROMPT",
    "TOOLS",
    "AgentTrace",
    "Request",
    "Step",
    "benchmark_traces",
    "long_request",
    "many_requests",
    "model_calls",
    "oversized",
    "parallel",
    "summary",
    "text_of",
]

_TEXT = (
    "def class return import self value result error path file line test assert config "
    "module function request response status index token window cache buffer record "
    "query table column schema commit branch merge build deploy service client server "
    "thread lock queue event handler parser output input stream retry timeout limit"
)
_WORDS = _TEXT.split(" ")

SYSTEM_PROMPT = (
    "You are a coding agent working in a repository. Use the tools to read files, search "
    "the code, run commands and tests, and edit files. Think step by step, check your "
    "work by running the tests, and answer with a short report of what you changed."
)

#: The agent's tool definitions (OpenAI function format, as ``bind_tools`` sends them).
TOOLS: tuple[dict[str, Any], ...] = tuple(
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    arg: {"type": "string", "description": arg_doc},
                    **({"content": {"type": "string"}} if name == "write_file" else {}),
                },
                "required": [arg, *(["content"] if name == "write_file" else [])],
            },
        },
    }
    for name, description, arg, arg_doc in (
        ("read_file", "Read a file of the repository.", "path", "path from the root"),
        ("search_code", "Search the repository for a pattern.", "pattern", "a regex"),
        ("run_command", "Run a shell command in the repository.", "command", "the command"),
        ("write_file", "Write a file of the repository.", "path", "path from the root"),
    )
)
_TOOL_ARGS = {
    t["function"]["name"]: next(iter(t["function"]["parameters"]["properties"])) for t in TOOLS
}


def text_of(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of code-like text (``4 * tokens`` characters)."""
    chars = max(1, 4 * tokens)
    parts: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS)
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts)[:chars]


@dataclass(frozen=True, slots=True)
class Step:
    """One model call that asks for tools, and the results that answer it."""

    call: AIMessage
    results: tuple[ToolMessage, ...]


@dataclass(frozen=True, slots=True)
class Request:
    """One user request: the human message, the tool steps, the final answer."""

    human: HumanMessage
    steps: tuple[Step, ...]
    answer: AIMessage

    def messages(self) -> list[BaseMessage]:
        """The request's messages in order."""
        out: list[BaseMessage] = [self.human]
        for step in self.steps:
            out.append(step.call)
            out.extend(step.results)
        out.append(self.answer)
        return out


@dataclass(frozen=True, slots=True)
class AgentTrace:
    """A whole agent run: requests, plus the system prompt and tools kept apart."""

    name: str
    requests: tuple[Request, ...]
    system_prompt: str = SYSTEM_PROMPT
    tools: tuple[dict[str, Any], ...] = field(default=TOOLS)

    def messages(self) -> list[BaseMessage]:
        """Every message of the run, in order (without the system prompt)."""
        return [m for r in self.requests for m in r.messages()]

    @property
    def steps(self) -> int:
        """How many tool steps the run makes."""
        return sum(len(r.steps) for r in self.requests)

    @property
    def calls(self) -> int:
        """How many model calls the run makes (one per step, one per answer)."""
        return self.steps + len(self.requests)


def model_calls(trace: AgentTrace) -> Iterator[list[BaseMessage]]:
    """The messages the agent has at each model call, in order (system prompt apart).

    A request's first call sees its history up to and including its human message; each
    later call sees everything up to the previous step's last result.
    """
    history: list[BaseMessage] = []
    for request in trace.requests:
        history.append(request.human)
        for step in request.steps:
            yield list(history)
            history.append(step.call)
            history.extend(step.results)
        yield list(history)
        history.append(request.answer)


class _Builder:
    """Makes the messages of one trace, with ids and texts from one seeded generator."""

    def __init__(self, name: str, seed: int) -> None:
        self.name = name
        self.rng = random.Random(seed)
        self.calls = 0

    def step(self, sizes: Sequence[int], *, note: int = 12, fail: float = 0.0) -> Step:
        calls = []
        results = []
        for size in sizes:
            self.calls += 1
            tool = self.rng.choice(TOOLS)["function"]["name"]
            call_id = f"{self.name}-call-{self.calls}"
            arg = _TOOL_ARGS[tool]
            value = f"src/pkg_{self.calls % 17}/mod_{self.calls}.py"
            if tool == "write_file":
                args: dict[str, Any] = {arg: value, "content": text_of(self.rng, size // 4)}
            else:
                args = {arg: value}
            calls.append({"name": tool, "args": args, "id": call_id, "type": "tool_call"})
            failed = self.rng.random() < fail
            results.append(
                ToolMessage(
                    f"error: {text_of(self.rng, 40)}" if failed else text_of(self.rng, size),
                    tool_call_id=call_id,
                    name=tool,
                    status="error" if failed else "success",
                )
            )
        thought = text_of(self.rng, note)
        return Step(AIMessage(thought, tool_calls=calls), tuple(results))

    def request(self, ask: int, steps: list[Step]) -> Request:
        human = HumanMessage(f"Request: {text_of(self.rng, ask)}")
        answer = AIMessage(f"Done. {text_of(self.rng, 60)}")
        return Request(human, tuple(steps), answer)


def long_request(
    steps: int = 200, *, low: int = 200, high: int = 5_000, seed: int = 1
) -> AgentTrace:
    """One request that makes ``steps`` tool calls, results of ``low`` to ``high`` tokens."""
    b = _Builder("long", seed)
    made = [b.step([b.rng.randint(low, high)], fail=0.03) for _ in range(steps)]
    return AgentTrace("long_request", (b.request(80, made),))


def many_requests(
    requests: int = 20, steps: int = 20, *, low: int = 200, high: int = 2_000, seed: int = 2
) -> AgentTrace:
    """``requests`` requests of ``steps`` tool steps each, results of ``low``-``high`` tokens."""
    b = _Builder("many", seed)
    out = []
    for _ in range(requests):
        made = [b.step([b.rng.randint(low, high)], fail=0.03) for _ in range(steps)]
        out.append(b.request(60, made))
    return AgentTrace("many_requests", tuple(out))


def parallel(
    steps: int = 40,
    *,
    width: tuple[int, int] = (2, 5),
    low: int = 100,
    high: int = 1_500,
    seed: int = 3,
) -> AgentTrace:
    """One request of ``steps`` steps, each of ``width`` parallel calls."""
    b = _Builder("parallel", seed)
    made = [
        b.step([b.rng.randint(low, high) for _ in range(b.rng.randint(*width))], fail=0.05)
        for _ in range(steps)
    ]
    return AgentTrace("parallel", (b.request(80, made),))


def oversized(
    steps: int = 30,
    *,
    big: int = 21_000,
    every: int = 10,
    low: int = 200,
    high: int = 1_500,
    seed: int = 4,
) -> AgentTrace:
    """One request of ``steps`` steps; every ``every``-th result alone is ``big`` tokens."""
    b = _Builder("oversized", seed)
    made = [
        b.step([big if i % every == every // 2 else b.rng.randint(low, high)]) for i in range(steps)
    ]
    return AgentTrace("oversized", (b.request(80, made),))


def benchmark_traces(*, quick: bool = False) -> list[AgentTrace]:
    """The traces of the agent benchmark (``quick``: small versions, for the smoke test)."""
    if quick:
        return [
            long_request(12, high=2_000),
            many_requests(3, 4),
            parallel(6),
            oversized(6, every=3),
        ]
    return [long_request(), many_requests(), parallel(), oversized()]


def summary(trace: AgentTrace) -> dict[str, Any]:
    """What a trace holds: requests, steps, calls, messages, tokens (chars / 4)."""
    messages = trace.messages()
    chars = sum(
        len(str(m.content)) + len(json.dumps(getattr(m, "tool_calls", []))) for m in messages
    )
    return {
        "trace": trace.name,
        "requests": len(trace.requests),
        "steps": trace.steps,
        "model_calls": trace.calls,
        "messages": len(messages),
        "tokens": chars // 4,
    }
