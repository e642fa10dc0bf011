"""A Hypothesis state machine over the engine: appends, sync and async loads, clears,
forgets, rewrites, stale reads, system messages appearing at and leaving the head, tool
results arriving turns late, hook failures and restarts on a durable SQLite state store,
with a view cache of one conversation or of all.

After every step: every message below the hook's watermark is in the hook's store (the
rest are in the window or pending, and still in the history); no key is delivered twice
within a process; across restarts the key-keyed store holds each key once and nothing was
delivered again (the state store is durable). After every load: the window obeys the
policy's bound whatever the hook does, starts a turn group, and keeps no result without
its call unless the call was demoted first. Once the hook recovers, one load delivers
everything pending.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from demote import Backoff, Demoter, Demotion, SlidingWindow, SQLiteStateStore
from demote.records import TRAIL_DIGITS, TRAIL_KEPT, MessageRecord, fingerprint, make_key
from tests.strategies import Msg, describer, examples, policies, turn, unique, within_bound

# Random policies include Compact without a summarizer, on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::demote.errors.DemoteWarning")

CIDS = ("alpha", "beta")


class SwitchableHook:
    """A key-idempotent store (dict keyed by key) that can be switched to failing."""

    def __init__(self) -> None:
        self.store: dict[str, tuple[str, int]] = {}
        self.total: Counter[str] = Counter()
        self.this_process: Counter[str] = Counter()
        self.fail = False
        self.lock = threading.Lock()

    def deliver(self, batch: Demotion) -> None:
        with self.lock:
            if self.fail:
                raise RuntimeError("hook is down")
            for m in batch.messages:
                self.store[m.key] = (batch.conversation_id, m.index)
                self.total[m.key] += 1
                self.this_process[m.key] += 1

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        with self.lock:
            return {k for k in keys if k in self.store}


def key_of(cid: str, index: int, msg: Msg) -> str:
    return make_key(cid, index, fingerprint(msg.role, msg.text, msg.opens, msg.answers))


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="demote-stateful-"))
        self.hook = SwitchableHook()
        self.histories: dict[str, list[Msg]] = {cid: [] for cid in CIDS}
        self.synced: dict[str, bool] = dict.fromkeys(CIDS, True)
        # Messages this Demoter described in loads (what its view saw) since it started.
        self.described: dict[str, set[Msg]] = {cid: set() for cid in CIDS}
        self.calls = itertools.count()
        self.restarts = 0
        self.pending: dict[str, list[str]] = {cid: [] for cid in CIDS}  # calls not answered
        self.late: set[Msg] = set()  # answers appended after their call was demoted
        self.loaded: dict[str, int] = dict.fromkeys(CIDS, 0)  # what the last load saw

    @initialize(policy=policies(small=True), cache=st.sampled_from([1, 1000]))
    def start(self, policy: SlidingWindow, cache: int) -> None:
        self.policy = policy
        self.cache = cache  # 1: every switch of conversation misses the view cache
        self.demoter = self._new_demoter()

    def _new_demoter(self) -> Demoter:
        store = SQLiteStateStore(self.dir / "state.db")
        return Demoter(
            self.policy,
            self.hook,
            state=store,
            cached_conversations=self.cache,
            retry=Backoff(0, 0),  # a recovered hook is retried on the next load
        )

    def _touch(self, cid: str) -> None:
        """A load of ``cid`` may push the other conversations out of the view cache."""
        if self.cache < len(CIDS):
            for other in CIDS:
                if other != cid:
                    self.described[other].clear()

    def teardown(self) -> None:
        demoter = getattr(self, "demoter", None)
        if demoter is not None:
            demoter.state.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- rules -----------------------------------------------------------------------------

    @rule(
        cid=st.sampled_from(CIDS),
        turns=st.lists(turn(), min_size=1, max_size=4),
        system=st.booleans(),
        then=st.sampled_from(["sync", "async", None]),
    )
    def append(self, cid: str, turns: list[list[Msg]], system: bool, then: str | None) -> None:
        """Append turns (the adapter's write), then usually load (its next read)."""
        group = [m for t in turns for m in t]
        history = self.histories[cid]
        if system and not history:
            history.append(unique([Msg("system", "be brief")], cid)[0])
        # Call ids unique within the conversation; texts unique in the process.
        ids = {c: f"{cid}-call-{next(self.calls)}" for m in group for c in m.opens}
        group = [
            replace(m, opens=tuple(ids[c] for c in m.opens), answers=ids.get(m.answers or ""))
            if m.opens or m.answers
            else m
            for m in group
        ]
        history += unique(group, cid)
        if then is not None:
            self.load(cid, then == "async")

    @rule(cid=st.sampled_from(CIDS), use_async=st.booleans())
    def load(self, cid: str, use_async: bool) -> None:
        history = list(self.histories[cid])
        d = self.demoter
        plain = describer(d)
        self._touch(cid)

        def describe(m: Msg) -> MessageRecord:
            self.described[cid].add(m)
            return plain(m)

        if use_async:
            w = asyncio.run(d.aload(cid, history, describe))
        else:
            w = d.load(cid, history, describe)
        assert w.conversation_id == cid and w.total == len(history)
        assert w.messages == history[w.start :], "the window is a suffix, in order"
        assert w.pinned == history[: len(w.pinned)]
        assert all(m.role == "system" for m in w.pinned)
        for i in range(len(w.pinned), min(w.start, w.delivered)):
            assert key_of(cid, i, history[i]) in self.hook.store, f"message {i} lost"
        # (more when results in the window are placeholders whose content is pending)
        assert w.pending >= max(0, w.start - max(w.delivered, len(w.pinned)))
        recs = [plain(m) for m in w.messages]
        assert within_bound(self.policy, recs), f"window of {len(recs)} over the bound"
        assert w.calls or not any(m.opens for m in w.messages), "calls=False, yet one opens"
        self._check_groups(history, w.start, len(w.pinned), w.opener)
        self.loaded[cid] = len(history)
        if not self.hook.fail:  # a failed re-sync commits nothing: the state is still stale
            self.synced[cid] = True

    @rule(
        cid=st.sampled_from(CIDS), how=st.sampled_from(["clear", "forget"]), roll=st.integers(0, 3)
    )
    def reset(self, cid: str, how: str, roll: int) -> None:
        if roll != 3:  # rarer than appends and loads, so conversations grow
            return
        getattr(self.demoter, how)(cid)
        self.histories[cid] = []
        self.described[cid].clear()
        self.pending[cid].clear()
        self.synced[cid] = True

    @rule(
        cid=st.sampled_from(CIDS),
        drop=st.integers(1, 8),
        then=st.sampled_from(["sync", "async", None]),
    )
    def rewrite_shorter(self, cid: str, drop: int, then: str | None) -> None:
        """Drop messages from the end and write a new one, outside the engine.

        (A bare truncation is a copy of what the engine saw: see ``stale_read``.)
        """
        history = self.histories[cid]
        del history[max(0, len(history) - drop) :]
        history += unique([Msg("user", "rewritten")], cid)
        self.synced[cid] = False
        if then is not None:
            self.load(cid, then == "async")

    @rule(cid=st.sampled_from(CIDS), behind=st.integers(1, 8), use_async=st.booleans())
    def stale_read(self, cid: str, behind: int, use_async: bool) -> None:
        """A slow request loads a copy read before the newest appends: nothing changes."""
        history = self.histories[cid]
        stale = history[: max(0, len(history) - behind)]
        d = self.demoter
        before = d.state_of(cid)
        self._touch(cid)
        if use_async:
            w = asyncio.run(d.aload(cid, stale, describer(d)))
        else:
            w = d.load(cid, stale, describer(d))
        assert w.messages == stale[w.start :] and w.pinned == stale[: len(w.pinned)]
        assert w.calls or not any(m.opens for m in w.messages), "calls=False, yet one opens"
        self._check_groups(stale, w.start, len(w.pinned), w.opener)
        seen = bool(stale) and stale[-1] in self.described[cid]
        shorter = len(stale) < max(before.window_start, self.loaded[cid])
        if shorter and self.synced[cid] and seen:
            assert d.state_of(cid) == before, "a stale copy must not move the state"
        else:
            # (A Demoter recognises a stale copy by its last message, which its view must
            # have seen. One that has not read that message since it started, as after a
            # restart, where it reads nothing below the watermark (a pruned prefix may be
            # absent), cannot tell a stale copy from a truncation: it plans it as the
            # history, and key-aware hooks skip what they hold. Its cut may fall between
            # a call in the copy and a result that came after it.)
            self.loaded[cid] = len(stale)
            opened = {c for m in stale for c in m.opens}
            self.late.update(m for m in history[len(stale) :] if m.answers in opened)

    @rule(
        cid=st.sampled_from(CIDS),
        how=st.sampled_from(["insert", "remove"]),
        then=st.sampled_from(["sync", "async", None]),
    )
    def edit_head(self, cid: str, how: str, then: str | None) -> None:
        """A system message appears at, or disappears from, the head of the history.

        One edit at a time: the state checks only the message before the window start, so
        edits that cancel out (one removed, another inserted, before a re-sync commits)
        would change a demoted message unseen, which the engine does not claim to detect.
        """
        history = self.histories[cid]
        if not self.synced[cid]:
            return
        if how == "insert":
            history.insert(0, unique([Msg("system", "new instructions")], cid)[0])
        elif history and history[0].role == "system":
            del history[0]
        else:
            return
        self.synced[cid] = False  # positions moved: the next load re-syncs (or recounts)
        if then is not None:
            self.load(cid, then == "async")

    @rule(cid=st.sampled_from(CIDS), ask=st.booleans(), n=st.integers(1, 2))
    def open_calls(self, cid: str, ask: bool, n: int) -> None:
        """An assistant opens tool calls whose results come later (see ``answer_late``)."""
        history = self.histories[cid]
        if ask:
            history += unique([Msg("user", "do it")], cid)
        ids = tuple(f"{cid}-late-{next(self.calls)}" for _ in range(n))
        history += unique([Msg("assistant", "calling", opens=ids)], cid)
        self.pending[cid] += ids

    @rule(cid=st.sampled_from(CIDS), data=st.data(), then=st.sampled_from(["sync", None]))
    def answer_late(self, cid: str, data: st.DataObject, then: str | None) -> None:
        """A tool result arrives for a call opened earlier, maybe turns ago."""
        pending = self.pending[cid]
        if not pending:
            return
        call_id = pending.pop(data.draw(st.integers(0, len(pending) - 1)))
        history = self.histories[cid]
        opened = [i for i, m in enumerate(history) if call_id in m.opens]
        answer = unique([Msg("tool", "result", answers=call_id)], cid)[0]
        state = self.demoter.state_of(cid)
        if opened and opened[0] < state.window_start:
            self.late.add(answer)  # its call is demoted already: it cannot join it
        history.append(answer)
        if then is not None:
            self.load(cid, then == "async")

    def _check_groups(
        self, history: list[Msg], start: int, pinned: int, opener: Msg | None = None
    ) -> None:
        """The window starts with a user message (a turn, or the opener in front of the
        steps it keeps), or, in a turn that has no user message (the history has none
        before the window), with the assistant message of a step; it keeps every result
        with its call."""
        kept = history[start:]
        if start > pinned and kept:
            first = opener if opener is not None else kept[0]
            openerless = not any(m.role == "user" for m in history[pinned:start])
            assert first.role == "user" or (openerless and first.role == "assistant"), (
                f"window starts inside a group at {start}"
            )
        opened = {c: i for i, m in enumerate(history) for c in m.opens}
        for m in kept:
            at = opened.get(m.answers or "")
            if at is not None and pinned <= at < start:
                assert m in self.late, f"a result of {m.answers} lost its call"

    @rule(fail=st.integers(0, 2).map(lambda n: n == 2))
    def switch_hook(self, fail: bool) -> None:
        self.hook.fail = fail

    @rule(cid=st.sampled_from(CIDS), use_async=st.booleans())
    def recover(self, cid: str, use_async: bool) -> None:
        """The hook comes back: the next load delivers everything pending."""
        self.hook.fail = False
        self.load(cid, use_async)
        state = self.demoter.state_of(cid)
        if self.synced[cid] and state.window_start > state.pinned:
            # (past the start when results in the window are sent as placeholders)
            assert state.delivered >= state.window_start, f"still pending: {state}"

    @precondition(lambda self: self.restarts < 3)
    @rule()
    def restart(self) -> None:
        self.demoter.state.close()
        self.demoter = self._new_demoter()
        for described in self.described.values():
            described.clear()
        self.hook.this_process.clear()
        self.restarts += 1

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def every_message_in_window_or_delivered(self) -> None:
        for cid in CIDS:
            state = self.demoter.state_of(cid)
            assert state.delivered <= state.window_start
            if not self.synced[cid]:
                continue  # the next load re-syncs a rewritten history
            history = self.histories[cid]
            assert state.window_start <= max(len(history), state.pinned)
            for i in range(state.pinned, min(state.delivered, len(history))):
                assert key_of(cid, i, history[i]) in self.hook.store, f"{cid}[{i}] lost"
            # The trail holds the short fingerprints of the messages just before the window.
            first = state.window_start - len(state.trail) // TRAIL_DIGITS
            assert state.pinned <= first and len(state.trail) <= TRAIL_DIGITS * TRAIL_KEPT
            for n, i in enumerate(range(first, min(state.window_start, len(history)))):
                m = history[i]
                fp = fingerprint(m.role, m.text, m.opens, m.answers)[:TRAIL_DIGITS]
                assert state.trail[n * TRAIL_DIGITS : (n + 1) * TRAIL_DIGITS] == fp, (cid, i)

    @invariant()
    def delivered_once_within_a_process(self) -> None:
        assert all(n == 1 for n in self.hook.this_process.values())

    @invariant()
    def no_redelivery_across_restarts(self) -> None:
        # Durable state: the key-keyed store holds each key once and nothing came twice.
        assert sum(self.hook.total.values()) - len(self.hook.store) == 0

    @invariant()
    def no_cross_conversation_delivery(self) -> None:
        for key, (cid, index) in self.hook.store.items():
            assert cid in CIDS and index >= 0 and len(key) == 32


EngineMachine.TestCase.settings = settings(
    max_examples=examples(40, cost=10), stateful_step_count=30, deadline=None
)
TestEngineMachine = EngineMachine.TestCase


def test_a_stale_copy_whose_window_starts_inside_a_turn_keeps_its_opener() -> None:
    """``make fuzz`` found it: a stale copy's plan read from just before the window, where
    the turn's opener is not, and its window started at an assistant message (the plan
    said it ``needs`` more records; the stale path did not read them)."""
    hook = SwitchableHook()
    d = Demoter(SlidingWindow.last_messages(1), hook, hook_wait=None, cached_conversations=1)
    msgs = unique(
        [
            Msg("user", "hello"),
            Msg("user", "do two things"),
            Msg("assistant", "", opens=("c0",)),
            Msg("tool", "one", answers="c0"),
            Msg("assistant", "", opens=("c1",)),
            Msg("tool", "two", answers="c1"),
        ]
    )
    d.load("c", msgs[:1], describer(d))
    w = d.load("c", msgs, describer(d))
    assert (w.start, w.opener) == (4, msgs[1])
    stale = d.load("c", msgs[:5], describer(d))  # read before the last result was added
    assert stale.start == 4 and stale.opener is msgs[1]
