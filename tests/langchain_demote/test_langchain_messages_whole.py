"""LangChain messages in the neutral form: to_data / from_data, delivery, outbox, vector store."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.vectorstores import InMemoryVectorStore

from demote import Demoter, SlidingWindow
from demote.capture.codec import decode, encode
from demote.errors import ConfigError
from demote.hooks.simple import CallbackHook
from demote.records import MESSAGE_DATA_KEYS, Demotion, Recalled
from demote.window.media import data_by_reference
from langchain_demote.hooks import DATA_FIELD, VectorStoreHook
from langchain_demote.messages import from_data, from_recalled, to_core, to_data

IMAGE = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()

MESSAGES: dict[str, BaseMessage] = {
    "human": HumanMessage("hi", id="h1", additional_kwargs={"lang": "en"}),
    "system": SystemMessage("be brief"),
    "ai-tool-calls": AIMessage(
        "",
        tool_calls=[
            {"name": "search", "args": {"q": "lisbon", "n": 3}, "id": "call_1"},
            {"name": "fetch", "args": {"url": "https://x"}, "id": "call_2"},
        ],
        id="run-1",
        usage_metadata={"input_tokens": 5, "output_tokens": 9, "total_tokens": 14},
        response_metadata={"model_provider": "anthropic", "stop_reason": "tool_use"},
        additional_kwargs={"refusal": None},
    ),
    "ai-invalid-call": AIMessage(
        "", invalid_tool_calls=[{"name": "f", "args": "{bad", "id": "c9", "error": "json"}]
    ),
    "ai-anthropic-blocks": AIMessage(
        [
            {"type": "thinking", "thinking": "the user wants rain data", "signature": "sig=="},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
        ],
        tool_calls=[{"name": "weather", "args": {"city": "Oslo"}, "id": "toolu_1"}],
    ),
    "ai-reasoning": AIMessage(
        [{"type": "reasoning", "reasoning": "step by step"}, {"type": "text", "text": "42"}]
    ),
    "tool-artifact": ToolMessage(
        "3 results", tool_call_id="call_1", name="search", artifact={"ids": [1, 2, 3]}
    ),
    "tool-error": ToolMessage("timeout", tool_call_id="call_2", name="fetch", status="error"),
    "tool-list-content": ToolMessage(
        [
            {"type": "text", "text": "chart"},
            {"type": "image", "base64": IMAGE, "mime_type": "image/png"},
        ],
        tool_call_id="call_3",
    ),
    "human-image-url": HumanMessage(
        [
            {"type": "text", "text": "what is it?"},
            {
                "type": "image_url",
                "image_url": {"url": "https://example.org/a.png", "detail": "high"},
            },
        ]
    ),
    "chunk": AIMessageChunk(
        content="", tool_call_chunks=[{"name": "f", "args": '{"a": 1}', "id": "c1", "index": 0}]
    ),
    "chat-role": ChatMessage("a note", role="critic"),
    "function": FunctionMessage("result", name="legacy_fn"),
}


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_the_neutral_form_is_json_and_gives_the_message_back(name: str) -> None:
    message = MESSAGES[name]
    data = to_data(message)
    assert set(data) <= set(MESSAGE_DATA_KEYS)
    through_json = json.loads(json.dumps(data))
    back = from_data(through_json)
    assert back == message
    assert type(back) is type(message)


def test_tool_calls_and_results_use_the_neutral_keys() -> None:
    data = to_data(MESSAGES["ai-tool-calls"])
    assert data["tool_calls"] == [
        {"id": "call_1", "name": "search", "args": {"q": "lisbon", "n": 3}},
        {"id": "call_2", "name": "fetch", "args": {"url": "https://x"}},
    ]
    assert (data["role"], data["text"], data["id"]) == ("assistant", "", "run-1")
    result = to_data(MESSAGES["tool-artifact"])
    assert (result["tool_call_id"], result["tool"]) == ("call_1", "search")


def test_a_text_only_form_gives_the_plain_message_of_its_role() -> None:
    assert from_data({"role": "user", "text": "hi"}) == HumanMessage("hi")
    assert from_data({"role": "assistant", "text": "yo"}) == AIMessage("yo")
    assert from_data({"role": "tool", "text": "r", "tool_call_id": "c"}) == ToolMessage(
        "r", tool_call_id="c"
    )
    assert from_recalled(Recalled("system", "s", 0, "k")) == SystemMessage("s")
    with pytest.raises(ConfigError, match="unknown role"):
        from_data({"role": "narrator", "text": "x"})


def test_media_by_reference_drops_the_bytes_only() -> None:
    data = data_by_reference(to_data(MESSAGES["tool-list-content"]))
    image = data["blocks"][1]
    assert image["base64"] is None and image["mime_type"] == "image/png"
    assert image["omitted"]["bytes"] == 72
    assert data["blocks"][0] == {"type": "text", "text": "chart"}
    url = data_by_reference(to_data(MESSAGES["human-image-url"]))
    assert url["blocks"][1]["image_url"]["url"] == "https://example.org/a.png"


def _delivered(history: list[BaseMessage]) -> list[Any]:
    got: list[Any] = []
    demoter = Demoter(
        SlidingWindow.last_messages(1), CallbackHook(lambda batch: got.extend(batch.messages))
    )
    demoter.load("c", history, lambda m: to_core(m, demoter.describe))
    return got


def test_hooks_receive_whole_messages_and_the_outbox_keeps_them() -> None:
    call, result = MESSAGES["ai-tool-calls"], MESSAGES["tool-artifact"]
    history = [HumanMessage("go"), call, result, HumanMessage("next")]
    got = _delivered(history)
    assert [from_data(m.data) for m in got] == history[:3]
    batch = Demotion("c", tuple(got), fence=4)
    again = decode(encode(batch))
    assert [from_data(m.data) for m in again.messages] == history[:3]
    assert again.messages[1].raw is None
    # A payload written before whole messages (four fields) still reads, text only.
    old = json.dumps(
        {"kind": "demotion", "conversation_id": "c", "messages": [["user", "go", 0, "k"]], "v": 1}
    )
    assert decode(old).messages[0].data is None


def test_a_converter_that_fails_gives_the_text_only_form() -> None:
    got: list[Any] = []
    demoter = Demoter(
        SlidingWindow.last_messages(1), CallbackHook(lambda batch: got.extend(batch.messages))
    )

    def broken(message: Any) -> dict[str, Any]:
        raise ValueError("cannot convert")

    def describe(m: BaseMessage) -> Any:
        text = str(m.content)
        return demoter.describe("user" if m.type == "human" else "assistant", text, to_data=broken)

    demoter.load("c", [HumanMessage("a"), AIMessage("b"), HumanMessage("c")], describe)
    assert [m.data for m in got] == [
        {"role": "user", "text": "a"},
        {"role": "assistant", "text": "b"},
    ]


def test_the_vector_store_hook_indexes_calls_and_keeps_the_form() -> None:
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    hook = VectorStoreHook(store)
    call = MESSAGES["ai-tool-calls"]
    history = [HumanMessage("go"), call, HumanMessage("next")]
    demoter = Demoter(SlidingWindow.last_messages(1), hook)
    demoter.load("c", history, lambda m: to_core(m, demoter.describe))
    docs: list[Document] = [d for d in store.store.values()]  # type: ignore[misc]
    by_index = {d["metadata"]["index"]: d for d in docs}  # type: ignore[index]
    assert set(by_index) == {0, 1}
    tool_doc = by_index[1]
    assert "lisbon" in tool_doc["text"] and "search" in tool_doc["text"]  # type: ignore[index]
    assert from_data(json.loads(tool_doc["metadata"][DATA_FIELD])) == call  # type: ignore[index]
    with pytest.raises(ConfigError, match="media"):
        VectorStoreHook(store, media="inline")  # type: ignore[arg-type]
