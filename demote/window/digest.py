"""The note a :class:`~demote.window.policy.LowWater` cut leaves of the steps it drops.

Theory of operation
-------------------
An agent copies identifiers from earlier tool results into its next calls: a file path it
listed, a reservation id it was given, a name in the code it is about to edit, a version.
A window that dropped the result holding one could not have produced that call, and a bare
list of identifiers does not say which code is a reservation and which a flight. So when
a cut drops steps, it leaves a *note* of them, sent where a summary is, in three parts,
each newest first:

- **Asked**: the head of each user request the cut drops, so the note spans user turns
  (the running turn's own opener is among them when a cut drops it, though the window
  still sends it in full in front of the kept steps);
- **Did**: a trail of the agent's own calls, the tool's name and its arguments (a value
  that is one identifier, a path or an id, whole; any other cut to :data:`ARG_CHARS`
  characters): agents re-read and edit what they touched;
- **Saw**: one line per dropped tool result, under the call that produced it, named by
  the first argument that is one identifier, whole (``[Read /srv/app/views.py]``; a
  flag never names it), holding the result's identifiers in the order they
  stood, each with what it is: its key when the result gave it one
  (``reservation_id=ZFA04Y``), after the number of its line when the result numbers them
  (``42: load_booking``). An identifier is written once, at its newest result.

Each part has a share of the note's room (:data:`SHARES`); what one leaves unused goes to
the next (and room the results leave goes back to the trail). A new cut's entries come
first, then the previous note's, each part cut from its oldest end to fit: so a note
survives several cuts, its oldest entries leaving first. The result lines of a cut take up
to :data:`FRESH` of their room before older ones (on the development sessions, recency is
what agents reuse most: ``1.0`` kept 0.7 points more of what they copied than ``0.8``,
and a cap per result lost 2.3).

Credentials are not repeated: a value given to a key that names one (``password``,
``secret``, ``token``, ``api_key``, ...), a ``Bearer`` value and a value with a
well-known key prefix (``sk-``, ``ghp_``, ``AKIA``, a JWT) are written as
:data:`REDACTED` (:func:`redact`) before anything is taken from the text. The note is
sent with every request until the next cut and stored with the conversation's state; the
messages themselves are archived whole, where the recall tool finds the value when a step
needs it.

What counts as an identifier (:func:`identifiers`): a run of at least :data:`MIN_CHARS`
characters between whitespace, quotes and ``,;:()[]{}<>=|``, without the sentence
punctuation that ends it (``above.`` is a word), holding a digit or one of
``/ _ . @ -`` (and at most :data:`MAX_CHARS`, so an encoded blob does not eat the budget).

The note is a pure function of the previous note and the dropped messages (their records
and, for the trail, their calls): the same at every call until the next cut, in every
process, so the prompt prefix stays byte-identical and caches keep hitting. It is made at
the cut, with no model call, and committed with the window's start
(``ConversationState.summary``). A cut that drops no tool call or result (a chat) leaves
the previous note as it was (``None`` when there is none). When the window alone brings
the request over the limit, the note is what gives way: it is cut down to the room left,
or left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from demote.records import MessageRecord

__all__ = [
    "ARG_CHARS",
    "DIGEST_LEAD",
    "FRESH",
    "LINE_CHARS",
    "MAX_CHARS",
    "MIN_CHARS",
    "NOTE_LEAD",
    "REDACTED",
    "SHARES",
    "DroppedCall",
    "identifiers",
    "make_digest",
    "redact",
]

#: The shortest identifier kept.
MIN_CHARS = 6

#: The longest identifier kept (longer runs are blobs, not things an agent copies).
MAX_CHARS = 120

#: How the note starts; its parts follow, one entry a line.
NOTE_LEAD = (
    "What the steps that left the window asked, did and saw, newest first (each message "
    "is archived whole; the recall tool finds it by any word here)."
)

#: How the notes of earlier releases started (a bare list of identifiers); read back at
#: the next cut as the oldest entries.
DIGEST_LEAD = (
    "Identifiers from earlier tool results, newest first (the results are archived whole; "
    "the recall tool finds them): "
)

#: The longest trail line kept (past it, the line is cut).
LINE_CHARS = 240

#: How much of a call argument the trail keeps (one identifier is kept whole).
ARG_CHARS = 80

#: Share of the note's room each part may take first: asked, did, saw (what one leaves
#: unused goes to the next, then back).
SHARES = (0.08, 0.12, 0.8)

#: Share of the result lines' room a cut's new lines may take (the rest keeps the
#: previous note's, so a note survives several cuts).
FRESH = 1.0

#: What a credential's value is written as.
REDACTED = "[redacted]"

_ASKED, _DID, _SAW = "Asked:", "Did:", "Saw:"
_ASK_CHARS = 160  # the head of a request kept
_ASKED_KEPT = 6  # requests a note keeps at most

_SPLIT = re.compile(r"[\s'\"`,;:()\[\]{}<>=|]+")
_MARK = re.compile(r"[0-9/_.@-]")
_TRAILING = ".,;:!?"
_SPACE = re.compile(r"\s+")
_KEY = re.compile(r"([A-Za-z_][\w.-]{0,40})[\"']?\s*(?:=|:(?!:))\s*[\"'`]?$")
_LINE_NO = re.compile(r"\s*(\d{1,6})(?:\t|: |→)")
# A key naming a credential, then its value (quoted or bare).
_SECRET_KEY = re.compile(
    r"""(?ix)
    (\b[\w.-]*?(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key
        |private[_-]?key|credentials?)["']?\s*(?:=|:(?!:))\s*)
    (["']?)([^\s"',;\[\]{}()]{4,})(\2)
    """
)
_BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/=-]{8,})")
_KNOWN_SECRET = re.compile(
    r"\b(?:sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}"
    r"|xox[abpr]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+)"
)
# What the rendering adds around the note (the progress-note or summary lead), in tokens.
_FRAME = 24


@dataclass(frozen=True, slots=True)
class DroppedCall:
    """One tool call of a dropped assistant message: what the trail keeps of it.

    Attributes:
        id: The call's id (its result names it).
        name: The tool's name.
        args: The call's arguments, as the framework gave them.
    """

    id: str
    name: str
    args: Mapping[str, object]


def _trimmed(piece: str) -> str:
    return piece.rstrip(_TRAILING)


def identifiers(text: str) -> Iterator[str]:
    """The identifier-like pieces of ``text``, in order of appearance (repeats included)."""
    for run in _SPLIT.split(text):
        piece = _trimmed(run)
        if MIN_CHARS <= len(piece) <= MAX_CHARS and _MARK.search(piece):
            yield piece


def redact(text: str) -> str:
    """``text`` with credential-looking values written as :data:`REDACTED`."""
    if not text:
        return text
    text = _SECRET_KEY.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}{m.group(4)}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return _KNOWN_SECRET.sub(REDACTED, text)


def _one_line(text: str, limit: int) -> str:
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _value(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return " ".join(_value(v) for v in value)
    if isinstance(value, Mapping):
        return " ".join(f"{k}={_value(v)}" for k, v in value.items())
    return str(value)


def _whole(value: object) -> str | None:
    """``value`` when it is one identifier (a path, an id: no space, a digit or a mark)."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if MIN_CHARS <= len(text) <= MAX_CHARS and _MARK.search(text) and not _SPACE.search(text):
        return text
    return None


def _arg(value: object) -> str:
    """An argument as the note writes it: an identifier whole, anything else cut."""
    whole = _whole(value)
    return whole if whole is not None else _one_line(_value(value), ARG_CHARS)


def _label(call: DroppedCall | None, tool: str | None) -> str:
    """How a result's source is named: its call's tool and what it was called on.

    The first argument that is one identifier (the file read, the id looked up), whole;
    else the first other argument that is not a flag, cut to :data:`ARG_CHARS`.
    """
    if call is None:
        return tool or "tool"
    values = [v for v in call.args.values() if not isinstance(v, bool)]
    for value in values:
        whole = _whole(value)
        if whole is not None:
            return f"{call.name} {whole}"
    for value in values:
        text = _one_line(_value(value), ARG_CHARS)
        if text:
            return f"{call.name} {text}"
    return call.name


def _trail_line(call: DroppedCall) -> str:
    args = " ".join(f"{k}={_arg(v)}" for k, v in call.args.items() if _value(v).strip())
    return _one_line(f"{call.name} {args}".strip(), LINE_CHARS)


def _keyed(line: str, at: int) -> str | None:
    """The key an identifier at ``line[at:]`` is the value of (``key: value``, ``key=``)."""
    m = _KEY.search(line, max(0, at - 48), at)
    return None if m is None else m.group(1)


def _numbered(line: str) -> tuple[str | None, str]:
    """A line's number (``  42<TAB>...``, ``42: ...``, ``42→...``), and the line after it."""
    m = _LINE_NO.match(line)
    return (None, line) if m is None else (m.group(1), line[m.end() :])


def _saw_entry(label: str, text: str, taken: set[str]) -> str | None:
    """What a note keeps of one result: its identifiers not ``taken`` yet, in order.

    Each with its key when the result gave it one (``reservation_id=ZFA04Y``), after the
    number of the line it stood on when the result numbers its lines (``42: ...``).
    """
    items: list[str] = []
    named = set(identifiers(label))
    for raw in text.split("\n"):
        number, line = _numbered(raw)
        numbered = False
        for piece in identifiers(line):
            if piece in taken:
                continue
            key = _keyed(line, line.find(piece))
            plain = key is None or key in piece
            if plain and piece in named:  # the label says it already
                continue
            taken.add(piece)
            if number is not None and not numbered:
                items.append(f"{number}:")
                numbered = True
            if plain:
                items.append(piece)
                continue
            if items and items[-1] == key:  # the key was an identifier too: said once
                items.pop()
            items.append(f"{key}={piece}")
    if not items:
        return None
    return f"[{label}] " + " ".join(items)


@dataclass(slots=True)
class _Parts:
    """A note's entries, newest first: requests, calls, and result lines by source."""

    asked: list[str]
    did: list[str]
    saw: list[str]


def _parse(note: str | None) -> _Parts:
    """The entries of a committed note (or of an earlier release's list, or a summary)."""
    parts = _Parts([], [], [])
    if not note:
        return parts
    if note.startswith(DIGEST_LEAD):  # an earlier release's bare list
        ids = note[len(DIGEST_LEAD) :].split(" ")
        return _Parts([], [], ["[earlier] " + " ".join(ids)] if ids else [])
    if not note.startswith(NOTE_LEAD):  # a summary written under another policy
        ids = list(dict.fromkeys(identifiers(note)))
        return _Parts([], [], ["[earlier] " + " ".join(ids)] if ids else [])
    section = ""
    for line in note[len(NOTE_LEAD) :].split("\n"):
        if line in (_ASKED, _DID, _SAW):
            section = line
        elif section == _ASKED and line.startswith("> "):
            parts.asked.append(line[2:])
        elif section == _DID and line.startswith("- "):
            parts.did.append(line[2:])
        elif section == _SAW and line.startswith("["):
            parts.saw.append(line)
    return parts


def _calls_of(
    dropped: Sequence[MessageRecord], calls: Sequence[Sequence[DroppedCall]] | None
) -> list[Sequence[DroppedCall]]:
    if calls is None:
        return [() for _ in dropped]
    return [calls[i] if i < len(calls) else () for i in range(len(dropped))]


def _new_parts(dropped: Sequence[MessageRecord], calls: list[Sequence[DroppedCall]]) -> _Parts:
    """The entries of what the cut drops, newest first."""
    by_id: dict[str, DroppedCall] = {c.id: c for cs in calls for c in cs}
    asked: list[str] = []
    did: list[str] = []
    saw: list[str] = []
    taken: set[str] = set()
    for rec, cs in zip(reversed(dropped), reversed(calls), strict=True):
        if rec.role == "user":
            text = _one_line(redact(rec.text), _ASK_CHARS)
            if text:
                asked.append(text)
        elif rec.role == "assistant":
            did.extend(redact(_trail_line(c)) for c in reversed(cs))
        elif rec.role == "tool":
            label = redact(_label(by_id.get(rec.answers or ""), rec.tool))
            entry = _saw_entry(label, redact(rec.text), taken)
            if entry is not None:
                saw.append(entry)
    return _Parts(asked, did, saw)


def _fit(
    entries: Iterable[str], room: int, count: Callable[[str], int], *, cut: bool = False
) -> tuple[list[str], int]:
    """The leading ``entries`` (each once) that fit in ``room``; the room left.

    With ``cut``, the first entry that does not fit is kept up to its last whole item
    (space-separated) that does.
    """
    out: list[str] = []
    seen: set[str] = set()
    for e in entries:
        cost = count(e) + 1
        if e in seen:
            continue
        if cost > room:
            if cut:
                head = _head(e, room - 1, count)
                if head is not None:
                    out.append(head)
                    room -= count(head) + 1
            break
        seen.add(e)
        out.append(e)
        room -= cost
    return out, room


def _head(entry: str, room: int, count: Callable[[str], int]) -> str | None:
    """The longest ``entry[:i]`` ending before a space that counts at most ``room``."""
    words = entry.split(" ")
    lo, hi = 1, len(words) - 1  # the label and at least one item
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        head = " ".join(words[: mid + 1])
        if count(head) <= room:
            best, lo = head, mid + 1
        else:
            hi = mid - 1
    return best


def _render(parts: _Parts) -> str:
    lines = [NOTE_LEAD]
    if parts.asked:
        lines += [_ASKED, *(f"> {a}" for a in parts.asked)]
    if parts.did:
        lines += [_DID, *(f"- {d}" for d in parts.did)]
    if parts.saw:
        lines += [_SAW, *parts.saw]
    return "\n".join(lines)


def make_digest(
    previous: str | None,
    dropped: Sequence[MessageRecord],
    budget: int,
    count: Callable[[str], int],
    calls: Sequence[Sequence[DroppedCall]] | None = None,
) -> str | None:
    """The note after a cut that drops ``dropped``, within ``budget`` tokens.

    Args:
        previous: The committed note (``None``: none yet).
        dropped: The records the cut drops, oldest first.
        budget: Tokens the note may take, its lead and framing included.
        count: The policy's text counter.
        calls: The tool calls of each of ``dropped`` (``()`` for a message without
            any), for the trail; ``None``: the trail has only what the previous note had.

    Returns:
        The new note (see the module docstring), its oldest entries left out to fit;
        ``previous`` as it was when the cut drops no tool call or result (a chat) and
        it fits;
        ``None`` when no entry fits (the window alone fills the limit: the note is what
        can be cut).
    """
    per = _calls_of(dropped, calls)
    if not any(r.role == "tool" or r.opens for r in dropped) and (
        previous is None or count(previous) + _FRAME <= budget
    ):
        return previous
    room = budget - count(NOTE_LEAD) - _FRAME - 3 * (count(_SAW) + 1)
    if room <= 0:
        return None  # no room left under the limit: the note is what can go
    old = _parse(previous)
    new = _new_parts(dropped, per)
    trail = [*new.did, *old.did]
    asked, _ = _fit([*new.asked, *old.asked][:_ASKED_KEPT], int(room * SHARES[0]), count)
    did, _ = _fit(trail, int(room * (SHARES[0] + SHARES[1])) - _cost(asked, count), count)
    saw_room = room - _cost(asked, count) - _cost(did, count)
    fresh, _ = _fit(new.saw, int(saw_room * FRESH), count, cut=True)
    older, left = _fit(_without(old.saw, fresh), saw_room - _cost(fresh, count), count, cut=True)
    saw = [*fresh, *older]
    if left > 0 and len(did) < len(trail):  # room the results did not use: more trail
        did, _ = _fit(trail, _cost(did, count) + left, count)
    if not (asked or did or saw):
        return None
    return _render(_Parts(asked, did, saw))


def _without(entries: Sequence[str], newer: Sequence[str]) -> Iterator[str]:
    """``entries`` without the items ``newer`` entries hold (an entry left empty goes)."""
    taken = {i for e in newer for i in identifiers(e)}
    for e in entries:
        label, _, items = e.partition("] ")
        kept = [w for w in items.split(" ") if not any(i in taken for i in identifiers(w))]
        kept = _numbers_with_items(kept)
        if kept:
            yield f"{label}] " + " ".join(kept)


def _numbers_with_items(words: list[str]) -> list[str]:
    """``words`` without a line's number (``42:``) whose line has no item left."""
    out: list[str] = []
    for word, after in zip(words, [*words[1:], ""][: len(words)], strict=True):
        if not word:
            continue
        if word.endswith(":") and (not after or after.endswith(":")):
            continue
        out.append(word)
    return out


def _cost(entries: Sequence[str], count: Callable[[str], int]) -> int:
    return sum(count(e) + 1 for e in entries)
