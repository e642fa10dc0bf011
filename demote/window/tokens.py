"""Token counters, and a cache so each message is counted once in its life.

A message costs what a provider bills for it (:func:`billed_tokens`): its text, its tool
calls (name, id and arguments, as :func:`calls_text` writes them), the id of the call a
tool result answers, the tool's name, the role, its content blocks (images, audio and
files by the providers' documented estimates, see :mod:`demote.window.media`; reasoning by
its text; any other block by its JSON), plus :data:`MESSAGE_OVERHEAD` for the framing.
Under ``"approx"`` the message's own characters are counted as one text, rounded up once,
as langchain-core's ``count_tokens_approximately`` counts a message, so a text-only agent
request counts within 2% of LangChain's count (on the 31 real runs of the development set:
the same count; ``tests/demote/window/test_tokens_traces.py`` holds the bound);
docs/counting-and-records.md gives the estimates and their sources.

The text counter is ``"approx"`` (characters / 4, rounded up, as langchain-core
approximates) by default; ``"tiktoken"`` uses tiktoken's ``cl100k_base`` when installed.
Any callable ``str -> int`` works too; :func:`register_counter` gives it a name so a
policy that uses it can be written to JSON and read back. A :class:`MessageCounter`
counts whole framework messages instead (a chat model's ``get_num_tokens_from_messages``,
built by the adapters' ``message_counter``): the cache then hands it the message itself.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from demote.errors import ConfigError, MissingExtraError
from demote.window.media import (
    REASONING,
    TOOL_USE,
    media_tokens,
    reasoning_text,
    without_payloads,
)

__all__ = [
    "MESSAGE_OVERHEAD",
    "MessageCounter",
    "TokenCache",
    "approximate_tokens",
    "billed_tokens",
    "block_tokens",
    "calls_text",
    "counter_name",
    "register_counter",
    "resolve_counter",
    "schema_tokens",
]

#: Tokens added per message for its framing (langchain-core uses 3); the role's name is
#: counted as text.
MESSAGE_OVERHEAD = 3

Counter = Callable[[str], int]


def approximate_tokens(text: str) -> int:
    """About one token per four characters, rounded up (langchain-core's heuristic)."""
    return math.ceil(len(text) / 4)


class MessageCounter:
    """A counter of whole framework messages, for a policy's ``counter=``.

    The token cache calls ``count_messages([message])`` with the framework's own message
    (once per message fingerprint), so a chat model's ``get_num_tokens_from_messages``
    counts exactly what it would send; the result is taken as it is (no overhead is
    added: the model's count includes its framing). Text with no message behind it (a
    summary, a recall) is counted as ``count_messages([text_message(text)])``.

    The adapters build one: ``langchain_demote.message_counter(model)`` and
    ``llamaindex_demote.message_counter(counter)``.

    Args:
        count_messages: Counts a list of framework messages.
        text_message: Makes a framework message of a text.
        name: What ``repr`` shows.
    """

    __slots__ = ("count_messages", "name", "text_message")

    def __init__(
        self,
        count_messages: Callable[[list[Any]], int],
        text_message: Callable[[str], Any],
        name: str = "messages",
    ) -> None:
        if not callable(count_messages) or not callable(text_message):
            raise ConfigError("counter: MessageCounter needs two callables")
        self.count_messages = count_messages
        self.text_message = text_message
        self.name = name

    def __call__(self, text: str) -> int:
        """Tokens of ``text`` sent as one message (framing included)."""
        return self.count_messages([self.text_message(text)])

    def __repr__(self) -> str:
        return f"MessageCounter({self.name})"


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def schema_tokens(
    name: str, description: str, parameters: Mapping[str, Any], counter: Counter
) -> int:
    """Tokens of one tool definition sent with a request, under ``counter``.

    Under the default counter (four characters a token) it is counted as langchain-core's
    ``count_tokens_approximately`` counts a tool object: the JSON (with spaces) of its
    name, description and parameters (the parameters' own title and description left
    out, as they repeat the tool's), rounded up once. So both adapters count the same
    tool the same way, and as LangChain does. Under any other counter, the compact JSON
    of the OpenAI-style definition is counted by it.

    Args:
        name: The tool's name.
        description: Its description.
        parameters: Its parameters' JSON schema.
        counter: The policy's text counter.
    """
    if counter is approximate_tokens:
        params = {k: v for k, v in parameters.items() if k not in ("title", "description")}
        body = {"name": name, "description": description, "parameters": params}
        return math.ceil(len(json.dumps(body, default=str)) / 4)
    schema = {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }
    return counter(json.dumps(schema, default=str, separators=(",", ":")))


def _tiktoken_counter() -> Counter:
    try:
        import tiktoken
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("tiktoken", "tiktoken") from exc
    try:
        encoding = tiktoken.get_encoding("cl100k_base")
    except Exception as exc:  # first use downloads the encoding: offline, it cannot
        raise ConfigError(f"counter: cannot load tiktoken's cl100k_base encoding: {exc}") from exc

    def count(text: str) -> int:
        return len(encoding.encode(text, disallowed_special=()))

    return count


_REGISTRY: dict[str, Counter] = {"approx": approximate_tokens}
_LAZY: dict[str, Callable[[], Counter]] = {"tiktoken": _tiktoken_counter}
_REGISTRY_LOCK = threading.Lock()


def register_counter(name: str, counter: Counter) -> None:
    """Register ``counter`` under ``name`` so policies can refer to it in JSON."""
    if not name or not isinstance(name, str):
        raise ConfigError("counter name must be a non-empty string")
    if not callable(counter):
        raise ConfigError(f"counter {name!r} must be callable")
    with _REGISTRY_LOCK:
        _REGISTRY[name] = counter


def resolve_counter(counter: str | Counter) -> Counter:
    """The callable behind a counter name (or the callable itself)."""
    if callable(counter):
        return counter
    with _REGISTRY_LOCK:
        if counter in _REGISTRY:
            return _REGISTRY[counter]
        if counter in _LAZY:
            _REGISTRY[counter] = _LAZY[counter]()
            return _REGISTRY[counter]
    known = sorted({*_REGISTRY, *_LAZY})
    raise ConfigError(f"counter: unknown counter {counter!r}; known: {known}")


def counter_name(counter: str | Counter) -> str | None:
    """The registered name of ``counter``, or ``None`` for an unregistered callable."""
    if isinstance(counter, str):
        return counter
    with _REGISTRY_LOCK:
        for name, fn in _REGISTRY.items():
            if fn is counter:
                return name
    return None


def _checked(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ConfigError(f"counter: must return a non-negative int, returned {raw!r}")
    return raw


def block_tokens(block: object, counter: Counter, calls: frozenset[str] = frozenset()) -> int:
    """Tokens of one content block (not counting the message's framing).

    Images, audio and files are estimated as the providers document it
    (:func:`demote.window.media.media_tokens`); reasoning and thinking blocks count their text;
    a text block its text; a tool-use block whose id is in ``calls`` nothing (the call is
    counted once, as a tool call); anything else its JSON.

    Args:
        block: A block of the neutral form (a dict; a bare string is text).
        counter: The text counter.
        calls: Ids of the tool calls the message makes (counted apart).
    """
    if isinstance(block, str):
        return _checked(counter(block))
    if not isinstance(block, Mapping):
        return _checked(counter(str(block)))
    kind = str(block.get("type") or block.get("block_type") or "")
    media = media_tokens(kind, block)
    if media is not None:
        return media
    if kind == "text":
        text = block.get("text")
        return _checked(counter(text if isinstance(text, str) else _json(block)))
    if kind in REASONING:
        return _checked(counter(reasoning_text(block)))
    if kind in TOOL_USE and str(block.get("id") or block.get("tool_call_id")) in calls:
        return 0
    return _checked(counter(_json(without_payloads(block))))


def calls_text(calls: Sequence[Mapping[str, Any]]) -> str:
    """The text a message's tool calls count as: the list of calls as Python shows it.

    Each call is ``{"name", "args", "id", "type": "tool_call"}``, the form (and the
    characters) langchain-core's ``count_tokens_approximately`` counts; its framing stands
    for the wire form's (OpenAI's ``{"id", "type": "function", "function": {...}}``).
    Deterministic for the JSON values arguments hold.

    Args:
        calls: ``{"id", "name", "args"}`` each.
    """
    return repr(
        [
            {
                "name": call.get("name"),
                "args": {} if call.get("args") is None else call.get("args"),
                "id": call.get("id"),
                "type": "tool_call",
            }
            for call in calls
        ]
    )


def billed_tokens(
    text: str,
    counter: Counter,
    *,
    calls: Sequence[Mapping[str, Any]] = (),
    blocks: Sequence[object] = (),
    answers: str | None = None,
    role: str | None = None,
    name: str | None = None,
) -> int:
    """What a provider bills for one message, by ``counter`` and the media estimates.

    The message's own parts (its text, :func:`calls_text` of its calls, the id it
    answers, its role and name) are counted by ``counter`` one by one; under ``"approx"``
    as one text (their length / 4, rounded up once, as langchain-core counts a message).

    Args:
        text: The message text.
        counter: Counts text (``str -> int``).
        calls: Its tool calls, ``{"id", "name", "args"}`` each.
        blocks: Its content blocks other than text (see :func:`block_tokens`).
        answers: The id of the tool call it answers (sent with the result).
        role: Its role (``user``, ``assistant``, ``system``, ``tool``), sent with it.
        name: Its name (a tool result: the tool's), when it is sent.

    Returns:
        The count, :data:`MESSAGE_OVERHEAD` included.
    """
    parts = [text]
    if calls:
        parts.append(calls_text(calls))
    for extra in (answers, role, name):
        if extra:
            parts.append(extra)
    if counter is approximate_tokens:  # one text: rounded up once, as langchain-core does
        total = math.ceil(sum(map(len, parts)) / 4)
    else:
        total = sum(_checked(counter(part)) for part in parts)
    total += MESSAGE_OVERHEAD
    if blocks:
        ids = frozenset(str(call.get("id")) for call in calls)
        for block in blocks:
            total += block_tokens(block, counter, ids)
    return total


class TokenCache:
    """Counts messages with a counter, caching by message fingerprint.

    Thread-safe without a lock (each step is one atomic dict operation) and bounded
    (least recently used entries go first). A counter that returns a negative number or
    a non-int raises :class:`ConfigError`.
    """

    __slots__ = ("_counter", "_entries", "_max")

    def __init__(self, counter: str | Counter = "approx", *, max_entries: int = 200_000) -> None:
        self._counter = resolve_counter(counter)
        self._entries: OrderedDict[str, int] = OrderedDict()
        self._max = max_entries

    @property
    def counter(self) -> Counter:
        """The text counter (a :class:`MessageCounter` counts whole messages)."""
        return self._counter

    def count(
        self,
        fingerprint: str,
        text: str,
        *,
        calls: Sequence[Mapping[str, Any]] = (),
        blocks: Sequence[object] = (),
        answers: str | None = None,
        role: str | None = None,
        name: str | None = None,
        message: object = None,
    ) -> int:
        """Tokens of one message, counted once per ``fingerprint``.

        With a :class:`MessageCounter` and ``message`` given, the counter counts the
        message itself; otherwise :func:`billed_tokens` counts ``text``, ``calls``,
        ``blocks``, ``answers``, ``role`` and ``name`` (a :class:`MessageCounter` without a
        message counts the text as one message).
        """
        entries = self._entries
        hit = entries.get(fingerprint)
        if hit is not None:
            try:  # noqa: SIM105 (a suppress() costs a context manager per message)
                entries.move_to_end(fingerprint)
            except KeyError:  # another thread evicted it just now: the count stands
                pass
            return hit
        counter = self._counter
        if counter is approximate_tokens and not (calls or blocks or answers or name):
            # Text and role alone (most messages): billed_tokens' count, in one step.
            tokens = -(-(len(text) + len(role or "")) // 4) + MESSAGE_OVERHEAD
        elif isinstance(counter, MessageCounter):
            whole = message if message is not None else counter.text_message(text)
            tokens = _checked(counter.count_messages([whole]))
        else:
            tokens = billed_tokens(
                text, counter, calls=calls, blocks=blocks, answers=answers, role=role, name=name
            )
        entries[fingerprint] = tokens
        if len(entries) > self._max:
            try:  # noqa: SIM105 (as above)
                entries.popitem(last=False)
            except KeyError:  # another thread emptied it
                pass
        return tokens

    def __len__(self) -> int:
        return len(self._entries)
