"""The incremental index of turn groups and steps the planner keeps over the window region.

:func:`demote.window.planner.turn_groups` states the rule in two passes over a range: a result
answers the latest opening of its call id before it in the range (providers require unique
ids; a reused id starts a new call), and a user message starts a group unless it lies
after a call's opening and at or before one of its answers. Steps follow the same rule one
level down: an assistant message starts a step unless it lies inside such a span (so a
call and all of its results, parallel calls included, are one step). The positions where a
group or a step may start are the *cuts*. A result whose call is not opened in the range
(its call was demoted before it arrived) joins nothing. :class:`GroupIndex` is that rule
kept up to date one appended record at a time, so a load that appended one or two messages
costs one or two steps, not a pass over the window:

- a user message optimistically starts a group, a user or assistant message a cut;
- a message answering a call whose latest opening in the region is at ``o`` removes the
  group starts and cuts in ``(o, answer]``. Those are always a suffix (nothing after the
  answer exists yet), so this is a truncation, and the union of the truncations is what the
  two-pass rule removes;
- calls stay in the index after their answers (a late duplicate answer still merges), with
  their latest opening, so dropping front cuts keeps exactly the openings a pass over the
  shorter range would see.

Moving the region start forward to one of its cuts (:meth:`GroupIndex.advance`) slices the
index: no call opened before a cut is answered at or after it, so what lies behind it is
what a fresh pass over the shorter range finds.

The *opener* of a window that starts inside a turn (at an assistant message) is the newest
user message before its start: the turn's opening message, or the one a user interjected
with while a call was running. It depends on the records before the start alone, whatever
was demoted when, so a cached index and a fresh plan always agree on it (an opener read off
the turn groups would not: a result that arrives after its call was demoted joins nothing,
yet a pass from the start of the history would let it merge the turns it spans). The index
keeps the user messages of its region; a region that starts inside a turn remembers the
newest user message before it (:attr:`GroupIndex.opener`).

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
        calls: Tool call id -> the index of its latest opening in the region (never
            mutated; a new mapping is made when it changes).
        costs: How each record was counted (an index is reused only under the same).
        users: Indexes of the user messages in the region, oldest first.
        user_costs: What each of ``users`` costs as an opener (``ResultCosts.opener``).
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
        opener: When the region does not start with a user message, the newest user
            message before ``start``, if known; ``opener_tokens`` is its cost.
        opener_tokens: See ``opener``.
        openerless: The region does not start with a user message and none comes before
            it (looked for from the start of the history): nothing to look for again.
        pinned_tokens: Tokens of the pinned system messages, when the planner knew them.
    """

    start: int
    end: int
    starts: tuple[int, ...] = ()
    tokens_at: tuple[int, ...] = ()
    tokens: int = 0
    calls: Mapping[str, int] = field(default_factory=dict)
    costs: ResultCosts = _NO_COSTS
    users: tuple[int, ...] = ()
    user_costs: tuple[int, ...] = ()
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

        ``opener`` (and its cost) is the newest user message before ``start`` when
        ``start`` is not one; ``openerless`` that there is none.
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

    def opener_at(self, start: int) -> tuple[int | None, int]:
        """The opener (index and cost) a window starting at ``start`` would be shown with.

        The newest user message before ``start``; ``(None, 0)`` when ``start`` is a user
        message itself, is outside the region, or no user message comes before it.
        """
        if not self.start <= start < self.end:
            return None, 0
        users = self.users
        u = bisect_right(users, start) - 1
        if u >= 0:
            if users[u] == start:
                return None, 0
            return users[u], self.user_costs[u]
        return self.opener, self.opener_tokens if self.opener is not None else 0

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
            if self.users:
                opener, opener_tokens = self.users[-1], self.user_costs[-1]
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
        starts, tokens_at = self.starts, self.tokens_at
        if starts[g] != start:  # a step inside group g
            starts = (start, *starts[g + 1 :])
            tokens_at = (self.cuts_at[j], *tokens_at[g + 1 :])
        else:
            starts, tokens_at = starts[g:], tokens_at[g:]
        opener, opener_tokens = self.opener_at(start)
        u = bisect_left(self.users, start)
        users, user_costs = self.users[u:], self.user_costs[u:]
        lead_user = bool(users) and users[0] == start
        openerless = self.openerless and opener is None and not lead_user
        calls = self.calls
        if calls:
            calls = {call_id: at for call_id, at in calls.items() if at >= start}
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
            users,
            user_costs,
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
        starts, tokens_at = self.starts, self.tokens_at
        cuts, cuts_at, tools_at = self.cuts, self.cuts_at, self.tools_at
        calls = self.calls
        lead_user = self.lead_user
        # Group starts and cuts after the tuples, flushed into them before a truncation.
        g_new: list[int] = []
        g_at: list[int] = []
        u_new: list[int] = []
        u_cost: list[int] = []
        c_new: list[int] = []
        c_at: list[int] = []
        c_tools: list[int] = []
        clear_pos: list[int] = []
        clear_before: list[int] = []
        clip_pos: list[int] = []
        tokens, tools, savings = self.tokens, self.tool_tokens, self.savings
        opener, opener_tokens = self.opener, self.opener_tokens
        openerless = self.openerless
        mutable: dict[str, int] | None = None  # copy-on-write of ``calls``
        for i in range(self.end, base + len(records)):
            rec = records[i - base]
            role = rec.role
            cost = costs.cost(rec)
            first = not (starts or g_new)
            if first:
                lead_user = role == "user"
                if lead_user:
                    opener, opener_tokens, openerless = None, 0, False
            if role == "user":
                u_new.append(i)
                u_cost.append(costs.opener(rec))  # what it counts as an opener
            if role == "user" or first:
                g_new.append(i)
                g_at.append(tokens)
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
                    cuts, cuts_at = cuts + tuple(c_new), cuts_at + tuple(c_at)
                    tools_at = tools_at + tuple(c_tools)
                    g_new, g_at, c_new, c_at, c_tools = [], [], [], [], []
                    cut = bisect_right(starts, opened)
                    starts, tokens_at = starts[:cut], tokens_at[:cut]
                    cut = bisect_right(cuts, opened)
                    cuts, cuts_at, tools_at = cuts[:cut], cuts_at[:cut], tools_at[:cut]
            if rec.opens:
                if mutable is None:
                    calls = mutable = dict(calls)
                for call_id in rec.opens:
                    mutable[call_id] = i
        if g_new:
            starts, tokens_at = starts + tuple(g_new), tokens_at + tuple(g_at)
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
            self.users + tuple(u_new) if u_new else self.users,
            self.user_costs + tuple(u_cost) if u_cost else self.user_costs,
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
