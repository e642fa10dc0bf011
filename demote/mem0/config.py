"""mem0 namespaces and configuration: which entity ids a conversation's memories get.

The metadata field names the hook, recall and capture agree on; the default namespace
(``run_id`` from the conversation id) and the id checks; and :func:`memory_from_config`,
the one place that imports mem0.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from demote.errors import ConfigError, ConversationIdError, MissingExtraError

__all__ = [
    "CONVERSATION_FIELD",
    "KEY_FIELD",
    "KEYS_FIELD",
    "Namespace",
    "conversation_namespace",
    "memory_from_config",
]

Namespace = Callable[[str], Mapping[str, str]]
"""Maps a conversation id to mem0 entity ids (``user_id`` / ``agent_id`` / ``run_id``)."""

KEY_FIELD = "demote_key"
"""Metadata field holding a verbatim memory's dedup key (``DemotedMessage.key``)."""
KEYS_FIELD = "demote_keys"
"""Metadata field holding the keys of a batch sent to mem0's extractor (``infer=True``)."""
CONVERSATION_FIELD = "demote_conversation"
"""Metadata field holding the conversation id of every memory demote writes."""

_ENTITY_FIELDS = ("user_id", "agent_id", "run_id")
_SAFE_ID = re.compile(r"\S{1,128}")


def memory_from_config(config: Mapping[str, Any], *, asynchronous: bool = False) -> Any:
    """Build a ``mem0.Memory`` (or ``mem0.AsyncMemory``) from a mem0 config dict.

    Args:
        config: A mem0 ``MemoryConfig`` as a dict (``vector_store``, ``embedder``, ``llm``,
            ``history_db_path``, ...).
        asynchronous: Build an ``AsyncMemory`` instead.

    Returns:
        The mem0 object.

    Raises:
        MissingExtraError: mem0 is not installed.
    """
    try:
        import mem0  # lazy: importing mem0 costs about 2 s
    except ImportError as exc:
        raise MissingExtraError("mem0ai", "mem0") from exc
    cls = mem0.AsyncMemory if asynchronous else mem0.Memory
    return cls.from_config(dict(config))


def conversation_namespace(*, user_id: str | None = None, agent_id: str | None = None) -> Namespace:
    """The default namespace: ``run_id`` from the conversation, plus fixed user / agent ids.

    Args:
        user_id: Stored as mem0's ``user_id`` on every memory, if given.
        agent_id: Stored as mem0's ``agent_id`` on every memory, if given.

    Returns:
        A function from a conversation id to mem0 entity ids.
    """
    fixed = {
        name: _entity_id(value, name)
        for name, value in (("user_id", user_id), ("agent_id", agent_id))
        if value is not None
    }

    def namespace(conversation_id: str) -> dict[str, str]:
        return {**fixed, "run_id": _run_id(conversation_id)}

    return namespace


def _run_id(conversation_id: str) -> str:
    if not isinstance(conversation_id, str) or not conversation_id.strip():
        raise ConversationIdError(
            f"conversation id must be a non-empty str, got {conversation_id!r}"
        )
    if _SAFE_ID.fullmatch(conversation_id):
        return conversation_id
    digest = hashlib.blake2b(conversation_id.encode("utf-8", "surrogatepass"), digest_size=16)
    return f"demote-{digest.hexdigest()}"


def _entity_id(value: object, name: str) -> str:
    if not isinstance(value, str) or not _SAFE_ID.fullmatch(value):
        raise ConfigError(f"{name} must be a str of 1-128 non-whitespace characters, got {value!r}")
    return value
