"""LlamaIndex messages in the neutral form: to_data / from_data, billed counts, the archive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llama_index.core.base.llms.types import (
    AudioBlock,
    ChatMessage,
    DocumentBlock,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.tools import ToolSelection

from demote import Demoter, SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from demote.errors import ArgumentTypeError, ConfigError
from demote.records import MESSAGE_DATA_KEYS, Recalled
from demote.window.tokens import MESSAGE_OVERHEAD
from llamaindex_demote.messages import (
    from_data,
    from_recalled,
    message_counter,
    to_core,
    to_data,
    tool_calls,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + (750).to_bytes(4, "big") * 2 + bytes(64)

MESSAGES = {
    "user": ChatMessage(role="user", content="hello"),
    "empty": ChatMessage(role="assistant", content=None),
    "tool-call-blocks": ChatMessage(
        role="assistant",
        blocks=[
            TextBlock(text="checking"),
            ToolCallBlock(tool_call_id="c1", tool_name="lookup", tool_kwargs={"order": "A-17"}),
        ],
    ),
    "legacy-tool-selections": ChatMessage(
        role="assistant",
        content="",
        additional_kwargs={
            "tool_calls": [ToolSelection(tool_id="c2", tool_name="add", tool_kwargs={"a": 1})]
        },
    ),
    "legacy-openai-dicts": ChatMessage(
        role="assistant",
        content="",
        additional_kwargs={
            "tool_calls": [
                {"id": "c3", "type": "function", "function": {"name": "f", "arguments": '{"x": 2}'}}
            ]
        },
    ),
    "tool-result": ChatMessage(
        role="tool",
        content="order shipped",
        additional_kwargs={"tool_call_id": "c1", "name": "lookup"},
    ),
    "thinking": ChatMessage(
        role="assistant", blocks=[ThinkingBlock(content="reason first"), TextBlock(text="done")]
    ),
    "image": ChatMessage(
        role="user",
        blocks=[TextBlock(text="see"), ImageBlock(image=PNG, image_mimetype="image/png")],
    ),
    "image-url": ChatMessage(role="user", blocks=[ImageBlock(url="https://example.org/a.png")]),
    "audio-document": ChatMessage(
        role="user",
        blocks=[AudioBlock(audio=bytes(32_000), format="wav"), DocumentBlock(data=b"%PDF-1.4 x")],
    ),
    "chatbot-role": ChatMessage(role=MessageRole.CHATBOT, content="bot"),
}


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_the_neutral_form_is_json_and_gives_the_message_back(name: str) -> None:
    message = MESSAGES[name]
    data = to_data(message)
    assert set(data) <= set(MESSAGE_DATA_KEYS)
    assert from_data(json.loads(json.dumps(data))) == message


def test_tool_calls_from_blocks_and_additional_kwargs() -> None:
    assert tool_calls(MESSAGES["tool-call-blocks"]) == [
        {"id": "c1", "name": "lookup", "args": {"order": "A-17"}}
    ]
    assert tool_calls(MESSAGES["legacy-tool-selections"]) == [
        {"id": "c2", "name": "add", "args": {"a": 1}}
    ]
    assert tool_calls(MESSAGES["legacy-openai-dicts"]) == [
        {"id": "c3", "name": "f", "args": {"x": 2}}
    ]
    data = to_data(MESSAGES["tool-result"])
    assert (data["tool_call_id"], data["tool"]) == ("c1", "lookup")


def test_records_count_calls_and_media_as_billed() -> None:
    d = Demoter(SlidingWindow.last_tokens(10_000))
    big = ChatMessage(
        role="assistant",
        blocks=[
            ToolCallBlock(tool_call_id="w", tool_name="write_file", tool_kwargs={"c": "x" * 40_000})
        ],
    )
    assert to_core(big, d.describe).tokens > 10_000
    image = to_core(MESSAGES["image"], d.describe)
    assert image.tokens == 750 + 2 + MESSAGE_OVERHEAD  # 750 x 750 / 750, "see" + "user", framing
    plain = to_core(MESSAGES["user"], d.describe)
    assert plain.tokens == 3 + MESSAGE_OVERHEAD  # "hello" + "user": 9 characters


def test_a_whole_message_counter_counts_chat_messages() -> None:
    counter = message_counter(lambda messages: 7 * len(messages))
    d = Demoter(SlidingWindow.last_tokens(1000, counter=counter))
    assert to_core(MESSAGES["tool-call-blocks"], d.describe).tokens == 7

    class Estimator:  # the shape of LlamaIndex's TokenCounter
        def estimate_tokens_in_messages(self, messages: list[ChatMessage]) -> int:
            return sum(len(m.content or "") for m in messages)

    d2 = Demoter(SlidingWindow.last_tokens(1000, counter=message_counter(Estimator())))
    assert to_core(MESSAGES["user"], d2.describe).tokens == 5
    with pytest.raises(ArgumentTypeError, match="counter"):
        message_counter(3)


def test_archived_messages_come_back_equal(tmp_path: Path) -> None:
    history = [
        MESSAGES["user"],
        MESSAGES["tool-call-blocks"],
        MESSAGES["tool-result"],
        MESSAGES["thinking"],
        ChatMessage(role="user", content="next"),
    ]
    with SQLiteArchive(tmp_path / "a.db", media="bytes") as archive:
        d = Demoter(SlidingWindow.last_messages(1), archive)
        d.load("c", history, lambda m: to_core(m, d.describe))
        back = [from_recalled(r) for r in archive.messages("c")]
        assert back == history[:4]
        hit = archive.search("c", "A-17")[0]
        assert from_recalled(hit) == history[1]


def test_old_rows_come_back_as_text() -> None:
    assert from_recalled(Recalled("tool", "r", 3, "k")) == ChatMessage(role="tool", content="r")
    with pytest.raises(ConfigError, match="LlamaIndex"):
        from_data({"role": "narrator", "text": "x"})
