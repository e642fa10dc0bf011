"""JSON encoding of a ConversationState, shared by the stores that keep it as text."""

from __future__ import annotations

import json
from dataclasses import asdict

from demote.errors import StoreError
from demote.records import ConversationState

__all__ = ["decode_state", "encode_state"]


def encode_state(state: ConversationState) -> str:
    """``state`` as compact JSON with sorted keys (equal states encode equally)."""
    return json.dumps(asdict(state), sort_keys=True, separators=(",", ":"))


def decode_state(text: str | bytes) -> ConversationState:
    """The state ``encode_state`` wrote; :class:`StoreError` if it is not one."""
    try:
        return ConversationState(**json.loads(text))
    except (ValueError, TypeError) as exc:
        raise StoreError(f"stored conversation state is corrupt: {exc}") from exc
