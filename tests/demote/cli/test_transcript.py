"""Transcript readers: JSONL, LangChain dicts (without LangChain), LoCoMo."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from demote.cli.transcript import (
    Question,
    builtin_transcript,
    load_transcript,
    parse_jsonl,
    parse_locomo,
    parse_messages,
)
from demote.errors import TranscriptError

LOCOMO = Path(
    os.environ.get("DEMOTE_LOCOMO")
    or Path(__file__).resolve().parents[4] / "shared" / "data" / "locomo"
)

TINY_LOCOMO = {
    "speaker_a": "Ann",
    "speaker_b": "Bob",
    "session_2_date_time": "9 May",
    "session_2": [{"speaker": "Bob", "dia_id": "D2:1", "text": "later"}],
    "session_1_date_time": "8 May",
    "session_1": [
        {"speaker": "Ann", "dia_id": "D1:1", "text": "hi"},
        {"speaker": "Bob", "dia_id": "D1:2", "text": "hello", "img_url": ["x"]},
    ],
    "qa": [
        {"question": "q1", "answer": "a", "evidence": ["D1:2", "D2:1"], "category": 1},
        {
            "question": "q2",
            "evidence": ["D1:1; D:2:1", "D9:9"],
            "category": 5,
            "adversarial_answer": "no",
        },
    ],
}


def test_jsonl_roles_and_aliases() -> None:
    lines = [
        '{"role": "system", "content": "be brief"}',
        "",
        '{"role": "human", "content": "hi"}',
        '{"role": "AI", "content": "hello"}',
        '{"role": "tool", "content": [{"type": "text", "text": "a"}, "b"]}',
    ]
    t = parse_jsonl(lines)
    assert t.messages == (
        ("system", "be brief"),
        ("user", "hi"),
        ("assistant", "hello"),
        ("tool", "a\nb"),
    )
    assert t.source_format == "jsonl"
    assert t.questions == ()


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("{not json", "not valid JSON"),
        ('{"content": "x"}', "missing 'role'"),
        ('{"role": "user"}', "missing 'content'"),
        ('{"role": "robot", "content": "x"}', "unknown role"),
        ('{"role": "user", "content": 3}', "content must be"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_line_names_its_number(line: str, words: str) -> None:
    lines = ['{"role": "user", "content": "ok"}', "", line]
    with pytest.raises(TranscriptError, match=words) as info:
        parse_jsonl(lines)
    assert info.value.line == 3
    assert str(info.value).startswith("line 3:")


LC_DICTS = [
    {"type": "system", "data": {"content": "sys", "type": "system"}},
    {"type": "human", "data": {"content": "hi", "type": "human"}},
    {"type": "ai", "data": {"content": [{"type": "text", "text": "yo"}], "tool_calls": []}},
    {"type": "tool", "data": {"content": "42", "tool_call_id": "c1"}},
    {"type": "AIMessageChunk", "data": {"content": "chunk"}},
    {"type": "chat", "data": {"content": "c", "role": "user"}},
]


def test_langchain_dicts_as_list_and_jsonl() -> None:
    expected = (
        ("system", "sys"),
        ("user", "hi"),
        ("assistant", "yo"),
        ("tool", "42"),
        ("assistant", "chunk"),
        ("user", "c"),
    )
    as_list = parse_messages(LC_DICTS)
    assert as_list.messages == expected
    assert as_list.source_format == "langchain"
    as_lines = parse_jsonl(json.dumps(d) for d in LC_DICTS)
    assert as_lines.messages == expected
    assert as_lines.source_format == "langchain"


def test_langchain_bad_items() -> None:
    with pytest.raises(TranscriptError, match="item 2: unknown message type 'robot'"):
        parse_messages([LC_DICTS[0], {"type": "robot", "data": {"content": "x"}}])
    with pytest.raises(TranscriptError, match=r"missing 'data\.content'") as info:
        parse_jsonl(['{"type": "human", "data": {}}'])
    assert info.value.line == 1


def test_real_messages_to_dict_output() -> None:
    messages = pytest.importorskip("langchain_core.messages")
    history = [
        messages.SystemMessage("s"),
        messages.HumanMessage("q"),
        messages.AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "c1"}]),
        messages.ToolMessage("r", tool_call_id="c1"),
        messages.AIMessage("a"),
    ]
    dumped = json.loads(json.dumps(messages.messages_to_dict(history)))
    t = parse_messages(dumped)
    assert [r for r, _ in t.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert t.messages[-1] == ("assistant", "a")


def test_locomo_sessions_in_order_ids_and_questions() -> None:
    t = parse_locomo(TINY_LOCOMO, name="tiny")
    assert t.messages == (("user", "hi"), ("assistant", "hello"), ("assistant", "later"))
    assert t.message_ids == ("D1:1", "D1:2", "D2:1")
    assert t.source_format == "locomo"
    assert t.questions[0] == Question(
        "q1", evidence=(1, 2), category=1, answer="a", evidence_ids=("D1:2", "D2:1")
    )
    q2 = t.questions[1]
    assert q2.evidence_ids == ("D1:1", "D2:1", "D9:9")
    assert q2.evidence == (0, 2)  # D9:9 names no message
    assert q2.answer == "no"


def test_locomo_prefixes() -> None:
    t = parse_locomo(TINY_LOCOMO, with_speaker=True, with_date=True)
    assert t.messages[0] == ("user", "[8 May] Ann: hi")
    assert parse_locomo(TINY_LOCOMO, with_speaker=True).messages[2][1] == "Bob: later"


def test_locomo_bad_documents() -> None:
    with pytest.raises(TranscriptError, match="speaker_a"):
        parse_locomo({"session_1": []})
    bad = {**TINY_LOCOMO, "session_1": [{"speaker": "Eve", "text": "?"}]}
    with pytest.raises(TranscriptError, match="session_1 turn 1"):
        parse_locomo(bad)


def test_load_transcript_detects_formats(tmp_path: Path) -> None:
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text('{"role": "user", "content": "a"}\n{"role": "ai", "content": "b"}\n')
    assert load_transcript(jsonl).messages == (("user", "a"), ("assistant", "b"))
    assert load_transcript(jsonl).name == "chat"
    lc = tmp_path / "lc.json"
    lc.write_text(json.dumps(LC_DICTS))
    assert load_transcript(lc).source_format == "langchain"
    loco = tmp_path / "conv.json"
    loco.write_text(json.dumps(TINY_LOCOMO))
    assert load_transcript(loco).source_format == "locomo"
    with pytest.raises(TranscriptError, match="not a LoCoMo"):
        load_transcript(jsonl, format="locomo")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"role": "user", "content": "a"}\n{oops\n')
    with pytest.raises(TranscriptError) as info:
        load_transcript(broken)
    assert info.value.line == 2
    with pytest.raises(TranscriptError, match="cannot read"):
        load_transcript(tmp_path / "missing.jsonl")


@pytest.mark.skipif(not LOCOMO.is_dir(), reason="LoCoMo data not available")
def test_real_locomo_file() -> None:
    t = load_transcript(LOCOMO / "conv-26.json")
    assert len(t) == len(t.message_ids) == 419
    assert {r for r, _ in t.messages} == {"user", "assistant"}
    assert t.questions
    for q in t.questions:
        assert all(0 <= i < len(t) for i in q.evidence)


def test_published_locomo_set_picks_a_sample(tmp_path: Path) -> None:
    # locomo10.json, as published, is a list of samples, each nesting its conversation.
    other = {**TINY_LOCOMO, "speaker_a": "Cy", "session_1": [{"speaker": "Cy", "text": "yo"}]}
    samples = [
        {"sample_id": "conv-1", "conversation": TINY_LOCOMO, "qa": TINY_LOCOMO["qa"]},
        {"sample_id": "conv-2", "conversation": other, "qa": []},
    ]
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps(samples))
    first = load_transcript(path)
    assert first.source_format == "locomo" and first.name == "conv-1"
    assert first.messages[0] == ("user", "hi") and len(first.questions) == 2
    second = load_transcript(path, sample="conv-2")
    assert second.name == "conv-2" and second.messages[0] == ("user", "yo")
    with pytest.raises(TranscriptError, match=r"no sample 'conv-9'; it has conv-1, conv-2"):
        load_transcript(path, sample="conv-9")


def test_builtin_transcript_needs_no_download() -> None:
    t = builtin_transcript()
    assert len(t) == 600 and t.source_format == "builtin"
    assert [q.answer for q in t.questions] == ["4512", "Miso", "cashew", "14th of June"]
    for q in t.questions:
        (said,) = q.evidence
        role, text = t.messages[said]
        assert role == "user" and q.answer is not None and q.answer.lower() in text.lower()
        assert said < 20  # early facts, asked about at the end


def test_llamaindex_chat_store_lines_one_key_at_a_time(tmp_path: Path) -> None:
    from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock

    messages = {
        "a": [
            ChatMessage(role="system", content="be brief"),
            ChatMessage(role="user", content="hello"),
            ChatMessage(role="assistant", blocks=[TextBlock(text="hi"), TextBlock(text="there")]),
        ],
        "b": [
            ChatMessage(
                role="user",
                blocks=[TextBlock(text="b's"), ImageBlock(url="https://example.com/x.png")],
            )
        ],
    }
    lines = [
        json.dumps({"key": key, "message": m.model_dump(mode="json")})
        for key in ("a", "b")
        for m in messages[key]
    ]
    lines.insert(2, lines.pop())  # keys interleaved, as appends of two chats are
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    first = load_transcript(path)
    assert (first.source_format, first.name) == ("llamaindex", "a")
    assert first.messages == (("system", "be brief"), ("user", "hello"), ("assistant", "hi\nthere"))
    assert load_transcript(path, sample="b").messages == (("user", "b's"),)
    with pytest.raises(TranscriptError, match="no chat store key 'c'; it has a, b"):
        load_transcript(path, sample="c")


def test_llamaindex_persisted_chat_store(tmp_path: Path) -> None:
    doc = {
        "store": {
            "k1": [{"role": "user", "content": "one"}, {"role": "chatbot", "content": "two"}],
            "k2": [{"role": "model", "blocks": [{"block_type": "text", "text": "three"}]}],
        },
        "class_name": "SimpleChatStore",
    }
    path = tmp_path / "store.json"
    path.write_text(json.dumps(doc))
    assert load_transcript(path).messages == (("user", "one"), ("assistant", "two"))
    assert load_transcript(path, sample="k2").messages == (("assistant", "three"),)
    doc["store"]["k1"][1] = {"role": "narrator", "content": "x"}  # type: ignore[index]
    path.write_text(json.dumps(doc))
    with pytest.raises(TranscriptError, match="k1 item 2: unknown role 'narrator'"):
        load_transcript(path)
