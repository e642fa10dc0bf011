"""The incremental turn-group index the planner keeps over the window region.

:func:`demote.planner.turn_groups` states the rule in two passes over a range: a user
message starts a group unless a tool call opened earlier in the range is answered at or
after it. :class:`GroupIndex` is the same rule kept up to date one appended record at a
time, so a load that appended one or two messages costs one or two steps, not a pass over
the window:

- a user message optimistically starts a group;
- a message answering a call opened in the region at ``o`` (its earliest opening there)
  removes the group starts in ``(o, answer]``. Those are always a suffix of the starts
  (nothing after the answer exists yet), so this is a truncation. Removing ``(o, a]`` for
  every answer ``a`` as it arrives removes ``(o, last answer]`` in the end, exactly what
  the two-pass rule removes;
- calls stay in the index after their answers (a late duplicate answer still merges), and
  the openings of every call are kept, so dropping front groups keeps exactly the
  openings a pass over the shorter range would see.

Moving the region start forward to one of its group starts (:meth:`GroupIndex.advance`)
slices the index: no call opened before a group start is answered at or after it, so the
groups behind it are the ones a fresh pass over the shorter range cuts. Sizes are kept as
cumulative token counts at each group start, so the size of any run of groups, in any
unit, is a subtraction, and an eviction is a bisection.

Everything here is immutable: an index is valid for the records it was built over, and
any number of callers may extend the same index independently.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from demote.records import MessageRecord

__all__ = ["GroupIndex"]


@dataclass(frozen=True, slots=True)
class GroupIndex:
    """Turn groups of the records in ``[start, end)`` (absolute indexes).

    Attributes:
        start: First index of the region.
        end: One past the last index of the region.
        starts: Absolute start of each group, oldest first; ``starts[0] == start``, and
            empty only when the region is.
        tokens_at: Cumulative token count at each group start (from an arbitrary
            origin: only differences mean anything).
        tokens: Cumulative token count at ``end`` (same origin).
        calls: Tool call id -> the indexes in the region where it is opened (never
            mutated; a new mapping is made when it changes).
    """

    start: int
    end: int
    starts: tuple[int, ...] = ()
    tokens_at: tuple[int, ...] = ()
    tokens: int = 0
    calls: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def build(cls, records: Sequence[MessageRecord], start: int, *, base: int = 0) -> GroupIndex:
        """The index of ``[start, base + len(records))``; ``records[0]`` is at ``base``."""
        index = cls(start, start).update(start, records, base=base)
        assert index is not None
        return index

    def extend(self, records: Sequence[MessageRecord], *, base: int = 0) -> GroupIndex:
        """This index grown over the records appended after :attr:`end` (see :meth:`update`)."""
        index = self.update(self.start, records, base=base)
        assert index is not None
        return index

    def advance(self, start: int) -> GroupIndex | None:
        """This index from ``start`` on (see :meth:`update`)."""
        return self.update(start, ())

    def update(
        self, start: int, records: Sequence[MessageRecord], *, base: int = 0
    ) -> GroupIndex | None:
        """The index of ``[start, base + len(records))``: this one moved, then grown.

        Args:
            start: The new region start: :attr:`start`, a later group start, or
                :attr:`end` (an empty region); anything else gives ``None``.
            records: ``records[0]`` is at absolute index ``base``. Those before
                :attr:`end` must be the ones this index was built over; only those after
                it are read.
            base: Absolute index of ``records[0]`` (at most :attr:`end`).
        """
        starts, tokens_at, calls = self.starts, self.tokens_at, self.calls
        if start != self.start:
            if start == self.end:
                starts = tokens_at = ()
                calls = {}
            else:
                at = bisect_left(starts, start)
                if start < self.start or at == len(starts) or starts[at] != start:
                    return None
                starts, tokens_at = starts[at:], tokens_at[at:]
                if calls:
                    calls = {
                        call_id: opened if opened[0] >= start else _from(opened, start)
                        for call_id, opened in calls.items()
                        if opened[-1] >= start
                    }
        stop = base + len(records)
        if stop <= self.end:
            if start == self.start:
                return self
            return GroupIndex(start, self.end, starts, tokens_at, self.tokens, calls)
        added: list[int] = []  # group starts (and their token counts) after ``starts``
        added_at: list[int] = []
        tokens = self.tokens
        mutable: dict[str, tuple[int, ...]] | None = None  # copy-on-write of ``calls``
        for i in range(self.end, stop):
            rec = records[i - base]
            if rec.role == "user" or not (starts or added):
                added.append(i)
                added_at.append(tokens)
            tokens += rec.tokens
            answers = rec.answers
            if answers is not None:
                opened = calls.get(answers)
                if opened is not None:
                    starts, tokens_at = starts + tuple(added), tokens_at + tuple(added_at)
                    added, added_at = [], []
                    cut = bisect_right(starts, opened[0])
                    starts, tokens_at = starts[:cut], tokens_at[:cut]
            if rec.opens:
                if mutable is None:
                    calls = mutable = dict(calls)
                for call_id in rec.opens:
                    mutable[call_id] = (*mutable.get(call_id, ()), i)
        if added:
            starts, tokens_at = starts + tuple(added), tokens_at + tuple(added_at)
        return GroupIndex(start, stop, starts, tokens_at, tokens, calls)

    def cumulative(self, unit: str) -> tuple[Sequence[int], int]:
        """Cumulative sizes at each group start in ``unit``, and at :attr:`end`.

        The size of groups ``[a, b)`` is ``cum[b] - cum[a]`` (``total`` for ``b`` past
        the last group).
        """
        if unit == "tokens":
            return self.tokens_at, self.tokens
        if unit == "messages":
            return self.starts, self.end
        return range(len(self.starts)), len(self.starts)


def _from(opened: tuple[int, ...], start: int) -> tuple[int, ...]:
    return opened[bisect_left(opened, start) :]
