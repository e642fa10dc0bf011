"""The digest a :class:`~demote.window.policy.LowWater` cut leaves of the steps it drops.

An agent copies identifiers from earlier tool results into its next calls: a file path it
listed, a reservation id it was given, a line number, a version. A window that dropped the
result holding one could not have produced that call. So when a cut drops steps, the
identifiers their results held are kept, newest first, in a short text sent where a
summary is (after the opener, or as a system message); the results themselves go to the
archive whole, where the recall tool finds them by any of these words.

What counts as an identifier: a run of at least :data:`MIN_CHARS` characters between
whitespace, quotes and ``,;:()[]{}<>=|``, holding a digit or one of ``/ _ . @ -`` (and at
most :data:`MAX_CHARS`, so an encoded blob does not eat the budget).

The digest is a pure function of the previous digest and the dropped records: the same at
every call until the next cut, in every process, so the prompt prefix stays byte-identical
and caches keep hitting. It is made at the cut, with no model call, and committed with the
window's start (``ConversationState.summary``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence

from demote.records import MessageRecord

__all__ = ["DIGEST_LEAD", "MAX_CHARS", "MIN_CHARS", "identifiers", "make_digest"]

#: The shortest identifier kept.
MIN_CHARS = 6

#: The longest identifier kept (longer runs are blobs, not things an agent copies).
MAX_CHARS = 120

#: How a digest starts (the identifiers follow, separated by single spaces).
DIGEST_LEAD = (
    "Identifiers from earlier tool results, newest first (the results are archived whole; "
    "the recall tool finds them): "
)

_SPLIT = re.compile(r"[\s'\"`,;:()\[\]{}<>=|]+")
_MARK = re.compile(r"[0-9/_.@-]")
# What the rendering adds around the digest (the summary or progress-note lead), in tokens.
_FRAME = 16


def identifiers(text: str) -> Iterator[str]:
    """The identifier-like pieces of ``text``, in order of appearance (repeats included)."""
    for piece in _SPLIT.split(text):
        if MIN_CHARS <= len(piece) <= MAX_CHARS and _MARK.search(piece):
            yield piece


def _previous(digest: str | None) -> Iterable[str]:
    if not digest:
        return ()
    if digest.startswith(DIGEST_LEAD):
        return digest[len(DIGEST_LEAD) :].split(" ")
    return identifiers(digest)  # a summary written under another policy


def make_digest(
    previous: str | None,
    dropped: Sequence[MessageRecord],
    budget: int,
    count: Callable[[str], int],
) -> str | None:
    """The digest after a cut that drops ``dropped``, within ``budget`` tokens.

    Args:
        previous: The committed digest (``None``: none yet).
        dropped: The records the cut drops, oldest first. Only tool results are read.
        budget: Tokens the digest may take, its lead and framing included.
        count: The policy's text counter.

    Returns:
        The new digest: the identifiers of ``dropped`` newest first, then those of
        ``previous``, each once, as many as fit; ``previous`` when nothing new fits or
        the budget has no room for any identifier.
    """
    room = budget - count(DIGEST_LEAD) - _FRAME
    if room <= 0:
        return previous
    seen: set[str] = set()
    kept: list[str] = []
    least = count("a" * MIN_CHARS) + 1  # the cheapest identifier

    def newest_first() -> Iterator[str]:
        for rec in reversed(dropped):
            if rec.role == "tool":
                yield from identifiers(rec.text)
        yield from _previous(previous)

    for piece in newest_first():
        if piece in seen:
            continue
        seen.add(piece)
        cost = count(piece) + 1
        if cost > room:
            if room < least:
                break
            continue
        kept.append(piece)
        room -= cost
    if not kept:
        return previous
    return DIGEST_LEAD + " ".join(kept)
