"""Recorded agent runs (``../shared/data/agent_traces``), split into what ``create_agent`` replays.

A file holds one run as LangChain messages: an optional ``SystemMessage``, then
``HumanMessage``s, ``AIMessage``s with tool calls and the ``ToolMessage``s answering them
(see the data's README). The replay (:func:`bench.agent_run.replay`) gives the system
prompt to ``create_agent`` and starts one ``invoke`` per run of human messages, so a run
replays when the agent loop could have produced it:

- after the human messages, the agent's messages are steps (an assistant message with
  tool calls, then exactly one result per call) ending with an assistant message without
  calls, which ends the loop; the last invoke may end after a step instead (the recording
  stops there, so does the replay);
- a human message right after tool results cannot be replayed: the loop calls the model
  there, a user cannot speak (2 OpenHands runs, whose harness injected an error);
- an assistant message without calls followed by another assistant message cannot be
  either.

:func:`load` reads the directory and says which runs are left out and why;
:func:`chain` joins runs into longer ones (the "long runs" table of section 7).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
)
from langchain_core.messages.utils import count_tokens_approximately

__all__ = [
    "DEFAULT_DIR",
    "HELD_OUT",
    "SESSIONS_DIR",
    "RealTrace",
    "Segment",
    "chain",
    "held_out",
    "load",
    "parse",
    "sessions_dir",
    "shown",
    "traces_dir",
]

#: ``shared/data/agent_traces`` beside the project's checkout (CI has ``shared/`` there).
DEFAULT_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "agent_traces"


#: ``shared/data/agent_sessions`` (long sessions, issue 36) beside the project's checkout.
SESSIONS_DIR = DEFAULT_DIR.parent / "agent_sessions"

#: Owners of the session repositories kept out of tuning (issue 36): the development
#: sessions are split by owner (crc32 of the lower-cased owner, bucket 1 of 4), so the
#: figures of these say how the window generalises to repositories it was not tuned on.
HELD_OUT = frozenset({"esmael-abdlkadr", "fraol-m", "kalom60", "netnaho", "wendirad", "switch247"})


def traces_dir() -> Path:
    """Where the recorded runs are: ``$DEMOTE_AGENT_TRACES`` or :data:`DEFAULT_DIR`."""
    return Path(os.environ.get("DEMOTE_AGENT_TRACES", DEFAULT_DIR))


def sessions_dir() -> Path:
    """Where the long sessions are: ``$DEMOTE_AGENT_SESSIONS`` or :data:`SESSIONS_DIR`."""
    return Path(os.environ.get("DEMOTE_AGENT_SESSIONS", SESSIONS_DIR))


def shown(path: Path) -> str:
    """``path`` as a result records it: relative to the checkout (no machine's layout)."""
    return os.path.relpath(path, Path(__file__).resolve().parents[1])


def held_out(trace: RealTrace) -> bool:
    """Is ``trace`` a session of a repository kept out of tuning (:data:`HELD_OUT`)?"""
    return trace.owner in HELD_OUT


@dataclass(frozen=True, slots=True)
class Segment:
    """One ``invoke``: the human messages sent, then what the agent did."""

    humans: tuple[HumanMessage, ...]
    agent: tuple[BaseMessage, ...]


@dataclass(frozen=True)
class RealTrace:
    """One recorded run, ready to replay.

    Attributes:
        name: The file's stem (or the chained runs' names).
        system: The system prompt, if the run had one.
        messages: The whole run in order, system prompt first (grounding's reference).
        segments: One per ``invoke``.
        tools: Tool definitions (OpenAI format) built from the calls' names and argument
            keys; the recordings keep no schemas.
        owner: The lower-cased owner of the source repository, when the file names one.
    """

    name: str
    system: str | None
    messages: tuple[BaseMessage, ...]
    segments: tuple[Segment, ...]
    tools: tuple[dict[str, Any], ...] = field(default=())
    owner: str = ""

    @property
    def replies(self) -> list[AIMessage]:
        """The model's answers, in call order."""
        return [m for s in self.segments for m in s.agent if isinstance(m, AIMessage)]

    @property
    def results(self) -> dict[str, ToolMessage]:
        """Every tool result, by the id of the call it answers."""
        return {
            m.tool_call_id: m for s in self.segments for m in s.agent if isinstance(m, ToolMessage)
        }

    def summary(self) -> dict[str, Any]:
        """Size figures of the run."""
        return {
            "trace": self.name,
            "messages": len(self.messages),
            "invokes": len(self.segments),
            "model_calls": len(self.replies),
            "tool_calls": sum(len(a.tool_calls) for a in self.replies),
            "tokens": count_tokens_approximately(list(self.messages)),
        }


def _tools(messages: Sequence[BaseMessage]) -> tuple[dict[str, Any], ...]:
    keys: dict[str, dict[str, None]] = {}
    for m in messages:
        for call in getattr(m, "tool_calls", ()):
            keys.setdefault(call["name"], {}).update(dict.fromkeys(call["args"]))
    return tuple(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"The {name} tool.",
                "parameters": {
                    "type": "object",
                    "properties": {k: {"type": "string"} for k in args},
                },
            },
        }
        for name, args in keys.items()
    )


def parse(name: str, messages: Sequence[BaseMessage], owner: str = "") -> RealTrace:
    """Split a recorded run into invokes; :class:`ValueError` says why it cannot replay."""
    system = None
    rest = list(messages)
    if rest and isinstance(rest[0], SystemMessage):
        system = str(rest.pop(0).content)
    if any(isinstance(m, SystemMessage) for m in rest):
        raise ValueError("a system message after the first message")
    segments: list[Segment] = []
    i = 0
    while i < len(rest):
        humans: list[HumanMessage] = []
        while i < len(rest) and isinstance(rest[i], HumanMessage):
            humans.append(rest[i])  # type: ignore[arg-type]
            i += 1
        if not humans:
            raise ValueError(f"message {i}: {rest[i].type} where a human message starts an invoke")
        agent: list[BaseMessage] = []
        ended = False
        while i < len(rest) and not isinstance(rest[i], HumanMessage):
            m = rest[i]
            if ended:
                raise ValueError(f"message {i}: {m.type} after an answer without tool calls")
            if not isinstance(m, AIMessage):
                raise ValueError(f"message {i}: a tool result without its call just before")
            ids = [c["id"] for c in m.tool_calls]
            results = rest[i + 1 : i + 1 + len(ids)]
            if [getattr(r, "tool_call_id", None) for r in results] != ids:
                raise ValueError(f"message {i}: the calls are not answered in order after it")
            agent += [m, *results]
            i += 1 + len(ids)
            ended = not ids
        if not ended and i < len(rest):
            raise ValueError(f"message {i}: a human message right after tool results")
        segments.append(Segment(tuple(humans), tuple(agent)))
    return RealTrace(name, system, tuple(messages), tuple(segments), _tools(messages), owner)


def load(
    directory: Path | None = None, limit: int | None = None
) -> tuple[list[RealTrace], dict[str, str]]:
    """The replayable runs of ``directory`` (sorted by name) and why the others are not."""
    directory = directory or traces_dir()
    paths = sorted(directory.glob("*.json"))
    if not paths:
        raise SystemExit(f"no agent traces in {directory} (set DEMOTE_AGENT_TRACES)")
    out: list[RealTrace] = []
    skipped: dict[str, str] = {}
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        messages = messages_from_dict(data["messages"])
        repo = str((data.get("source") or {}).get("repo") or "")
        try:
            out.append(parse(path.stem, messages, repo.split("/")[0].lower()))
        except ValueError as exc:
            skipped[path.stem] = str(exc)
    return out[:limit], skipped


def _renamed(message: BaseMessage, prefix: str) -> BaseMessage:
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = [{**c, "id": f"{prefix}{c['id']}"} for c in message.tool_calls]
        return message.model_copy(update={"tool_calls": calls})
    if isinstance(message, ToolMessage):
        return message.model_copy(update={"tool_call_id": f"{prefix}{message.tool_call_id}"})
    return message


def chain(
    traces: Sequence[RealTrace], *, min_tokens: int = 60_000, min_tool_calls: int = 100
) -> list[RealTrace]:
    """Join runs, in the given order, into sessions of at least ``min_tokens`` tokens.

    Each session is one conversation of several requests: the first run's system prompt,
    then each run's invokes (its human messages, then what the agent did). A run whose
    recording stops after a step gets a one-word final answer (``"Done."``) so the loop
    ends before the next run's request. Call ids get the run's position as a prefix, so
    they stay unique. A session closes once it reaches ``min_tokens`` and
    ``min_tool_calls``; a short remainder joins the last session. Deterministic.
    """
    groups: list[list[RealTrace]] = [[]]
    tokens = calls = 0
    for t in traces:
        s = t.summary()
        groups[-1].append(t)
        tokens += s["tokens"]
        calls += s["tool_calls"]
        if tokens >= min_tokens and calls >= min_tool_calls:
            groups.append([])
            tokens = calls = 0
    if not groups[-1]:
        groups.pop()
    elif len(groups) > 1 and (tokens < min_tokens / 2 or calls < min_tool_calls / 2):
        rest = groups.pop()
        groups[-1].extend(rest)
    out: list[RealTrace] = []
    for n, group in enumerate(groups):
        messages: list[BaseMessage] = []
        if group[0].system is not None:
            messages.append(SystemMessage(group[0].system))
        for j, t in enumerate(group):
            for segment in t.segments:
                messages += segment.humans
                messages += [_renamed(m, f"{j}:") for m in segment.agent]
            last = t.segments[-1].agent
            if not last or not isinstance(last[-1], AIMessage) or last[-1].tool_calls:
                messages.append(AIMessage("Done."))
        name = f"long-{n + 1:02d} ({len(group)} runs: {group[0].name}..)"
        out.append(parse(name, messages))
    return out
