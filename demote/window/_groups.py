"""The incremental index of turn groups and steps the planner keeps over the window region.

:func:`demote.window.planner.turn_groups` states the rule in two passes over a range: a user
message starts a group unless a tool call opened earlier in the range is answered at or
after it. Steps follow the same rule one level down: an assistant message starts a step
unless a call opened earlier in the range is answered at or after it (so a call and all of
its results, parallel calls included, are one step). The positions where a group or a step
may start are the *cuts*. :class:`GroupIndex` is that rule kept up to date one appended
record at a time, so a load that appended one or two messages costs one or two steps, not a
pass over the window:

- a user message optimistically starts a group, a user or assistant message a cut;
- a message answering a call opened in the region at ``o`` (its earliest opening there)
  removes the group starts and cuts in ``(o, answer]``. Those are always a suffix (nothing
  after the answer exists yet), so this is a truncation. Removing ``(o, a]`` for every
  answer ``a`` as it arrives removes ``(o, last answer]`` in the end, exactly what the
  two-pass rule removes;
- calls stay in the index after their answers (a late duplicate answer still merges), and
  the openings of every call are kept, so dropping front cuts keeps exactly the openings a
  pass over the shorter range would see.

Moving the region start forward to one of its cuts (:meth:`GroupIndex.advance`) slices the
index: no call opened before a cut is answered at or after it, so what lies behind it is
what a fresh pass over the shorter range finds. A start inside a turn (a step cut) remembers
the turn's opening user message (:attr:`GroupIndex.opener`), which lies before the region.

Sizes are cumulative counts (under a :class:`~demote.window.clearing.ResultCosts`, so clipped
results count as clipped) at each group start and each cut, from an arbitrary origin: the
size of any run, in any unit, is a subtraction, and an eviction is a bisection. The same
goes for the tool results' tokens (what clearing's trigger reads) and for what clearing
each clearable result would save.

Everything here is immutable: an index is valid for the records it was built over, and
any number of callers may extend the same index independently. (Nothing assigns to an
index once made; the class is not a frozen dataclass only because a frozen ``__init__``
sets each of its 21 fields through ``object.__setattr__``, about 3 µs, and a load makes
two.)
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from demote.records import MessageRecord
from demote.window.clearing import ResultCosts

__all__ = ["GroupIndex"]

_NO_COSTS = ResultCosts()


@dataclass(slots=True)
class GroupIndex:
    """Turn groups and steps of the records in ``[start, end)`` (absolute indexes).

    Attributes:
        start: First index of the region.
        end: One past the last index of the region.
        starts: Absolute start of each group, oldest first; ``starts[0] == start``, and
            empty only when the region is.
        tokens_at: Cumulative cost (tokens) at each group start (from an arbitrary
            origin: only differences mean anything).
        tokens: Cumulative cost at ``end`` (same origin).
        calls: Tool call id -> the indexes in the region where it is opened (never
            mutated; a new mapping is made when it changes).
        costs: How each record was counted (an index is reused only under the same).
        heads: Cost of each group's opening user message (``0`` for a first group that
            does not start with one).
        cuts: Every group start and step start, oldest first (``cuts[0] == start``).
        cuts_at: Cumulative cost at each cut.
        tools_at: Cumulative cost of the tool results at each cut.
        tool_tokens: Cumulative cost of the tool results at ``end``.
        clear_pos: Indexes of the clearable tool results, oldest first.
        clear_before: What clearing the results before each of ``clear_pos`` saves
            (cumulative, from an arbitrary origin).
        savings: The same at ``end``.
        clip_pos: Indexes of the messages counted clipped (tool results, and assistant
            messages with their long call arguments cut), oldest first.
        lead_user: The region starts with a user message (its first group is a whole
            turn); else it starts inside a turn or with a non-user message.
        opener: When the region starts inside a turn, that turn's opening user message
            (before ``start``), if known; ``opener_tokens`` is its cost.
        opener_tokens: See ``opener``.
        openerless: The region starts inside a turn that has no opening user message at
            all (looked for from the start of the history): nothing to look for again.
        pinned_tokens: Tokens of the pinned system messages, when the planner knew them.
    """

    start: int
    end: int
    starts: tuple[int, ...] = ()
    tokens_at: tuple[int, ...] = ()
    tokens: int = 0
    calls: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    costs: ResultCosts = _NO_COSTS
    heads: tuple[int, ...] = ()
    cuts: tuple[int, ...] = ()
    cuts_at: tuple[int, ...] = ()
    tools_at: tuple[int, ...] = ()
    tool_tokens: int = 0
    clear_pos: tuple[int, ...] = ()
    clear_before: tuple[int, ...] = ()
    savings: int = 0
    clip_pos: tuple[int, ...] = ()
    lead_user: bool = False
    opener: int | None = None
    opener_tokens: int = 0
    openerless: bool = False
    pinned_tokens: int | None = None

    @classmethod
    def build(
        cls,
        records: Sequence[MessageRecord],
        start: int,
        *,
        base: int = 0,
        costs: ResultCosts = _NO_COSTS,
        opener: int | None = None,
        opener_tokens: int = 0,
        openerless: bool = False,
    ) -> GroupIndex:
        """The index of ``[start, base + len(records))``; ``records[0]`` is at ``base``.

        ``opener`` (and its cost) is the opening user message of the turn ``start`` is
        inside, when it is inside one; ``openerless`` that the turn has none.
        """
        empty = cls(
            start,
            start,
            costs=costs,
            opener=opener,
            opener_tokens=opener_tokens,
            openerless=openerless,
        )
        index = empty.update(start, records, base=base)
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

    def group_of(self, at: int) -> int:
        """Which group the region index ``at`` belongs to (``0`` for the first)."""
        return bisect_right(self.starts, at) - 1

    def opener_of(self, group: int) -> tuple[int | None, int]:
        """The opening user message of ``group`` (index and cost), or ``(None, 0)``."""
        if group > 0 or self.lead_user:
            return self.starts[group], self.heads[group]
        return self.opener, self.opener_tokens if self.opener is not None else 0

    def opener_at(self, start: int) -> tuple[int | None, int]:
        """The opener (index and cost) a window starting at ``start`` would be shown with.

        ``(None, 0)`` when ``start`` opens a group itself, or is outside the region.
        """
        if not self.start <= start < self.end:
            return None, 0
        if not self.starts:
            return self.opener, self.opener_tokens if self.opener is not None else 0
        g = self.group_of(start)
        if g >= 0 and self.starts[g] == start:
            return None, 0
        return self.opener_of(max(g, 0))

    def update(
        self, start: int, records: Sequence[MessageRecord], *, base: int = 0
    ) -> GroupIndex | None:
        """The index of ``[start, base + len(records))``: this one moved, then grown.

        Args:
            start: The new region start: :attr:`start`, a later cut, or :attr:`end` (an
                empty region); anything else gives ``None``.
            records: ``records[0]`` is at absolute index ``base``. Those before
                :attr:`end` must be the ones this index was built over; only those after
                it are read.
            base: Absolute index of ``records[0]`` (at most :attr:`end`).
        """
        moved = self if start == self.start else self._moved(start)
        if moved is None:
            return None
        if base + len(records) <= moved.end:
            return moved
        return moved._grown(records, base)

    def _moved(self, start: int) -> GroupIndex | None:
        if start < self.start or start > self.end:
            return None
        if start == self.end:
            opener, opener_tokens = self.opener, self.opener_tokens
            if self.starts:
                opener, opener_tokens = self.opener_of(len(self.starts) - 1)
            return GroupIndex(
                start,
                self.end,
                (),
                (),
                self.tokens,
                {},
                self.costs,
                tool_tokens=self.tool_tokens,
                savings=self.savings,
                opener=opener,
                opener_tokens=opener_tokens,
                openerless=self.openerless and opener is None,
                pinned_tokens=self.pinned_tokens,
            )
        cuts = self.cuts
        j = bisect_left(cuts, start)
        if j == len(cuts) or cuts[j] != start:
            return None
        g = self.group_of(start)
        starts, tokens_at, heads = self.starts, self.tokens_at, self.heads
        if starts[g] == start:  # a group start after the first: a user message
            lead_user, openerless = True, False
            opener, opener_tokens = None, 0
            starts, tokens_at, heads = starts[g:], tokens_at[g:], heads[g:]
        else:  # a step inside group g: its opener stays in front
            lead_user = False
            opener, opener_tokens = self.opener_of(g)
            openerless = self.openerless and opener is None
            starts = (start, *starts[g + 1 :])
            tokens_at = (self.cuts_at[j], *tokens_at[g + 1 :])
            heads = (0, *heads[g + 1 :])
        calls = self.calls
        if calls:
            calls = {
                call_id: opened if opened[0] >= start else _from(opened, start)
                for call_id, opened in calls.items()
                if opened[-1] >= start
            }
        c = bisect_left(self.clear_pos, start)
        k = bisect_left(self.clip_pos, start)
        return GroupIndex(
            start,
            self.end,
            starts,
            tokens_at,
            self.tokens,
            calls,
            self.costs,
            heads,
            cuts[j:],
            self.cuts_at[j:],
            self.tools_at[j:],
            self.tool_tokens,
            self.clear_pos[c:],
            self.clear_before[c:],
            self.savings,
            self.clip_pos[k:],
            lead_user,
            opener,
            opener_tokens,
            openerless,
            self.pinned_tokens,
        )

    def _grown(self, records: Sequence[MessageRecord], base: int) -> GroupIndex:
        costs = self.costs
        starts, tokens_at, heads = self.starts, self.tokens_at, self.heads
        cuts, cuts_at, tools_at = self.cuts, self.cuts_at, self.tools_at
        calls = self.calls
        lead_user = self.lead_user
        # Group starts and cuts after the tuples, flushed into them before a truncation.
        g_new: list[int] = []
        g_at: list[int] = []
        g_head: list[int] = []
        c_new: list[int] = []
        c_at: list[int] = []
        c_tools: list[int] = []
        clear_pos: list[int] = []
        clear_before: list[int] = []
        clip_pos: list[int] = []
        tokens, tools, savings = self.tokens, self.tool_tokens, self.savings
        opener, opener_tokens = self.opener, self.opener_tokens
        openerless = self.openerless
        mutable: dict[str, tuple[int, ...]] | None = None  # copy-on-write of ``calls``
        for i in range(self.end, base + len(records)):
            rec = records[i - base]
            role = rec.role
            cost = costs.cost(rec)
            first = not (starts or g_new)
            if first:
                lead_user = role == "user"
                if lead_user:
                    opener, opener_tokens, openerless = None, 0, False
            if role == "user" or first:
                g_new.append(i)
                g_at.append(tokens)
                g_head.append(cost if role == "user" else 0)
            if role == "user" or role == "assistant" or first:
                c_new.append(i)
                c_at.append(tokens)
                c_tools.append(tools)
            tokens += cost
            if cost != rec.tokens:  # a clipped result, or a call with its arguments cut
                clip_pos.append(i)
            if role == "tool":
                tools += cost
                saved = costs.saving(rec, cost)
                if saved:
                    clear_pos.append(i)
                    clear_before.append(savings)
                    savings += saved
            answers = rec.answers
            if answers is not None:
                opened = calls.get(answers)
                if opened is not None:
                    starts, tokens_at = starts + tuple(g_new), tokens_at + tuple(g_at)
                    heads = heads + tuple(g_head)
                    cuts, cuts_at = cuts + tuple(c_new), cuts_at + tuple(c_at)
                    tools_at = tools_at + tuple(c_tools)
                    g_new, g_at, g_head, c_new, c_at, c_tools = [], [], [], [], [], []
                    cut = bisect_right(starts, opened[0])
                    starts, tokens_at, heads = starts[:cut], tokens_at[:cut], heads[:cut]
                    cut = bisect_right(cuts, opened[0])
                    cuts, cuts_at, tools_at = cuts[:cut], cuts_at[:cut], tools_at[:cut]
            if rec.opens:
                if mutable is None:
                    calls = mutable = dict(calls)
                for call_id in rec.opens:
                    mutable[call_id] = (*mutable.get(call_id, ()), i)
        if g_new:
            starts, tokens_at = starts + tuple(g_new), tokens_at + tuple(g_at)
            heads = heads + tuple(g_head)
        if c_new:
            cuts, cuts_at = cuts + tuple(c_new), cuts_at + tuple(c_at)
            tools_at = tools_at + tuple(c_tools)
        return GroupIndex(
            self.start,
            base + len(records),
            starts,
            tokens_at,
            tokens,
            calls,
            costs,
            heads,
            cuts,
            cuts_at,
            tools_at,
            tools,
            self.clear_pos + tuple(clear_pos) if clear_pos else self.clear_pos,
            self.clear_before + tuple(clear_before) if clear_before else self.clear_before,
            savings,
            self.clip_pos + tuple(clip_pos) if clip_pos else self.clip_pos,
            lead_user,
            opener,
            opener_tokens,
            openerless,
            self.pinned_tokens,
        )

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

    def saved_before(self, at: int) -> int:
        """What clearing every clearable result before index ``at`` saves (same origin)."""
        p = bisect_left(self.clear_pos, at)
        return self.clear_before[p] if p < len(self.clear_pos) else self.savings


def _from(opened: tuple[int, ...], start: int) -> tuple[int, ...]:
    return opened[bisect_left(opened, start) :]
