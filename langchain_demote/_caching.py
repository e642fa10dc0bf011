"""The ``prompt_cache_key`` a ``DemotingMiddleware`` sets on each model request (pure).

OpenAI caches prompt prefixes automatically (from 1,024 tokens on) and routes a request
to a cache by a hash of its start; ``prompt_cache_key`` joins that hash, so requests that
share a key reach the same cache. Many conversations sharing one system prompt and tool
list otherwise compete for the same few machines. demote's window keeps one conversation's
prompt byte-identical between cuts, so keying by conversation sends each conversation's
calls where its prefix is cached. langchain-openai's ``ChatOpenAI`` takes the key as a call
keyword; ``create_agent`` passes ``ModelRequest.model_settings`` as such keywords.

Only OpenAI's API takes the key: ``ChatAnthropic`` (and other providers' models) would put
an unknown ``prompt_cache_key`` field in their request, which their API refuses. So the key
is set only for a model built on langchain-openai (``ChatOpenAI``, ``AzureChatOpenAI``
and the OpenAI-compatible models built on its base class, :func:`takes_cache_key`); with
any other model the option does nothing, and an agent may switch models freely.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from demote.errors import ConfigError

__all__ = ["CacheKey", "cache_key_option", "keyed_settings", "takes_cache_key"]

#: ``prompt_cache_key=``: ``False`` (off), ``True`` (the conversation id), or a callable
#: from the conversation id to the key.
CacheKey = bool | Callable[[str], str]

SETTING = "prompt_cache_key"


def cache_key_option(option: object) -> CacheKey:
    """``option`` checked: a bool or a callable, else :class:`ConfigError`."""
    if isinstance(option, bool) or callable(option):
        return option
    raise ConfigError(
        f"prompt_cache_key: expected True, False or a callable of the conversation id, "
        f"got {option!r:.60}"
    )


def takes_cache_key(model: object) -> bool:
    """Is ``model`` one that sends ``prompt_cache_key`` to OpenAI's API (langchain-openai's)?"""
    return any(
        (getattr(cls, "__module__", "") or "").startswith("langchain_openai")
        for cls in type(model).__mro__
    )


def keyed_settings(
    option: CacheKey, conversation_id: str, settings: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The model settings with the conversation's cache key, or ``None`` to leave them.

    A key already in ``settings`` (set by the caller or an outer middleware) is kept.

    Raises:
        ConfigError: The callable returned something other than a non-empty string.
    """
    if option is False or SETTING in settings:
        return None
    key = conversation_id if option is True else option(conversation_id)
    if not isinstance(key, str) or not key:
        raise ConfigError(
            f"prompt_cache_key: the callable must return a non-empty str, got {key!r:.60}"
        )
    return {**settings, SETTING: key}
