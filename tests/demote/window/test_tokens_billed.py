"""Billed counting: tool calls, tool results, media and reasoning, against LangChain's count.

The traces are agent-like and built offline (coding, research, customer service, parallel
calls, Anthropic-style content blocks); the default count must stay within 2% of
langchain-core's ``count_tokens_approximately`` on each.
"""

from __future__ import annotations

import base64
import json
import random
import struct
from typing import Any

import pytest

pytest.importorskip("langchain_core", reason="langchain-core not installed (demote[langchain])")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.utils import count_tokens_approximately

from demote import Demoter, SlidingWindow
from demote.errors import ArgumentTypeError, ConfigError
from demote.records import fingerprint
from demote.window import media
from demote.window.tokens import (
    MESSAGE_OVERHEAD,
    MessageCounter,
    TokenCache,
    approximate_tokens,
    billed_tokens,
)
from langchain_demote.messages import message_counter, to_core

WORDS = (  # noqa: SIM905 - one readable sentence
    "the function returns a list of records parsed from the input file and raises an error "
    "when a field is missing customer order shipped refund invoice search result page"
).split()


def _prose(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _code(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        name = rng.choice(WORDS)
        out.append(f"    def {name}_{i}(self, value: int) -> int:\n        return value * {i}")
    return "class Generated:\n" + "\n".join(out) + "\n"


def coding_trace(seed: int = 1) -> list[BaseMessage]:
    rng = random.Random(seed)
    out: list[BaseMessage] = [
        SystemMessage("You are a coding agent. Use the tools."),
        HumanMessage("Refactor the parser module and make the tests pass."),
    ]
    for step in range(12):
        cid = f"call_{seed}_{step:03d}"
        if step % 3 == 0:
            call = {
                "name": "write_file",
                "args": {"path": f"src/m{step}.py", "content": _code(rng, 40)},
            }
            result = "ok: file written"
        elif step % 3 == 1:
            call = {"name": "read_file", "args": {"path": f"src/m{step - 1}.py"}}
            result = _code(rng, 30)
        else:
            call = {"name": "run_tests", "args": {"args": ["-x", "-q"], "timeout": 120}}
            result = "\n".join(
                f"tests/test_{i}.py::test_{rng.choice(WORDS)} PASSED" for i in range(40)
            )
        out.append(AIMessage(_prose(rng, 12), tool_calls=[{**call, "id": cid}]))
        out.append(ToolMessage(result, tool_call_id=cid, name=str(call["name"])))
    out.append(AIMessage("All tests pass now."))
    return out


def research_trace(seed: int = 2) -> list[BaseMessage]:
    rng = random.Random(seed)
    out: list[BaseMessage] = [HumanMessage("Find recent work on context management for agents.")]
    for step in range(10):
        cid = f"toolu_{seed}{step:02d}"
        query = " ".join(rng.choice(WORDS) for _ in range(5))
        hits = [
            {
                "title": _prose(rng, 8),
                "url": f"https://example.org/{step}/{i}",
                "snippet": _prose(rng, 60),
            }
            for i in range(5)
        ]
        out.append(
            AIMessage("", tool_calls=[{"name": "web_search", "args": {"query": query}, "id": cid}])
        )
        out.append(ToolMessage(json.dumps(hits), tool_call_id=cid, name="web_search"))
    out.append(AIMessage(_prose(rng, 300)))
    return out


def support_trace(seed: int = 3) -> list[BaseMessage]:
    rng = random.Random(seed)
    out: list[BaseMessage] = []
    for turn in range(8):
        out.append(HumanMessage(_prose(rng, 25)))
        for step in range(3):
            cid = f"call_{turn}_{step}_{rng.randrange(10**8):08d}"
            args = {"order_id": f"ORD-{rng.randrange(10**6):06d}", "include_history": step == 2}
            out.append(
                AIMessage("", tool_calls=[{"name": "lookup_order", "args": args, "id": cid}])
            )
            status = {
                "status": rng.choice(["shipped", "pending", "refunded"]),
                "items": rng.randrange(1, 9),
            }
            out.append(ToolMessage(json.dumps(status), tool_call_id=cid, name="lookup_order"))
        out.append(AIMessage(_prose(rng, 40)))
    return out


def parallel_trace(seed: int = 4) -> list[BaseMessage]:
    rng = random.Random(seed)
    out: list[BaseMessage] = [HumanMessage("Compare the weather in five cities.")]
    for rnd in range(4):
        calls = [
            {
                "name": "get_weather",
                "args": {"city": rng.choice(WORDS), "days": 3},
                "id": f"c{rnd}{i}",
            }
            for i in range(5)
        ]
        out.append(AIMessage("Checking.", tool_calls=calls))
        out.extend(
            ToolMessage(_prose(rng, 80), tool_call_id=c["id"], name="get_weather") for c in calls
        )
    out.append(AIMessage(_prose(rng, 120)))
    return out


def anthropic_blocks_trace(seed: int = 5) -> list[BaseMessage]:
    """Anthropic-style replies: content blocks (text, tool_use) beside parsed tool_calls."""
    rng = random.Random(seed)
    out: list[BaseMessage] = [HumanMessage("Summarise the three reports.")]
    for step in range(6):
        cid = f"toolu_{step:02d}{seed}"
        args = {"report": f"r{step}.txt", "section": rng.choice(WORDS)}
        content: list[str | dict[str, Any]] = [
            {"type": "text", "text": _prose(rng, 20)},
            {"type": "tool_use", "id": cid, "name": "read_report", "input": args},
        ]
        out.append(
            AIMessage(content, tool_calls=[{"name": "read_report", "args": args, "id": cid}])
        )
        out.append(ToolMessage(_prose(rng, 250), tool_call_id=cid, name="read_report"))
    return out


TRACES = {
    "coding": coding_trace,
    "research": research_trace,
    "support": support_trace,
    "parallel": parallel_trace,
    "anthropic-blocks": anthropic_blocks_trace,
}


def ours(messages: list[BaseMessage], demoter: Demoter | None = None) -> int:
    d = demoter or Demoter(SlidingWindow.last_tokens(10_000))
    return sum(to_core(m, d.describe).tokens for m in messages)


def ratios() -> dict[str, tuple[int, int, float]]:
    """Per trace: demote's count, LangChain's, and their ratio (what the docs report)."""
    out = {}
    for name, make in TRACES.items():
        trace = make()
        mine, theirs = ours(trace), count_tokens_approximately(trace)
        out[name] = (mine, theirs, mine / theirs)
    return out


@pytest.mark.parametrize("name", sorted(TRACES))
def test_default_count_is_within_2_percent_of_langchain_on_agent_traces(name: str) -> None:
    trace = TRACES[name]()
    mine, theirs = ours(trace), count_tokens_approximately(trace)
    assert theirs > 1000  # a trace of real size, not a few words
    assert 0.98 <= mine / theirs <= 1.02, (name, mine, theirs)


def test_a_42_kb_write_file_call_counts_its_arguments() -> None:
    content = "x = 1  # a line of generated code\n" * 1240  # ~42 KB
    message = AIMessage(
        "",
        tool_calls=[
            {"name": "write_file", "args": {"path": "a.py", "content": content}, "id": "c1"}
        ],
    )
    mine, theirs = ours([message]), count_tokens_approximately([message])
    assert len(content) > 42_000
    assert 10_500 <= mine <= 11_500
    assert abs(mine - theirs) / theirs < 0.02


def _png(width: int, height: int, size: int) -> bytes:
    head = (
        b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", width, height)
    )
    return head + b"\x08\x02\x00\x00\x00" + bytes(size - len(head) - 5)


def _jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + bytes(9)
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + bytes(9)
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def test_a_300_kb_image_block_counts_as_anthropic_bills_it() -> None:
    data = base64.b64encode(_png(1092, 1092, 300_000)).decode()
    message = HumanMessage(
        [
            {"type": "text", "text": "what is this?"},
            {"type": "image", "base64": data, "mime_type": "image/png"},
        ]
    )
    record = to_core(message, Demoter(SlidingWindow.last_tokens(5000)).describe)
    # 1092 x 1092 / 750 = 1590 tokens (Anthropic's table), plus the text and role
    # ("what is this?" and "user": 17 characters, 5 tokens) and framing.
    assert record.tokens == 1590 + 5 + MESSAGE_OVERHEAD


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        # OpenAI high detail: 2048 x 4096 -> 1024 x 2048 -> 768 x 1536: 2 x 3 tiles.
        (
            {
                "type": "image_url",
                "image_url": {"url": "", "detail": "high"},
                "width": 2048,
                "height": 4096,
            },
            85 + 170 * 6,
        ),
        ({"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}, 85),
        ({"type": "image", "url": "https://example.org/cat.png"}, media.IMAGE_TOKENS),
        # Anthropic: the long edge is fitted in 1568 px first (3000 x 1500 -> 1568 x 784).
        ({"type": "image", "width": 3000, "height": 1500}, 1600),
        ({"type": "image", "width": 200, "height": 150}, 40),
        (
            {
                "type": "input_audio",
                "input_audio": {"data": base64.b64encode(bytes(160_000)).decode(), "format": "wav"},
            },
            320,
        ),
        ({"type": "audio", "url": "https://x/a.mp3"}, media.AUDIO_TOKENS),
        ({"type": "file", "url": "https://x/a.pdf", "pages": 4}, 4 * media.FILE_TOKENS),
        (
            {
                "type": "file",
                "base64": base64.b64encode(b"a" * 4000).decode(),
                "mime_type": "text/plain",
            },
            1000,
        ),
        ({"type": "reasoning", "reasoning": "x" * 400}, 100),
        ({"type": "thinking", "thinking": "y" * 40, "signature": ""}, 11),
    ],
)
def test_block_estimates(block: dict[str, Any], expected: int) -> None:
    assert billed_tokens("", approximate_tokens, blocks=[block]) - MESSAGE_OVERHEAD == expected


def test_image_size_is_read_from_jpeg_and_png_bytes() -> None:
    assert media.image_size(_jpeg(640, 480)) == (640, 480)
    assert media.image_size(_png(33, 44, 100)) == (33, 44)
    assert media.image_size(b"not an image") is None
    jpeg = base64.b64encode(_jpeg(750, 1000)).decode()
    tokens = billed_tokens("", approximate_tokens, blocks=[{"type": "image", "base64": jpeg}])
    assert tokens == 1000 + MESSAGE_OVERHEAD


def test_tool_results_count_their_list_content_and_call_id() -> None:
    text_only = ToolMessage("r" * 400, tool_call_id="call_abcd")
    blocks = ToolMessage(
        [{"type": "text", "text": "r" * 400}, {"type": "image", "url": "https://x/p.png"}],
        tool_call_id="call_abcd",
    )
    d = Demoter(SlidingWindow.last_tokens(5000))
    # 400 characters of text, "call_abcd" and the role "tool": 413 characters, 104 tokens.
    assert to_core(text_only, d.describe).tokens == 104 + MESSAGE_OVERHEAD
    assert to_core(text_only, d.describe).tokens == count_tokens_approximately([text_only])
    assert to_core(blocks, d.describe).tokens == 104 + media.IMAGE_TOKENS + MESSAGE_OVERHEAD


def test_plain_text_fingerprints_are_unchanged_and_edited_args_recount() -> None:
    d = Demoter(SlidingWindow.last_tokens(5000))
    assert to_core(HumanMessage("hello"), d.describe).fingerprint == fingerprint("user", "hello")
    call = {"name": "write_file", "args": {"content": "short"}, "id": "c1"}
    before = to_core(AIMessage("", tool_calls=[call]), d.describe)
    edited = {**call, "args": {"content": "much longer content " * 50}}
    after = to_core(AIMessage("", tool_calls=[edited]), d.describe)
    assert before.fingerprint != after.fingerprint
    assert after.tokens > before.tokens + 200


def test_a_whole_message_counter_counts_messages_once_each() -> None:
    seen: list[int] = []

    def counter(messages: list[BaseMessage]) -> int:
        seen.append(len(messages))
        return count_tokens_approximately(messages)

    d = Demoter(SlidingWindow.last_tokens(5000, counter=message_counter(counter)))
    trace = coding_trace()
    counted = [to_core(m, d.describe).tokens for m in trace]
    assert counted == [count_tokens_approximately([m]) for m in trace]
    assert len(seen) == len(trace)
    again = [to_core(m, d.describe).tokens for m in trace]  # cached by fingerprint
    assert again == counted and len(seen) == len(trace)


def test_a_chat_model_counts_through_get_num_tokens_from_messages() -> None:
    model = GenericFakeChatModel(messages=iter([]), custom_get_token_ids=lambda t: t.split())
    d = Demoter(SlidingWindow.last_tokens(5000, counter=message_counter(model)))
    message = HumanMessage("one two three four")
    assert to_core(message, d.describe).tokens == model.get_num_tokens_from_messages([message])
    # Text with no message behind it (a summary) is counted as one human message.
    assert d.tokens.count("summary-fp", "five six") == model.get_num_tokens_from_messages(
        [HumanMessage("five six")]
    )


def test_message_counter_refuses_what_cannot_count() -> None:
    with pytest.raises(ArgumentTypeError, match="counter"):
        message_counter(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="MessageCounter"):
        MessageCounter(42, str)  # type: ignore[arg-type]
    bad = MessageCounter(lambda ms: -1, HumanMessage)
    with pytest.raises(ConfigError, match="non-negative"):
        TokenCache(bad).count("fp", "x")


def test_describe_refuses_bad_parts() -> None:
    d = Demoter(SlidingWindow.last_tokens(5000))
    with pytest.raises(ArgumentTypeError, match="calls"):
        d.describe("assistant", "", calls=["not a mapping"])  # type: ignore[list-item]
    with pytest.raises(ArgumentTypeError, match="blocks"):
        d.describe("user", "", blocks="text")
    with pytest.raises(ArgumentTypeError, match="tool"):
        d.describe("tool", "", tool=3)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="to_data"):
        d.describe("user", "", to_data="x")  # type: ignore[arg-type]
