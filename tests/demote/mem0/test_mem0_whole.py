"""Mem0Hook carries the whole message: tool calls in the memory text, the form in metadata."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from demote.errors import ConfigError
from demote.mem0 import Mem0Hook
from demote.mem0.hook import DATA_FIELD
from demote.records import DemotedMessage, Demotion, fingerprint, make_key
from tests.demote.mem0.test_mem0 import (  # noqa: F401  (fixtures)
    make_memory,
    mem0_module,
    network_attempts,
    stored,
)


def _message(index: int, role: Any, text: str, data: dict[str, Any]) -> DemotedMessage:
    return DemotedMessage(
        role, text, index, make_key("chat", index, fingerprint(role, text)), None, data
    )


def test_a_tool_call_message_is_stored_with_its_call_and_form(
    make_memory: Callable[..., Any],  # noqa: F811
) -> None:
    memory = make_memory()
    call = {"id": "c1", "name": "book_flight", "args": {"to": "Reykjavik", "seats": 2}}
    image = {"type": "image", "base64": "A" * 400, "mime_type": "image/png"}
    messages = (
        _message(0, "user", "book me a flight", {"role": "user", "text": "book me a flight"}),
        _message(1, "assistant", "", {"role": "assistant", "text": "", "tool_calls": [call]}),
        _message(2, "user", "my ticket", {"role": "user", "text": "my ticket", "blocks": [image]}),
    )
    Mem0Hook(memory).deliver(Demotion("chat", messages))
    items = {item["metadata"]["demote_index"]: item for item in stored(memory, "chat")}
    assert set(items) == {0, 1, 2}  # the call-only message is no longer skipped
    assert "Reykjavik" in items[1]["memory"] and "book_flight" in items[1]["memory"]
    assert json.loads(items[1]["metadata"][DATA_FIELD])["tool_calls"] == [call]
    kept = json.loads(items[2]["metadata"][DATA_FIELD])["blocks"][0]
    assert kept["base64"] is None and kept["omitted"]["bytes"] == 300
    with pytest.raises(ConfigError, match="media"):
        Mem0Hook(memory, media="inline")  # type: ignore[arg-type]
