"""Would a provider accept this request? The documented ordering rules, checked offline.

Three checks of a model request (the messages a chat model is sent, system prompt
included), each returning a list of violations (empty: valid):

- :func:`ordering_violations`: the rules the providers document for chat messages, on
  the LangChain messages themselves:

  1. no system message after a non-system one (Anthropic takes system text only at the
     start; the request's own system prompt comes first);
  2. the first message after the system messages is a user message (Anthropic, Gemini);
  3. no tool result without its call: a ``ToolMessage`` answers a call of the assistant
     message that opens its run of tool results, and each call is answered once (OpenAI:
     "messages with role 'tool' must be a response to a preceding message with
     'tool_calls'"; Anthropic: "each tool_result block must have a corresponding tool_use
     block in the previous message");
  4. no call without all of its results before the next non-tool message (OpenAI: "an
     assistant message with 'tool_calls' must be followed by tool messages responding to
     each 'tool_call_id'"; Anthropic: tool_use blocks must be followed immediately by
     their tool_result blocks).

- :func:`anthropic_violations`: langchain-anthropic's own request builder
  (``ChatAnthropic._get_request_payload``, what ``ChatAnthropic`` sends, with the call's
  settings: bound tools, ``cache_control``), then the same pairing rules on the payload it
  builds: tool_result blocks answer the tool_use blocks of the assistant message just
  before, come first in their user message, and every tool_use is answered there; the
  first message has the user role; no message has empty content. An error it raises
  (``Received multiple non-consecutive system messages``) and a warning it gives (a
  system message after the conversation began is moved into the system block) are
  violations.
- :func:`openai_violations`: langchain-openai's own request builder
  (``ChatOpenAI._get_request_payload``, what ``ChatOpenAI`` sends to chat completions),
  then the pairing rules on the dicts it builds; its errors and warnings are violations.

:func:`anthropic_payload` and :func:`openai_payload` give the payloads themselves (without
network or API key), for checks of what stays byte-identical between two requests: the
Anthropic ``system`` block, and the prefix a prompt cache reads.

Both builders are private methods of the installed versions (pinned in the ``providers``
extra, ``pip install 'demote[providers]'``); they run without a network (a placeholder API
key is given), and are imported on first use (a missing one raises
:class:`~demote.errors.MissingExtraError`). An exception from one is a violation. The
validity tests and the agent benchmark (:mod:`bench.agents`, :mod:`bench.agents_real`)
count invalid requests with :func:`violations`; use it to check the requests of your own
agent the same way.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages import content as _content

from demote.errors import MissingExtraError

__all__ = [
    "anthropic_payload",
    "anthropic_violations",
    "openai_payload",
    "openai_violations",
    "ordering_violations",
    "violations",
]


def _cache_block_types() -> None:
    # langchain-core recomputes the data block types from type hints on every content block
    # (``is_data_content_block``), which makes langchain-anthropic's formatting of a
    # 400-message request take 0.1 s. The answer is a constant of the installed release:
    # cache it, on the first check (importing this module changes nothing).
    if not hasattr(_content._get_data_content_block_types, "cache_info"):
        _content._get_data_content_block_types = functools.cache(
            _content._get_data_content_block_types
        )


def _call_ids(message: AIMessage) -> list[str]:
    calls: list[Any] = [*message.tool_calls, *message.invalid_tool_calls]
    return [str(c.get("id")) for c in calls if c.get("id")]


def ordering_violations(messages: Sequence[BaseMessage]) -> list[str]:
    """The documented ordering rules broken by ``messages`` (see the module docstring)."""
    out: list[str] = []
    seen_other = False
    first_other: BaseMessage | None = None
    open_calls: list[str] = []  # calls of the current assistant turn not yet answered
    turn_calls: set[str] = set()  # all calls of the current assistant turn
    answered: set[str] = set()
    for i, m in enumerate(messages):
        if isinstance(m, SystemMessage):
            if seen_other:
                out.append(f"[{i}] system message after a non-system message")
        elif first_other is None:
            first_other = m
            seen_other = True
            if not isinstance(m, HumanMessage):
                out.append(f"[{i}] first message after the system messages is {m.type}, not human")
        if isinstance(m, ToolMessage):
            cid = m.tool_call_id
            if cid not in turn_calls:
                out.append(f"[{i}] tool result {cid!r} without its call just before")
            elif cid in answered:
                out.append(f"[{i}] tool result {cid!r} answers its call a second time")
            else:
                answered.add(cid)
                open_calls.remove(cid)
            continue
        if open_calls:
            out.append(f"[{i}] calls {open_calls} have no result before this {m.type} message")
        open_calls, turn_calls, answered = [], set(), set()
        if isinstance(m, AIMessage):
            ids = _call_ids(m)
            open_calls = list(ids)
            turn_calls = set(ids)
    if open_calls:
        out.append(f"[end] calls {open_calls} have no result")
    if first_other is None:
        out.append("no message besides system messages")
    return out


_OFFLINE_KEY = "offline-check"  # the builders need a key to construct; nothing is sent


def _anthropic_model() -> Any:
    try:
        from langchain_anthropic.chat_models import ChatAnthropic
    except ImportError as exc:
        raise MissingExtraError("langchain-anthropic", "providers") from exc
    return _model(ChatAnthropic, "claude-sonnet-4-5")


def _openai_model() -> Any:
    try:
        from langchain_openai.chat_models.base import ChatOpenAI
    except ImportError as exc:
        raise MissingExtraError("langchain-openai", "providers") from exc
    return _model(ChatOpenAI, "gpt-4.1")


@functools.cache
def _model(cls: Any, name: str) -> Any:
    """One offline instance of a provider's chat model (its builder needs no more)."""
    return cls(model=name, api_key=_OFFLINE_KEY)


def _built(
    model: Any, messages: Sequence[BaseMessage], settings: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The builder's payload and the warnings it gave (an exception propagates)."""
    _cache_block_types()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        payload = model._get_request_payload(list(messages), **settings)
    said = [f"{w.category.__name__}: {w.message}" for w in caught]
    return payload, said


def _tool_settings(model: Any, tools: Sequence[Any] | None) -> dict[str, Any]:
    if not tools:
        return {}
    return dict(model.bind_tools(list(tools)).kwargs)


def anthropic_payload(
    messages: Sequence[BaseMessage], *, tools: Sequence[Any] | None = None, **settings: Any
) -> dict[str, Any]:
    """What ``ChatAnthropic`` would send for ``messages`` (built offline).

    Args:
        messages: The request's messages, system prompt included.
        tools: The tools bound to the model (as ``bind_tools`` takes them).
        **settings: Call settings (``cache_control``, ...), as a model call passes them.

    Raises:
        MissingExtraError: langchain-anthropic is not installed.
        Exception: Whatever the builder raises for a request it refuses.
    """
    model = _anthropic_model()
    return _built(model, messages, {**_tool_settings(model, tools), **settings})[0]


def openai_payload(
    messages: Sequence[BaseMessage], *, tools: Sequence[Any] | None = None, **settings: Any
) -> dict[str, Any]:
    """What ``ChatOpenAI`` would send for ``messages`` (built offline).

    Arguments and errors as :func:`anthropic_payload`'s.
    """
    model = _openai_model()
    return _built(model, messages, {**_tool_settings(model, tools), **settings})[0]


def _findings(
    builder: str,
    model: Any,
    messages: Sequence[BaseMessage],
    tools: Sequence[Any] | None,
    settings: dict[str, Any],
) -> tuple[dict[str, Any] | None, list[str]]:
    """The payload ``builder`` makes (``None`` when it refuses) and its findings so far.

    The builder refusing the request, and each warning it gives, is a finding.
    """
    try:
        payload, said = _built(model, messages, {**_tool_settings(model, tools), **settings})
    except MissingExtraError:
        raise
    except Exception as exc:  # the builder refusing is the finding
        return None, [f"{builder}: {type(exc).__name__}: {exc}"]
    return payload, [f"{builder} warns: {w}" for w in said]


def anthropic_violations(
    messages: Sequence[BaseMessage], *, tools: Sequence[Any] | None = None, **settings: Any
) -> list[str]:
    """What Anthropic's Messages API would reject, from langchain-anthropic's own payload.

    Args:
        messages: The request's messages, system prompt included.
        tools: The tools bound to the model, if any.
        **settings: The call's settings (``cache_control``, ...).
    """
    payload, out = _findings("langchain-anthropic", _anthropic_model(), messages, tools, settings)
    if payload is None:
        return out
    formatted: list[dict[str, Any]] = payload.get("messages") or []
    if not formatted:
        return [*out, "anthropic: no messages"]
    if formatted[0]["role"] != "user":
        out.append(f"anthropic: first message has role {formatted[0]['role']!r}")
    previous_uses: list[str] = []
    for i, message in enumerate(formatted):
        content = message["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if not content:
            out.append(f"anthropic [{i}]: empty {message['role']} content")
        kinds = [b.get("type") for b in blocks if isinstance(b, dict)]
        results = [
            b.get("tool_use_id")
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        if message["role"] == "user":
            stray = [r for r in results if r not in previous_uses]
            if stray:
                out.append(f"anthropic [{i}]: tool_result {stray} without tool_use just before")
            missing = [u for u in previous_uses if u not in results]
            if missing:
                out.append(f"anthropic [{i}]: tool_use {missing} not answered in the next message")
            if results and kinds[: len(results)] != ["tool_result"] * len(results):
                out.append(f"anthropic [{i}]: tool_result blocks do not come first")
            previous_uses = []
        else:
            if previous_uses:
                out.append(f"anthropic [{i}]: tool_use {previous_uses} answered by no user message")
            if results:
                out.append(f"anthropic [{i}]: tool_result in an assistant message")
            previous_uses = [
                str(b.get("id"))
                for b in blocks
                if isinstance(b, dict) and b.get("type") == "tool_use"
            ]
    if previous_uses:
        out.append(f"anthropic: tool_use {previous_uses} at the end, never answered")
    return out


def openai_violations(
    messages: Sequence[BaseMessage], *, tools: Sequence[Any] | None = None, **settings: Any
) -> list[str]:
    """What OpenAI's chat completions would reject, from langchain-openai's own payload.

    Args:
        messages: The request's messages, system prompt included.
        tools: The tools bound to the model, if any.
        **settings: The call's settings (``prompt_cache_key``, ...).
    """
    payload, out = _findings("langchain-openai", _openai_model(), messages, tools, settings)
    if payload is None:
        return out
    dicts: list[dict[str, Any]] = payload.get("messages") or []
    pending: list[str] = []
    allowed: set[str] = set()
    for i, d in enumerate(dicts):
        role = d.get("role")
        if role == "tool":
            cid = d.get("tool_call_id")
            if cid not in allowed:
                out.append(
                    f"openai [{i}]: tool message {cid!r} does not answer the preceding tool_calls"
                )
            else:
                allowed.discard(cid)
                pending.remove(cid)
            continue
        if role == "system" and i and any(x.get("role") != "system" for x in dicts[:i]):
            out.append(f"openai [{i}]: system message after the conversation began")
        if pending:
            out.append(
                f"openai [{i}]: tool_calls {pending} not answered before this {role} message"
            )
        pending, allowed = [], set()
        if role == "assistant" and d.get("tool_calls"):
            pending = [c["id"] for c in d["tool_calls"]]
            allowed = set(pending)
    if pending:
        out.append(f"openai: tool_calls {pending} at the end, never answered")
    return out


def violations(
    messages: Sequence[BaseMessage], *, tools: Sequence[Any] | None = None, **settings: Any
) -> list[str]:
    """Every violation of one request: the ordering rules and both providers' payloads.

    Args:
        messages: The request's messages, system prompt included.
        tools: The tools bound to the model, if any.
        **settings: The call's settings, passed to both builders (each provider's own:
            ``cache_control`` is Anthropic's, ``prompt_cache_key`` OpenAI's; one builder
            is not given the other's).
    """
    anthropic = {k: v for k, v in settings.items() if k != "prompt_cache_key"}
    openai = {k: v for k, v in settings.items() if k != "cache_control"}
    return [
        *ordering_violations(messages),
        *anthropic_violations(messages, tools=tools, **anthropic),
        *openai_violations(messages, tools=tools, **openai),
    ]
