"""Provider chat models that build their real request payload offline, for the oracle.

:class:`ScriptedAnthropic` and :class:`ScriptedOpenAI` are ``ChatAnthropic`` and
``ChatOpenAI`` whose network call is replaced by a script: every call builds the payload
the provider's own code would send (``_get_request_payload``, with the tools bound by
``create_agent`` and the call's settings such as ``cache_control`` or
``prompt_cache_key``), records it with the warnings the builder gave, and answers with the
next scripted ``AIMessage``. So ``AnthropicPromptCachingMiddleware`` (which acts only on a
``ChatAnthropic``) and every other middleware run exactly as in production, and what is
checked is the provider's request itself.

The checks on recorded calls (:func:`check_calls`): no error and no warning from the
builder, the pairing rules on the payload
(:func:`langchain_demote.provider_rules.anthropic_violations` /
:func:`~langchain_demote.provider_rules.openai_violations`), the limit by
``count_tokens_approximately`` (tools included) unless the window reported an overhang,
one system block for the whole thread, and between two cuts each payload starting with
the previous one (up to the previous recall, which a new question replaces).
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_anthropic import ChatAnthropic
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_openai import ChatOpenAI
from pydantic import PrivateAttr

from demote.request import RECALL_PREFIX
from langchain_demote.provider_rules import (
    anthropic_violations,
    openai_violations,
    ordering_violations,
)

__all__ = ["Call", "ScriptedAnthropic", "ScriptedOpenAI", "check_calls", "flat_blocks"]


@dataclass
class Call:
    """One model call: what the model got, what its provider would be sent."""

    messages: list[BaseMessage]
    settings: dict[str, Any]
    payload: dict[str, Any] | None
    error: str | None
    warned: list[str]
    demote: dict[str, Any] = field(default_factory=dict)  # the run's metadata["demote"]


class _Scripted:
    """The scripted half of both models (a mixin over the provider's chat model)."""

    _replies: list[AIMessage]
    _calls: list[Call]
    _lock: threading.Lock

    def script(self, replies: Sequence[AIMessage]) -> None:
        with self._lock:
            self._replies.extend(replies)

    @property
    def calls(self) -> list[Call]:
        return self._calls

    def _record_and_reply(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> ChatResult:
        payload, error = None, None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                payload = self._get_request_payload(messages, stop=stop, **kwargs)  # type: ignore[attr-defined]
            except Exception as exc:  # the builder refusing is the finding
                error = f"{type(exc).__name__}: {exc}"
        metadata = (run_manager.metadata if run_manager is not None else None) or {}
        call = Call(
            list(messages),
            dict(kwargs),
            payload,
            error,
            [f"{w.category.__name__}: {w.message}" for w in caught],
            dict(metadata.get("demote") or {}),
        )
        with self._lock:
            self._calls.append(call)
            if not self._replies:
                raise RuntimeError("the script has no reply left")
            reply = self._replies.pop(0)
        return ChatResult(generations=[ChatGeneration(message=reply)])


class ScriptedAnthropic(_Scripted, ChatAnthropic):
    """``ChatAnthropic`` answering from a script, recording its real payload offline."""

    _replies: list[AIMessage] = PrivateAttr(default_factory=list)
    _calls: list[Call] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(model="claude-sonnet-4-5", api_key="offline-check", **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._record_and_reply(messages, stop, run_manager, kwargs)


class ScriptedOpenAI(_Scripted, ChatOpenAI):
    """``ChatOpenAI`` answering from a script, recording its real payload offline."""

    _replies: list[AIMessage] = PrivateAttr(default_factory=list)
    _calls: list[Call] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(model="gpt-4.1", api_key="offline-check", **kwargs)  # type: ignore[arg-type]

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._record_and_reply(messages, stop, run_manager, kwargs)


def _strip(value: Any) -> Any:
    """``value`` without ``cache_control`` marks (where a breakpoint sits is not content)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def flat_blocks(payload: dict[str, Any]) -> list[str]:
    """The payload's messages as one list of ``role|block`` strings (a cache reads blocks)."""
    out: list[str] = []
    for message in payload.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str) or content is None:
            blocks: list[Any] = [{"type": "text", "text": content or ""}]
        else:
            blocks = list(content)
        rest = {k: v for k, v in message.items() if k != "content"}
        for block in blocks:
            out.append(json.dumps([_strip(rest), _strip(block)], sort_keys=True, default=str))
    return out


def _system(payload: dict[str, Any], provider: str) -> str:
    if provider == "anthropic":
        return json.dumps(_strip(payload.get("system")), sort_keys=True, default=str)
    system = []
    for message in payload.get("messages") or []:
        if message.get("role") not in ("system", "developer"):
            break
        system.append(message)
    return json.dumps(_strip(system), sort_keys=True, default=str)


_RECALL_MARK = json.dumps(RECALL_PREFIX)[1:-1]  # as it stands in a block's JSON


def _stable(blocks: list[str]) -> list[str]:
    """What of a request the next one must repeat: everything before its recall."""
    for i, block in enumerate(blocks):
        if _RECALL_MARK in block:
            return blocks[:i]
    return blocks


def _recall(blocks: list[str]) -> tuple[int, str] | None:
    return next(((i, b) for i, b in enumerate(blocks) if _RECALL_MARK in b), None)


def _cut(previous: Call, call: Call) -> bool:
    """Did the window move (a cut) between two calls of one thread?"""
    keys = ("cut", "summary", "cleared", "clipped", "pinned", "opener")
    return any(previous.demote.get(k) != call.demote.get(k) for k in keys)


def check_calls(
    calls: Sequence[Call],
    provider: str,
    limit: int | None,
    tools: Sequence[Any] = (),
) -> Iterator[str]:
    """Every broken rule of one thread's calls, as text (nothing: all hold).

    Args:
        calls: One thread's model calls, in order.
        provider: ``"anthropic"`` or ``"openai"``: which builder recorded them.
        limit: The window's token limit (``None``: not a token window).
        tools: The tools bound to the model, for counting.
    """
    systems: set[str] = set()
    previous: Call | None = None
    previous_blocks: list[str] = []
    for n, call in enumerate(calls):
        where = f"call {n}"
        if call.error is not None:
            yield f"{where}: the {provider} builder raised {call.error}"
            previous = None
            continue
        for w in call.warned:
            yield f"{where}: the {provider} builder warned {w}"
        yield from (f"{where}: {v}" for v in ordering_violations(call.messages))
        settings = {k: v for k, v in call.settings.items() if k != "tools"}
        if provider == "anthropic":
            settings.pop("prompt_cache_key", None)
            found = anthropic_violations(call.messages, tools=list(tools), **settings)
        else:
            settings.pop("cache_control", None)
            found = openai_violations(call.messages, tools=list(tools), **settings)
        yield from (f"{where}: {v}" for v in found)
        if limit is not None:
            size = count_tokens_approximately(call.messages, tools=list(tools) or None)
            if size > limit and not call.demote.get("overhang"):
                yield f"{where}: {size} tokens over the {limit}-token limit, no overhang reported"
        assert call.payload is not None
        systems.add(_system(call.payload, provider))
        blocks = flat_blocks(call.payload)
        if previous is not None and not _cut(previous, call):
            same_recall = _recall(previous_blocks) is not None and _recall(
                previous_blocks
            ) == _recall(blocks)
            must = previous_blocks if same_recall else _stable(previous_blocks)
            if blocks[: len(must)] != must:
                at = next(
                    (i for i, (a, b) in enumerate(zip(must, blocks, strict=False)) if a != b),
                    min(len(must), len(blocks)),
                )
                yield (
                    f"{where}: between cuts the request does not start with the previous "
                    f"one (first difference at block {at} of {len(must)})"
                )
        previous, previous_blocks = call, blocks
    if len(systems) > 1:
        yield f"{len(systems)} distinct system blocks in one thread"
