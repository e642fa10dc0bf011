"""Content blocks of the neutral form: what media costs, and media kept by reference.

Pure functions over the blocks adapters put in a message's neutral form (LangChain's
standard, OpenAI and Anthropic block dicts, LlamaIndex's block dumps). No framework is
imported; a block is recognised by its ``type`` (or LlamaIndex's ``block_type``).

Estimates (docs/counting-and-records.md gives the sources):

- **Images.** OpenAI-format blocks (``image_url``, ``input_image``): ``detail="low"``
  costs 85 tokens; otherwise the image is fitted in 2048 x 2048, its shortest side scaled
  to 768 px, and it costs 85 + 170 per 512-px tile. Every other image block is counted as
  Anthropic documents it: the long edge fitted in 1568 px, then width x height / 750, at
  most 1,600. The size is read from the block (``width``/``height``) or from the image
  bytes (PNG, GIF, JPEG, WebP headers); unknown (an image by URL), an image costs
  :data:`IMAGE_TOKENS` (1,600: Anthropic's largest image, above OpenAI's 2048 x 768).
- **Audio.** 32 tokens per second (Gemini's rate; OpenAI's is lower), the duration taken
  from the block or from its bytes at 16 kB/s (128 kbit/s); unknown: one minute.
- **Video.** 263 tokens per second (Gemini); unknown: :data:`VIDEO_TOKENS` (ten seconds).
- **Files.** 3,000 tokens per page when the block says its pages (the top of Anthropic's
  1,500 to 3,000 per PDF page); text files by their decoded characters / 4; other files
  with bytes 3,000 per started 100 kB; unknown: one page.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import struct
from collections.abc import Mapping
from typing import Any

__all__ = [
    "AUDIO_TOKENS",
    "FILE_TOKENS",
    "IMAGE_TOKENS",
    "REASONING",
    "TOOL_USE",
    "VIDEO_TOKENS",
    "by_reference",
    "data_by_reference",
    "image_size",
    "media_tokens",
    "reasoning_text",
    "without_payloads",
]

#: An image of unknown size (by URL or file id).
IMAGE_TOKENS = 1600
#: Audio of unknown length: one minute at 32 tokens per second.
AUDIO_TOKENS = 1920
#: Video of unknown length: ten seconds at 263 tokens per second.
VIDEO_TOKENS = 2630
#: A file of unknown size: one PDF page at Anthropic's upper estimate.
FILE_TOKENS = 3000

IMAGE = frozenset({"image", "image_url", "input_image"})
AUDIO = frozenset({"audio", "input_audio"})
VIDEO = frozenset({"video"})
FILE = frozenset({"file", "document", "input_file", "pdf"})
#: Reasoning blocks: their text is counted.
REASONING = frozenset({"reasoning", "thinking", "redacted_thinking"})
#: Tool-use blocks: counted as the message's tool calls when their id is one of them.
TOOL_USE = frozenset({"tool_use", "tool_call", "function_call", "server_tool_use"})

# Keys whose string value may be base64 bytes, and keys that may hold a data: URL.
_PAYLOAD_KEYS = frozenset({"data", "base64", "file_data", "image", "audio", "video", "bytes"})
_URL_KEYS = frozenset({"url", "image_url", "file_data", "uri"})
_HEAD = 96_000  # base64 characters decoded to find an image's size (72 kB)


def _payload(block: Mapping[str, Any]) -> str | None:
    """The block's base64 payload (nested one level, as in OpenAI and Anthropic forms)."""
    for key, value in block.items():
        if isinstance(value, str):
            if key in _URL_KEYS and value.startswith("data:") and "," in value:
                return value.split(",", 1)[1]
            if _is_payload(key, value):
                return value
        elif isinstance(value, Mapping):
            inner = _payload(value)
            if inner is not None:
                return inner
    return None


def _decoded(payload: str, limit: int | None = None) -> bytes:
    head = payload if limit is None else payload[:limit]
    head = head[: len(head) - len(head) % 4]
    try:
        return base64.b64decode(head, validate=False)
    except (binascii.Error, ValueError):
        return b""


def _number(block: Mapping[str, Any], *names: str) -> float | None:
    for scope in (block, block.get("metadata"), block.get("extras"), block.get("source")):
        if isinstance(scope, Mapping):
            for name in names:
                value = scope.get(name)
                if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                    return float(value)
    return None


def _detail(block: Mapping[str, Any]) -> str:
    for scope in (block, block.get("image_url"), block.get("metadata")):
        if isinstance(scope, Mapping) and isinstance(scope.get("detail"), str):
            return str(scope["detail"])
    return "auto"


def image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from the first bytes of a PNG, GIF, JPEG or WebP image."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8X":
            w = int.from_bytes(data[24:27], "little") + 1
            return w, int.from_bytes(data[27:30], "little") + 1
        if chunk == b"VP8L" and len(data) >= 25:
            bits = int.from_bytes(data[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if chunk == b"VP8 ":
            w, h = struct.unpack("<HH", data[26:30])
            return w & 0x3FFF, h & 0x3FFF
        return None
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                i += 1
                continue
            marker = data[i + 1]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", data[i + 5 : i + 9])
                return w, h
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                i += 2
                continue
            i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
    return None


def _openai_tiles(w: float, h: float) -> int:
    scale = min(1.0, 2048 / max(w, h))
    w, h = w * scale, h * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)


def _anthropic(w: float, h: float) -> int:
    scale = min(1.0, 1568 / max(w, h))
    return min(IMAGE_TOKENS, math.ceil(w * scale * h * scale / 750))


def _image(kind: str, block: Mapping[str, Any]) -> int:
    openai = kind in ("image_url", "input_image")
    if openai and _detail(block) == "low":
        return 85
    w, h = _number(block, "width"), _number(block, "height")
    if w is None or h is None:
        payload = _payload(block)
        size = image_size(_decoded(payload, _HEAD)) if payload else None
        if size is None or 0 in size:
            return IMAGE_TOKENS
        w, h = float(size[0]), float(size[1])
    return _openai_tiles(w, h) if openai else _anthropic(w, h)


def _bytes(block: Mapping[str, Any]) -> int | None:
    payload = _payload(block)
    if payload is None:
        return None
    return len(payload) * 3 // 4 - (len(payload) - len(payload.rstrip("=")))


def _mime(block: Mapping[str, Any]) -> str:
    for name in ("mime_type", "media_type", "document_mimetype", "format"):
        for scope in (block, block.get("source"), block.get("file")):
            if isinstance(scope, Mapping) and isinstance(scope.get(name), str):
                return str(scope[name])
    return ""


def _file(block: Mapping[str, Any]) -> int:
    pages = _number(block, "pages", "page_count")
    if pages is not None:
        return FILE_TOKENS * math.ceil(pages)
    mime = _mime(block)
    text = block.get("text") or (block.get("source") or {}).get("text") if mime else None
    if isinstance(text, str):
        return math.ceil(len(text) / 4)
    size = _bytes(block)
    if size is None:
        return FILE_TOKENS
    if mime.startswith("text/") or mime in ("application/json", "application/xml"):
        return math.ceil(size / 4)
    return FILE_TOKENS * max(1, math.ceil(size / 100_000))


def media_tokens(kind: str, block: Mapping[str, Any]) -> int | None:
    """Tokens of a media block by the providers' estimates; ``None`` if not media."""
    if kind in IMAGE:
        return _image(kind, block)
    if kind in AUDIO or kind in VIDEO:
        rate = 32 if kind in AUDIO else 263
        seconds = _number(block, "duration", "duration_seconds", "seconds")
        if seconds is None:
            size = _bytes(block)
            if size is None:
                return AUDIO_TOKENS if kind in AUDIO else VIDEO_TOKENS
            seconds = size / (16_000 if kind in AUDIO else 250_000)
        return math.ceil(seconds * rate)
    if kind in FILE:
        return _file(block)
    return None


def reasoning_text(block: Mapping[str, Any]) -> str:
    """The text of a reasoning block (``reasoning``, ``thinking``, summaries, signature)."""
    parts: list[str] = []
    for name in ("reasoning", "thinking", "text", "content", "data", "signature"):
        value = block.get(name)
        if isinstance(value, str):
            parts.append(value)
    summary = block.get("summary")
    if isinstance(summary, list):
        parts.extend(str(s.get("text", "")) for s in summary if isinstance(s, Mapping))
    return "\n".join(parts)


def without_payloads(block: Mapping[str, Any]) -> dict[str, Any]:
    """``block`` with each base64 payload replaced by its length (for counting JSON)."""
    out: dict[str, Any] = {}
    for key, value in block.items():
        if isinstance(value, Mapping):
            out[key] = without_payloads(value)
        elif _is_payload(key, value):
            out[key] = f"<{len(value)} base64 characters>"
        else:
            out[key] = value
    return out


def _is_payload(key: str, value: object) -> bool:
    if not isinstance(value, str):
        return False
    if key in _URL_KEYS and value.startswith("data:"):
        return True
    if key == "base64":
        return True
    return key in _PAYLOAD_KEYS and len(value) > 64 and not value.startswith("http")


def by_reference(block: object) -> object:
    """``block`` with its bytes left out: URLs, file ids, types and sizes stay.

    Each base64 payload (a ``data``/``base64`` value, or a ``data:`` URL) is replaced by
    ``None`` and the block gains ``"omitted": {"bytes": n, "sha256": hex}`` (the decoded
    size and digest), so the archive shows what was there without keeping it.
    """
    if not isinstance(block, Mapping):
        return block
    omitted: list[str] = []
    out = _strip(block, omitted)
    if omitted:
        raw = b"".join(_decoded(p) for p in omitted)
        out["omitted"] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    return out


def _strip(block: Mapping[str, Any], omitted: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in block.items():
        if isinstance(value, Mapping):
            out[key] = _strip(value, omitted)
        elif _is_payload(key, value):
            omitted.append(value.split(",", 1)[1] if value.startswith("data:") else value)
            out[key] = None
        else:
            out[key] = value
    return out


def data_by_reference(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with media bytes left out (URLs, file ids and sizes stay).

    Each base64 payload in ``blocks`` is dropped and its block gains ``"omitted":
    {"bytes", "sha256"}``; the rest of the message is kept as it is. What the archives,
    mem0 and vector-store hooks store with their default ``media="reference"``.
    """
    blocks = data.get("blocks")
    if not blocks:
        return dict(data)
    return {**data, "blocks": [by_reference(b) for b in blocks]}
