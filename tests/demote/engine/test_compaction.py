"""Compaction: the Compact strategy with a summarizer, off the hot path (issue 9)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from demote import (
    Backoff,
    Compact,
    ConfigError,
    ConversationState,
    Demoter,
    Demotion,
    MessageRecord,
    SlidingWindow,
)
from demote.records import make_key
from demote.state import SQLiteStateStore
from demote.summarize import TemplateSummarizer, truncate_to_tokens
from demote.window.tokens import approximate_tokens
from tests.strategies import examples

Msg = tuple[str, str]


class KeyStore:
    """A key-idempotent long tail that also counts repeats within one process."""

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}
        self.repeats_this_process = 0
        self.seen_this_process: set[str] = set()
        self.fail = False

    def deliver(self, batch: Demotion) -> None:
        if self.fail:
            raise RuntimeError("sink down")
        for m in batch.messages:
            if m.key in self.seen_this_process:
                self.repeats_this_process += 1
            self.seen_this_process.add(m.key)
            self.keys[m.key] = m.index

    def restart(self) -> None:
        self.seen_this_process = set()


class Controlled:
    """A summarizer that can succeed, fail, or block until released."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.release = threading.Event()
        self.calls = 0
        self.inner = TemplateSummarizer(max_summary_tokens=100_000)

    def summarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
        self.calls += 1
        if self.mode == "fail":
            raise RuntimeError("model unavailable")
        if self.mode == "block":
            self.release.wait(5)
        return self.inner.summarize(previous, messages)


def describe(d: Demoter) -> object:
    return lambda m: d.describe(m[0], m[1])


def conversation(n: int) -> list[Msg]:
    out: list[Msg] = [("system", "you are terse")]
    for i in range(n):
        out += [("user", f"question {i}"), ("assistant", f"answer {i}")]
    return out


POLICY = SlidingWindow.last_messages(6, eviction=Compact(compact_count=4))


def test_summary_replaces_oldest_groups_and_sits_after_pinned() -> None:
    store = KeyStore()
    d = Demoter(POLICY, store, summarizer=TemplateSummarizer())
    hist = conversation(0)
    windows = []
    for i in range(12):
        hist += [("user", f"question {i}"), ("assistant", f"answer {i}")]
        windows.append(d.load("c", hist, describe(d)))  # type: ignore[arg-type]
        assert d.drain(5)
    final = d.load("c", hist, describe(d))  # type: ignore[arg-type]
    assert final.pinned == [("system", "you are terse")]
    assert final.summary is not None and "question 0" in final.summary
    # the summary covers old summary + newly folded messages: running, carried forward
    assert "question 0" in final.summary and "question 5" in final.summary
    state = d.state_of("c")
    assert state.summarized == state.window_start
    # summarized messages were also delivered to the hook, once each
    assert sorted(store.keys.values()) == list(range(1, state.window_start))
    assert store.repeats_this_process == 0
    # the prefix (pinned + summary) changes only when a compaction commits
    summaries = [w.summary for w in windows]
    changes = sum(1 for a, b in itertools.pairwise(summaries) if a != b)
    starts = [w.start for w in windows]
    assert changes == len(set(starts)) - 1


def test_slow_summarizer_does_not_slow_the_turn() -> None:
    class Sleepy(TemplateSummarizer):
        def summarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
            time.sleep(2)
            return super().summarize(previous, messages)

    d = Demoter(POLICY, KeyStore(), summarizer=Sleepy())
    hist = conversation(6)  # 12 messages: over limit + compact_count
    t0 = time.perf_counter()
    w = d.load("c", hist, describe(d))  # type: ignore[arg-type]
    assert time.perf_counter() - t0 < 1.0  # loose: the 2 s summary ran in the background
    assert w.summary is None and w.start == 1  # nothing left the window yet
    assert d.drain(10)
    w = d.load("c", hist, describe(d))  # type: ignore[arg-type]
    assert w.summary is not None and w.start > 1


async def test_async_load_summarizes_in_a_task() -> None:
    class AsyncSleepy:
        async def asummarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
            await asyncio.sleep(0.5)
            return (previous or "") + "|".join(m.text for m in messages)

    d = Demoter(POLICY, KeyStore(), summarizer=AsyncSleepy())
    hist = conversation(6)
    t0 = time.perf_counter()
    w = await d.aload("c", hist, describe(d))  # type: ignore[arg-type]
    assert time.perf_counter() - t0 < 0.4
    assert w.summary is None
    assert await d.adrain(5)
    w = await d.aload("c", hist, describe(d))  # type: ignore[arg-type]
    assert w.summary is not None and "question 0" in w.summary


def test_failing_summarizer_falls_back_to_bulk_with_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = Controlled()
    s.mode = "fail"
    store = KeyStore()
    d = Demoter(POLICY, store, summarizer=s)
    hist = conversation(0)
    sizes = []
    with caplog.at_level(logging.WARNING, logger="demote"):
        for i in range(20):
            hist += [("user", f"question {i}"), ("assistant", f"answer {i}")]
            w = d.load("c", hist, describe(d))  # type: ignore[arg-type]
            assert d.drain(5)
            sizes.append(len(w.messages))
    assert max(sizes) <= 6 + 2 * 4  # bounded whatever the summarizer does
    assert "summarizer failed" in caplog.text
    assert "falling back to bulk eviction" in caplog.text
    assert s.calls > 1  # retried on later loads
    state = d.state_of("c")
    assert state.summary is None
    assert sorted(store.keys.values()) == list(range(1, state.window_start))


def test_summary_is_cut_to_max_summary_tokens() -> None:
    d = Demoter(POLICY, KeyStore(), summarizer=TemplateSummarizer(max_summary_tokens=20))
    hist = conversation(0)
    for i in range(30):
        hist += [("user", f"question {i} " + "lorem " * 20), ("assistant", f"answer {i}")]
        d.load("c", hist, describe(d))  # type: ignore[arg-type]
        d.drain(5)
    summary = d.state_of("c").summary
    assert summary is not None
    assert approximate_tokens(summary) <= 20
    assert truncate_to_tokens("a b c d " * 100, 5).startswith("…")
    with pytest.raises(ConfigError, match="max_summary_tokens"):
        TemplateSummarizer(max_summary_tokens=0)


def test_summary_survives_restart_and_clear_drops_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = KeyStore()
    d = Demoter(POLICY, store, state=SQLiteStateStore(path), summarizer=TemplateSummarizer())
    hist = conversation(6)
    d.load("c", hist, describe(d))  # type: ignore[arg-type]
    assert d.drain(5)
    before = d.state_of("c")
    assert before.summary
    d2 = Demoter(POLICY, store, state=SQLiteStateStore(path), summarizer=TemplateSummarizer())
    w = d2.load("c", hist, describe(d2))  # type: ignore[arg-type]
    assert w.summary == before.summary  # a restart keeps it
    hist += [("user", "later question"), ("assistant", "later answer")] * 2
    d2.load("c", hist, describe(d2))  # type: ignore[arg-type]
    assert d2.drain(5)
    after = d2.state_of("c").summary
    assert after is not None and after != before.summary
    assert after.startswith(before.summary)  # carried forward
    d2.clear("c")
    assert d2.state_of("c").summary is None


def test_stale_summary_after_clear_is_discarded() -> None:
    s = Controlled()
    s.mode = "block"
    d = Demoter(POLICY, KeyStore(), summarizer=s)
    hist = conversation(6)
    d.load("c", hist, describe(d))  # type: ignore[arg-type]
    time.sleep(0.05)
    d.clear("c")
    s.release.set()
    assert d.drain(5)
    assert d.state_of("c").summary is None
    assert d.state_of("c").window_start == 0


class CompactionMachine(RuleBasedStateMachine):
    """Interleaves appends, loads, summarizer successes, failures, slow summaries,
    hook failures and restarts; checks the invariant of issue 9 after every step."""

    @initialize()
    def setup(self) -> None:
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="demote-compaction-")
        self.store = KeyStore()
        self.summarizer = Controlled()
        self.hist: list[Msg] = [("system", "sys")]
        self.cleared = 0  # texts carry it, so a history written after a clear has new keys
        self.described: set[Msg] = set()  # messages loads described since the restart
        self._new_demoter()

    def _new_demoter(self) -> None:
        self.state = SQLiteStateStore(Path(self.dir) / "state.db")
        self.d = Demoter(
            SlidingWindow.last_messages(6, eviction=Compact(compact_count=3)),
            self.store,
            state=self.state,
            summarizer=self.summarizer,
            retry=Backoff(0, 0),  # a recovered hook is retried on the next load
        )

    def _describe(self) -> object:
        plain = describe(self.d)

        def tracked(m: Msg) -> MessageRecord:
            self.described.add(m)
            return plain(m)  # type: ignore[operator, no-any-return]

        return tracked

    def _grow(self) -> None:
        i = len(self.hist)
        self.hist += [("user", f"u{i}.{self.cleared}"), ("assistant", f"a{i}.{self.cleared}")]

    @rule(n=st.integers(1, 3))
    def append(self, n: int) -> None:
        for _ in range(n):
            self._grow()

    def _bounded(self, w: object) -> None:
        # limit + 2 x compact_count, whatever the hook and the summarizer do
        assert len(w.messages) <= 6 + 2 * 3, f"window of {len(w.messages)}"  # type: ignore[attr-defined]

    def _drained(self) -> None:
        """Background work ended; something stays pending only while the hook fails."""
        assert self.d.drain(10) or self.store.fail

    @rule()
    def load_sync(self) -> None:
        self._bounded(self.d.load("c", list(self.hist), self._describe()))  # type: ignore[arg-type]
        self._drained()

    @rule()
    def load_async(self) -> None:
        async def go() -> None:
            w = await self.d.aload("c", list(self.hist), self._describe())  # type: ignore[arg-type]
            self._bounded(w)
            assert await self.d.adrain(10) or self.store.fail

        asyncio.run(go())

    @rule()
    def recover(self) -> None:
        """The hook comes back: one load delivers everything pending."""
        self.store.fail = False
        self._drained()
        w = self.d.load("c", list(self.hist), self._describe())  # type: ignore[arg-type]
        self._drained()
        state = self.d.state_of("c")
        assert w.pending == 0 and state.delivered >= min(state.window_start, w.start)

    @rule(behind=st.integers(1, 8))
    def stale_read(self, behind: int) -> None:
        """A slow request loads a copy read before the newest appends (maybe right
        after a compaction committed): it gets a window and changes nothing."""
        stale = self.hist[: max(1, len(self.hist) - behind)]
        before = self.d.state_of("c")
        w = self.d.load("c", stale, describe(self.d))  # type: ignore[arg-type]
        self._drained()
        assert w.messages == stale[w.start :] and w.pinned == stale[: len(w.pinned)]
        if len(stale) < before.window_start and stale[-1] in self.described:
            assert self.d.state_of("c") == before, "a stale copy must not move the state"

    @rule(how=st.sampled_from(["clear", "forget"]), during_summary=st.booleans())
    def clear(self, how: str, during_summary: bool) -> None:
        """The adapter clears the history, maybe while a summary is being written."""
        if during_summary:
            self.summarizer.mode = "block"
            self.summarizer.release.clear()
            self.d.load("c", list(self.hist), self._describe())  # type: ignore[arg-type]
        getattr(self.d, how)("c")
        self.cleared += 1
        self.hist = [("system", "sys")]
        self.described.clear()
        self.summarizer.release.set()
        self._drained()
        self.summarizer.mode = "ok"
        state = self.d.state_of("c")
        fresh = ConversationState(generation=state.generation)  # clear leaves a tombstone
        assert state == fresh or (how == "forget" and state == ConversationState()), (
            "a stale summary came back"
        )

    @rule(mode=st.sampled_from(["ok", "fail"]))
    def summarizer_mode(self, mode: str) -> None:
        self.summarizer.mode = mode

    @rule(fail=st.booleans())
    def hook_mode(self, fail: bool) -> None:
        self.store.fail = fail

    @rule(extra=st.integers(1, 4))
    def slow_summary_while_loading(self, extra: int) -> None:
        self.summarizer.mode = "block"
        self.summarizer.release.clear()
        self.d.load("c", list(self.hist), self._describe())  # type: ignore[arg-type]
        for _ in range(extra):
            self._grow()
            self.d.load("c", list(self.hist), self._describe())  # type: ignore[arg-type]
        self.summarizer.release.set()
        self._drained()
        self.summarizer.mode = "ok"

    @rule()
    def restart(self) -> None:
        self._drained()
        self.state.close()
        self.store.restart()
        self.described.clear()
        self._new_demoter()

    @invariant()
    def every_message_in_window_summary_or_delivered(self) -> None:
        if not hasattr(self, "d"):
            return
        state = self.d.state_of("c")
        for i in range(1, len(self.hist)):
            in_window = i >= state.window_start
            summarized = i < state.summarized
            pending = state.delivered <= i  # left the window, the hook has not taken it
            # Delivered: this message's key (not just its position, which a history
            # written after a clear reuses) is in the store.
            key = make_key("c", i, self.d.describe(*self.hist[i]).fingerprint)
            if not (in_window or pending or key in self.store.keys):
                raise AssertionError(f"message {i} lost: {state}")
            if summarized and i >= state.delivered:
                assert not in_window  # covered by the summary, and pending delivery
        assert state.delivered <= state.window_start
        assert self.store.repeats_this_process == 0

    def teardown(self) -> None:
        if hasattr(self, "d"):
            self.summarizer.release.set()
            self.d.drain(10)
            self.state.close()
        if hasattr(self, "dir"):
            shutil.rmtree(self.dir, ignore_errors=True)


TestCompactionMachine = CompactionMachine.TestCase
TestCompactionMachine.settings = settings(
    max_examples=examples(30, cost=20),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_first_load_without_pinned_messages_still_commits_its_summary() -> None:
    # Regression: with no state stored yet and nothing else to commit, the summary's
    # compare-and-set must expect "no state", not an empty one.
    d = Demoter(POLICY, KeyStore(), summarizer=TemplateSummarizer())
    hist = conversation(6)[1:]  # no system message
    d.load("c", hist, describe(d))  # type: ignore[arg-type]
    assert d.drain(5)
    assert d.state_of("c").summary is not None
    assert d.state_of("c").window_start == 4
