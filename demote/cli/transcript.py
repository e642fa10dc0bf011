"""Read chat transcripts into plain ``(role, text)`` pairs, for replays and benchmarks.

Four formats, none of which needs a framework installed:

- ``"jsonl"``: one message per line, ``{"role": ..., "content": ...}`` with roles
  ``user``/``human``, ``assistant``/``ai``, ``system``/``developer`` and ``tool``; LangChain
  dict lines (below) are accepted too. Blank lines are skipped.
- ``"langchain"``: what ``langchain_core.messages.messages_to_dict`` writes, a JSON list
  (or JSONL) of ``{"type": "human"|"ai"|"system"|"tool", "data": {"content": ...}}``.
  Content given as a list of blocks keeps its text blocks, joined by newlines. (The demo's
  ``langchain-history.jsonl`` is this.)
- ``"llamaindex"``: a LlamaIndex chat store: JSONL of ``{"key": ..., "message": ...}``
  (the demo's ``llamaindex-chats.jsonl``), or ``SimpleChatStore.persist``'s JSON
  (``{"store": {key: [message, ...]}}``); each message is a ``ChatMessage`` as
  ``model_dump`` writes it (``role``, and ``blocks`` or ``content``; LlamaIndex's roles
  ``chatbot`` and ``model`` are the assistant, ``function`` a tool). One key is read:
  ``sample=`` names it, default the first.
- ``"locomo"``: a LoCoMo conversation: one ``conv-N.json``, or the published
  ``locomo10.json`` (a list of ten; ``sample=`` picks one by its ``sample_id``, default the
  first). ``speaker_a`` is the user, ``speaker_b`` the assistant; sessions are read in
  order; each message keeps its ``dia_id`` and the ``qa`` list becomes :class:`Question`
  objects whose evidence points into the messages.

:func:`builtin_transcript` is the conversation that ships with the package (the one
``demote demo`` plays), with its questions; it needs no download.

A line that cannot be read raises :class:`~demote.errors.TranscriptError` naming its
1-based line number (for a JSON list, the 1-based item number).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from demote.errors import TranscriptError
from demote.records import ROLE_ALIASES, Role

__all__ = [
    "LOCOMO_HINT",
    "Format",
    "Question",
    "Transcript",
    "builtin_transcript",
    "load_transcript",
    "parse_chat_store",
    "parse_jsonl",
    "parse_locomo",
    "parse_messages",
]

Format = Literal["auto", "jsonl", "langchain", "locomo", "llamaindex"]

#: Where to get the LoCoMo data (it is not part of the package).
LOCOMO_HINT = (
    "LoCoMo is not shipped with demote: get data/locomo10.json from the "
    "snap-research/locomo repository on GitHub (research use), then pass its path"
)
#: The package data folder (the built-in conversation).
DATA = Path(__file__).resolve().parent.parent / "data"

# LlamaIndex's MessageRole has three more names for roles demote knows.
_ROLES: dict[str, Role] = {**ROLE_ALIASES, "chatbot": "assistant", "model": "assistant",
                           "function": "tool"}  # fmt: skip
# messages_to_dict writes message.type; chunks carry their class name.
_CHUNK_TYPES: dict[str, Role] = {
    "HumanMessageChunk": "user",
    "AIMessageChunk": "assistant",
    "SystemMessageChunk": "system",
    "ToolMessageChunk": "tool",
    "FunctionMessageChunk": "tool",
}


@dataclass(frozen=True, slots=True)
class Question:
    """A question asked about a transcript (LoCoMo's ``qa`` list).

    Attributes:
        text: The question.
        evidence: Indexes into :attr:`Transcript.messages` of the messages that hold the
            answer (ids that name no message are left out; see ``evidence_ids``).
        category: The dataset's category number, if any.
        answer: The reference answer, if any.
        evidence_ids: The evidence as the dataset names it (``"D3:5"``), normalized.
    """

    text: str
    evidence: tuple[int, ...] = ()
    category: int | None = None
    answer: str | None = None
    evidence_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Transcript:
    """A transcript: messages in order, and optional questions about them.

    Attributes:
        messages: ``(role, text)`` pairs, oldest first.
        questions: Questions with evidence indexes into ``messages``.
        source_format: ``"jsonl"``, ``"langchain"`` or ``"locomo"``.
        message_ids: Per-message ids from the source (LoCoMo ``dia_id``), or empty.
        name: A label (the file's stem when read from a file).
    """

    messages: tuple[tuple[Role, str], ...]
    questions: tuple[Question, ...] = ()
    source_format: str = "jsonl"
    message_ids: tuple[str, ...] = ()
    name: str = ""

    def __len__(self) -> int:
        return len(self.messages)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "\n".join(parts)
    raise TranscriptError(f"{where}content must be a string or a list of blocks")


def _message(item: Any, where: str = "") -> tuple[Role, str]:
    """One message from a role/content dict or a LangChain ``messages_to_dict`` dict."""
    if not isinstance(item, Mapping):
        raise TranscriptError(f"{where}expected a JSON object, got {type(item).__name__}")
    if "type" in item and "data" in item and "role" not in item:
        kind, data = item["type"], item["data"]
        if not isinstance(data, Mapping) or "content" not in data:
            raise TranscriptError(f"{where}missing 'data.content'")
        if kind == "chat":  # ChatMessage carries its own role
            kind = data.get("role")
        role = _CHUNK_TYPES.get(kind) if isinstance(kind, str) else None
        if role is None:
            role = _ROLES.get(kind) if isinstance(kind, str) else None
        if role is None:
            raise TranscriptError(f"{where}unknown message type {kind!r}")
        return role, _text(data["content"], where)
    if "role" not in item:
        raise TranscriptError(f"{where}missing 'role'")
    if "content" in item and item["content"] is not None:
        content = item["content"]
    elif "blocks" in item:  # a LlamaIndex ChatMessage: its text is in its blocks
        content = item["blocks"]
    else:
        raise TranscriptError(f"{where}missing 'content'")
    raw = item["role"]
    known = _ROLES.get(raw.lower()) if isinstance(raw, str) else None
    if known is None:
        raise TranscriptError(f"{where}unknown role {raw!r}; expected one of {sorted(_ROLES)}")
    return known, _text(content, where)


def parse_jsonl(lines: Iterable[str], *, name: str = "", sample: str | None = None) -> Transcript:
    """Read JSONL: one role/content (or LangChain dict) message per line.

    Lines of a LlamaIndex chat store (``{"key": ..., "message": ...}``) are read too:
    the messages of one key, ``sample`` (default: the first key), in order.

    Raises:
        TranscriptError: A line is not JSON, lacks ``role``/``content`` or names an
            unknown role; the error's ``line`` is its 1-based number. Or ``sample`` is
            not a key of the chat store.
    """
    messages: list[tuple[Role, str]] = []
    langchain = True
    keys: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TranscriptError(f"not valid JSON ({exc.msg})", line=number) from None
        stored = _chat_store_line(item)
        try:
            if stored is not None:
                key, item = stored
                if key not in keys:
                    keys.append(key)
                if key != (keys[0] if sample is None else sample):
                    continue
            messages.append(_message(item))
        except TranscriptError as exc:
            raise TranscriptError(str(exc), line=number) from None
        langchain = langchain and "data" in item and "role" not in item
    if keys:
        return _stored_chat(messages, keys, sample, name)
    fmt = "langchain" if messages and langchain else "jsonl"
    return Transcript(tuple(messages), source_format=fmt, name=name)


def _chat_store_line(item: Any) -> tuple[str, Any] | None:
    """``(key, message)`` of a LlamaIndex chat store line, ``None`` for any other line."""
    if isinstance(item, Mapping) and set(item) == {"key", "message"}:
        key = item["key"]
        if not isinstance(key, str):
            raise TranscriptError(f"a chat store key must be a string, got {key!r:.40}")
        return key, item["message"]
    return None


def _stored_chat(
    messages: list[tuple[Role, str]], keys: list[str], sample: str | None, name: str
) -> Transcript:
    """The transcript of one key of a LlamaIndex chat store (``sample``, else the first)."""
    if sample is not None and sample not in keys:
        raise TranscriptError(f"no chat store key {sample!r}; it has {', '.join(keys)}")
    key = keys[0] if sample is None else sample
    return Transcript(tuple(messages), source_format="llamaindex", name=key or name)


def parse_chat_store(doc: Mapping[str, Any], *, sample: str | None = None) -> Transcript:
    """Read ``SimpleChatStore.persist``'s JSON: the messages of one key (default the first).

    Raises:
        TranscriptError: A message cannot be read (named by key and 1-based number), or
            ``sample`` is not a key.
    """
    store = doc["store"]
    keys = [str(k) for k in store]
    if not keys:
        return Transcript((), source_format="llamaindex")
    key = keys[0] if sample is None else sample
    items = store.get(key, []) if sample is None or sample in keys else []
    messages = [_message(item, f"{key} item {n}: ") for n, item in enumerate(items, 1)]
    return _stored_chat(messages, keys, sample, key)


def parse_messages(items: Sequence[Any], *, name: str = "") -> Transcript:
    """Read a JSON list of messages (``messages_to_dict`` output or role/content dicts).

    Raises:
        TranscriptError: An item cannot be read (the message names its 1-based number).
    """
    messages = [_message(item, f"item {n}: ") for n, item in enumerate(items, 1)]
    langchain = all(isinstance(i, Mapping) and "data" in i for i in items)
    fmt = "langchain" if messages and langchain else "jsonl"
    return Transcript(tuple(messages), source_format=fmt, name=name)


def _evidence_ids(raw: Any) -> tuple[str, ...]:
    # A few LoCoMo annotations join two ids ("D8:6; D9:17") or misplace a colon ("D:11:26").
    found: list[str] = []
    for item in raw if isinstance(raw, list) else []:
        for part in re.split(r"[;,\s]+", str(item)):
            if part:
                ident = re.sub(r"^D:", "D", part)
                if ident not in found:
                    found.append(ident)
    return tuple(found)


def parse_locomo(
    doc: Mapping[str, Any],
    *,
    with_speaker: bool = False,
    with_date: bool = False,
    name: str = "",
) -> Transcript:
    """Read one LoCoMo conversation (a parsed ``conv-N.json``).

    Args:
        doc: The parsed JSON document.
        with_speaker: Prefix each text with ``"<speaker>: "``.
        with_date: Prefix each text with ``"[<session date>] "``.
        name: A label for the transcript.

    Raises:
        TranscriptError: The document lacks the speakers or a session is malformed.
    """
    conv = doc.get("conversation", doc)  # the combined locomo10.json nests it
    try:
        roles: dict[str, Role] = {conv["speaker_a"]: "user", conv["speaker_b"]: "assistant"}
    except (KeyError, TypeError):
        raise TranscriptError("not a LoCoMo conversation: missing speaker_a/speaker_b") from None
    sessions = sorted(int(m.group(1)) for k in conv if (m := re.fullmatch(r"session_(\d+)", k)))
    messages: list[tuple[Role, str]] = []
    ids: list[str] = []
    for s in sessions:
        date = conv.get(f"session_{s}_date_time", "")
        for n, turn in enumerate(conv[f"session_{s}"], 1):
            try:
                speaker, text = turn["speaker"], turn["text"]
                role = roles[speaker]
            except (KeyError, TypeError):
                raise TranscriptError(
                    f"session_{s} turn {n}: needs 'speaker' (one of the two) and 'text'"
                ) from None
            prefix = f"[{date}] " if with_date and date else ""
            if with_speaker:
                prefix += f"{speaker}: "
            messages.append((role, prefix + str(text)))
            ids.append(str(turn.get("dia_id", "")))
    position = {ident: i for i, ident in enumerate(ids) if ident}
    questions = []
    for qa in doc.get("qa", []):
        evidence_ids = _evidence_ids(qa.get("evidence", []))
        answer = qa.get("answer", qa.get("adversarial_answer"))
        category = qa.get("category")
        questions.append(
            Question(
                text=str(qa.get("question", "")),
                evidence=tuple(position[e] for e in evidence_ids if e in position),
                category=category if isinstance(category, int) else None,
                answer=None if answer is None else str(answer),
                evidence_ids=evidence_ids,
            )
        )
    return Transcript(tuple(messages), tuple(questions), "locomo", tuple(ids), name)


def load_transcript(
    path: str | os.PathLike[str],
    *,
    format: Format = "auto",
    with_speaker: bool = False,
    with_date: bool = False,
    sample: str | None = None,
) -> Transcript:
    """Read a transcript file.

    Args:
        path: The file.
        format: ``"auto"`` (default) picks by content: a JSON object with ``speaker_a`` (or
            a list of such objects under ``"conversation"``) is LoCoMo, another JSON list
            is a message list, anything else is JSONL.
        with_speaker: LoCoMo only: prefix texts with the speaker's name.
        with_date: LoCoMo only: prefix texts with the session date.
        sample: Which conversation of a file of several: a LoCoMo ``sample_id``
            (``locomo10.json``) or a LlamaIndex chat store key; default the first.

    Raises:
        TranscriptError: The file cannot be read as a transcript, or has no such sample.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TranscriptError(f"cannot read transcript {p}: {exc}") from None
    if format in ("auto", "locomo", "langchain", "llamaindex") and text.lstrip()[:1] in ("{", "["):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None  # perhaps JSONL; let the line reader name the bad line
        if isinstance(doc, list) and _is_locomo_set(doc):
            doc, name = _pick_sample(doc, sample, p)
            return parse_locomo(doc, with_speaker=with_speaker, with_date=with_date, name=name)
        if isinstance(doc, Mapping) and isinstance(doc.get("store"), Mapping):
            return parse_chat_store(doc, sample=sample)
        if isinstance(doc, Mapping) and (format == "locomo" or "speaker_a" in doc):
            return parse_locomo(doc, with_speaker=with_speaker, with_date=with_date, name=p.stem)
        if isinstance(doc, list) and format != "locomo":
            return parse_messages(doc, name=p.stem)
    if format == "locomo":
        raise TranscriptError(f"{p} is not a LoCoMo conversation (a JSON object)")
    return parse_jsonl(text.splitlines(), name=p.stem, sample=sample)


def _is_locomo_set(doc: list[Any]) -> bool:
    first = doc[0] if doc else None
    conv = first.get("conversation") if isinstance(first, Mapping) else None
    return isinstance(conv, Mapping) and "speaker_a" in conv


def _pick_sample(doc: list[Any], sample: str | None, path: Path) -> tuple[Any, str]:
    ids = [str(item.get("sample_id", n)) for n, item in enumerate(doc, 1)]
    if sample is None:
        return doc[0], ids[0]
    if sample not in ids:
        raise TranscriptError(f"{path}: no sample {sample!r}; it has {', '.join(ids)}")
    return doc[ids.index(sample)], sample


def builtin_transcript() -> Transcript:
    """The conversation that ships with demote (``demote/data/conversation.json``).

    600 messages of a generated everyday chat whose early facts (a locker code, a cat's
    name, an allergy, a date) are asked about at the end. Each question's evidence is the
    first user message that states its answer. No download needed.
    """
    doc = json.loads(DATA.joinpath("conversation.json").read_text("utf-8"))
    messages = tuple((_ROLES[m["role"]], str(m["content"])) for m in doc["messages"])
    questions = []
    for probe in doc["probes"]:
        answer = str(probe["answer"])
        said = next(
            i
            for i, (role, text) in enumerate(messages)
            if role == "user" and answer.lower() in text.lower()
        )
        questions.append(Question(str(probe["question"]), (said,), answer=answer))
    return Transcript(tuple(messages), tuple(questions), "builtin", (), str(doc["name"]))
