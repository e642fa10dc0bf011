"""The demotion engine: named cases (delivery once, failures, in-flight gate, clears,
restarts, rewrites, sync/async hooks) and bad conversation ids."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from demote import (
    Backoff,
    ConfigError,
    ConversationIdError,
    ConversationState,
    Demoter,
    Demotion,
    HookError,
    HookTimeout,
    SlidingWindow,
    SQLiteStateStore,
)
from demote.records import make_key
from tests.strategies import Msg, describer, unique

LAST4 = SlidingWindow.last_messages(4)


class RecordingHook:
    """Records every batch; keeps a key-idempotent store; can be switched to failing."""

    def __init__(self) -> None:
        self.batches: list[Demotion] = []
        self.store: dict[str, tuple[str, int, str]] = {}
        self.deliveries: Counter[str] = Counter()
        self.threads: list[threading.Thread] = []
        self.calls = 0
        self.fail = False
        self.lock = threading.Lock()

    def deliver(self, batch: Demotion) -> None:
        with self.lock:
            self.calls += 1
            self.threads.append(threading.current_thread())
            if self.fail:
                raise RuntimeError("hook is down")
            self.batches.append(batch)
            for m in batch.messages:
                self.deliveries[m.key] += 1
                self.store[m.key] = (batch.conversation_id, m.index, m.text)

    def indexes(self, cid: str) -> list[int]:
        return sorted(i for c, i, _ in self.store.values() if c == cid)

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.deliveries.values())


class KeyedHook(RecordingHook):
    """A hook that can tell which keys it already holds (like SQLiteArchive)."""

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        with self.lock:
            return {k for k in keys if k in self.store}


class AsyncOnlyHook:
    def __init__(self) -> None:
        self.inner = RecordingHook()

    async def adeliver(self, batch: Demotion) -> None:
        await asyncio.sleep(0)
        self.inner.deliver(batch)


class BlockingHook(RecordingHook):
    """Blocks in ``deliver`` until ``release`` is set (at most 5 s)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def deliver(self, batch: Demotion) -> None:
        self.entered.set()
        self.release.wait(5)
        super().deliver(batch)


def chat(n: int, tag: str = "") -> list[Msg]:
    roles = ("user", "assistant")
    return unique([Msg(roles[i % 2], f"m{i}") for i in range(n)], tag)


def load(d: Demoter, cid: str, msgs: list[Msg]) -> Any:
    w = d.load(cid, msgs, describer(d))
    assert w.messages == msgs[w.start :]
    assert w.pinned == msgs[: len(w.pinned)]
    return w


async def aload(d: Demoter, cid: str, msgs: list[Msg]) -> Any:
    w = await d.aload(cid, msgs, describer(d))
    assert w.messages == msgs[w.start :]
    return w


def run_in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


# -- delivery -------------------------------------------------------------------------------


def test_each_demoted_message_reaches_the_hook_once() -> None:
    hook = RecordingHook()
    d = Demoter(LAST4, hook)
    msgs: list[Msg] = []
    for _ in range(20):
        msgs += chat(2)
        w = load(d, "c", msgs)
        assert hook.indexes("c") == list(range(w.start))
    assert hook.duplicates() == 0
    assert len(hook.store) == 36
    assert [m.key for b in hook.batches for m in b.messages] == [
        make_key("c", i, describer(d)(msgs[i]).fingerprint) for i in range(36)
    ]
    assert d.state_of("c").delivered == d.state_of("c").window_start == 36


def test_policy_that_never_demotes_still_loads() -> None:
    hook = RecordingHook()
    d = Demoter(SlidingWindow.last_messages(10_000), hook)
    msgs = chat(50)
    w = load(d, "c", msgs)
    assert (w.start, len(w.messages), w.demoted) == (0, 50, 0)
    assert hook.calls == 0
    assert d.state_of("c") == ConversationState()
    assert load(Demoter(LAST4), "c", msgs).start == 46  # NoopHook by default


def test_hook_failure_moves_the_window_and_keeps_the_messages_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hook = RecordingHook()
    d = Demoter(LAST4, hook, retry=Backoff(0, 0))
    msgs = chat(10)
    hook.fail = True
    with caplog.at_level(logging.WARNING, logger="demote"):
        w = load(d, "c", msgs)
    assert "hook failed" in caplog.text
    assert (w.start, w.demoted, w.pending, w.delivered) == (6, 0, 6, 0), "bounded, pending"
    state = d.state_of("c")
    assert (state.window_start, state.delivered) == (6, 0)
    hook.fail = False
    w = load(d, "c", msgs)
    assert (w.start, w.demoted, w.pending, w.delivered) == (6, 6, 0, 6)
    assert hook.indexes("c") == list(range(6)) and hook.duplicates() == 0


def test_a_failing_hook_is_retried_after_its_backoff_not_on_every_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hook = RecordingHook()
    hook.fail = True
    d = Demoter(LAST4, hook, retry=Backoff(initial=60, maximum=60))
    msgs = chat(4)
    with caplog.at_level(logging.WARNING, logger="demote"):
        for _ in range(20):
            msgs += unique([Msg("user", "more"), Msg("assistant", "ok")])
            w = load(d, "c", msgs)
            assert len(w.messages) <= 4, "bounded while the hook is down"
    assert hook.calls == 1, "a dead sink is not called on every turn"
    assert caplog.text.count("hook failed") == 1, "one warning per backoff period"
    assert w.pending == len(msgs) - 4
    # A new Demoter (a restart) tries at once, and delivers the whole backlog in order.
    hook.fail = False
    d2 = Demoter(LAST4, hook, state=d.state, max_batch=7)
    w = load(d2, "c", msgs)
    assert (w.pending, w.delivered) == (0, len(msgs) - 4)
    assert hook.indexes("c") == list(range(len(msgs) - 4)) and hook.duplicates() == 0
    assert max(len(b) for b in hook.batches) == 7  # a backlog goes in batches


def test_only_newly_demoted_messages_are_reported() -> None:
    d = Demoter(LAST4, RecordingHook())
    msgs = chat(10)
    assert load(d, "c", msgs).demoted == 6
    assert load(d, "c", msgs).demoted == 0
    msgs += chat(2)
    assert load(d, "c", msgs).demoted == 2


def test_unchanged_messages_are_described_once() -> None:
    d = Demoter(LAST4)
    calls: list[Msg] = []

    def describe(m: Msg) -> Any:
        calls.append(m)
        return describer(d)(m)

    msgs = chat(10)
    d.load("c", msgs, describe)
    calls.clear()
    msgs += chat(2)
    d.load("c", msgs, describe)
    assert calls == msgs[-2:]


def test_a_steady_load_describes_only_what_was_appended() -> None:
    """The pinned head a token window counts, and the opener of a window that starts
    inside a turn, lie before the records a load reads: once out of them, they are
    described once while they stay the same objects, and again once replaced."""
    d = Demoter(SlidingWindow.last_tokens(60))
    calls: list[Msg] = []

    def describe(m: Msg) -> Any:
        calls.append(m)
        return describer(d)(m)

    steps = [
        m
        for n in range(8)
        for m in (
            Msg("assistant", f"step {n}", opens=(f"c{n}",)),
            Msg("tool", f"result {n} " + "r" * 30, answers=f"c{n}"),
        )
    ]
    msgs = unique([Msg("system", "be brief"), Msg("user", "go"), *steps])
    first = d.load("c", msgs, describe)
    assert first.opener is msgs[1] and first.start > 2, "the window starts inside the turn"
    for n in range(8, 12):
        calls.clear()
        new = unique(
            [
                Msg("assistant", f"step {n}", opens=(f"c{n}",)),
                Msg("tool", f"result {n} " + "r" * 30, answers=f"c{n}"),
            ]
        )
        msgs += new
        w = d.load("c", msgs, describe)
        assert w.opener is msgs[1] and w.pinned == msgs[:1]
        if n > 8:  # (the first load after them read them from its own records)
            assert calls == new, "only the appended messages are described"
    # Replaced (an edit): described again, and counted as they are now.
    msgs[0] = replace(msgs[0], text=msgs[0].text + " and polite")
    msgs[1] = replace(msgs[1], text=msgs[1].text + " now")
    calls.clear()
    w = d.load("c", msgs, describe)
    assert msgs[0] in calls and msgs[1] in calls
    assert w.pinned == msgs[:1] and w.opener is msgs[1]


def test_describe_counts_tokens_once_per_distinct_message() -> None:
    seen: list[str] = []

    def counter(text: str) -> int:
        seen.append(text)
        return len(text)

    d = Demoter(SlidingWindow.last_tokens(50, counter=counter))
    for _ in range(3):
        d.describe("user", "hello there")
    assert seen == ["hello there", "user"]  # its parts (the role is sent too), once


def test_bad_engine_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="policy"):
        Demoter({"unit": "messages", "limit": 3})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="on_hook_error"):
        Demoter(LAST4, on_hook_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="hook_timeout"):
        Demoter(LAST4, hook_timeout=0)
    with pytest.raises(ConfigError, match="hook"):
        Demoter(LAST4, object())


def test_error_modes_are_fixed_at_construction() -> None:
    # The parts that act on them take them when they are built: a later assignment would
    # silently do nothing, so it is refused.
    d = Demoter(LAST4, on_hook_error="raise", on_store_error="raise")
    assert (d.on_hook_error, d.on_store_error) == ("raise", "raise")
    with pytest.raises(AttributeError):
        d.on_hook_error = "log"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        d.on_store_error = "degrade"  # type: ignore[misc]


# -- the in-flight gate -------------------------------------------------------------------


def test_in_flight_load_returns_without_calling_the_hook() -> None:
    hook = BlockingHook()
    d = Demoter(LAST4, hook)
    msgs = chat(10)
    t, box = run_in_thread(lambda: load(d, "c", msgs))
    assert hook.entered.wait(5)
    began = time.monotonic()
    w = load(d, "c", msgs)
    assert time.monotonic() - began < 1.0, "did not wait for the blocked hook"
    assert hook.calls == 0 and w.demoted == 0
    hook.release.set()
    t.join(5)
    assert box["value"].demoted == 6
    assert hook.calls == 1 and hook.duplicates() == 0
    assert load(d, "c", msgs).demoted == 0


def test_raise_reaches_only_the_caller_that_drove_the_delivery() -> None:
    hook = BlockingHook()
    hook.fail = True
    d = Demoter(LAST4, hook, on_hook_error="raise")
    msgs = chat(10)
    t, box = run_in_thread(lambda: load(d, "c", msgs))
    assert hook.entered.wait(5)
    w = load(d, "c", msgs)  # not the deliverer: no error
    assert w.demoted == 0
    hook.release.set()
    t.join(5)
    assert isinstance(box.get("error"), HookError)
    assert "hook is down" in str(box["error"])
    assert isinstance(box["error"].__cause__, RuntimeError)
    state = d.state_of("c")  # the window move was committed before the error was raised
    assert (state.window_start, state.delivered) == (6, 0)


async def test_hook_timeout_raises_hook_timeout() -> None:
    class Slow:
        async def adeliver(self, batch: Demotion) -> None:
            await asyncio.sleep(5)

    d = Demoter(LAST4, Slow(), on_hook_error="raise", hook_timeout=0.05)
    with pytest.raises(HookTimeout):
        await aload(d, "c", chat(10))
    state = d.state_of("c")
    assert (state.window_start, state.delivered) == (6, 0)


async def test_hook_timeout_logs_and_next_load_delivers(caplog: pytest.LogCaptureFixture) -> None:
    hook = AsyncOnlyHook()
    slow = {"on": True}

    class MaybeSlow:
        async def adeliver(self, batch: Demotion) -> None:
            if slow["on"]:
                await asyncio.sleep(5)
            await hook.adeliver(batch)

    d = Demoter(LAST4, MaybeSlow(), hook_timeout=0.05, retry=Backoff(0, 0))
    msgs = chat(10)
    with caplog.at_level(logging.WARNING, logger="demote"):
        w = await aload(d, "c", msgs)
    assert "HookTimeout" in caplog.text
    assert (w.start, w.pending) == (6, 6)
    slow["on"] = False
    assert (await aload(d, "c", msgs)).demoted == 6
    assert hook.inner.duplicates() == 0


async def test_cancelled_async_load_releases_the_gate() -> None:
    entered, gate = asyncio.Event(), asyncio.Event()
    hook = RecordingHook()

    class Stuck:
        async def adeliver(self, batch: Demotion) -> None:
            entered.set()
            await gate.wait()
            hook.deliver(batch)

    d = Demoter(LAST4, Stuck())
    msgs = chat(10)
    task = asyncio.create_task(aload(d, "c", msgs))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert d.state_of("c") == ConversationState()
    gate.set()
    w = await aload(d, "c", msgs)
    assert w.demoted == 6 and hook.indexes("c") == list(range(6))


async def test_stale_cancelled_load_does_not_clear_new_reservation() -> None:
    release = asyncio.Event()
    entered: list[int] = []
    hook = RecordingHook()

    class Stuck:
        async def adeliver(self, batch: Demotion) -> None:
            entered.append(len(batch))
            await release.wait()
            hook.deliver(batch)

    d = Demoter(LAST4, Stuck())
    old = chat(10, "old")
    stale = asyncio.create_task(aload(d, "c", old))
    while not entered:
        await asyncio.sleep(0.001)
    d.clear("c")
    new = chat(12, "new")
    fresh = asyncio.create_task(aload(d, "c", new))  # takes the new reservation
    while len(entered) < 2:
        await asyncio.sleep(0.001)
    stale.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stale
    # The fresh load still holds the gate: a third load does not deliver.
    w = await aload(d, "c", new)
    assert len(entered) == 2 and w.demoted == 0
    release.set()
    assert (await fresh).demoted == 8
    assert d.state_of("c").window_start == 8
    assert hook.duplicates() == 0


@pytest.mark.parametrize("how", ["clear", "forget"])
@pytest.mark.parametrize("committed_before", [False, True])
def test_concurrent_with_clear_does_not_resurrect_state(how: str, committed_before: bool) -> None:
    hook = BlockingHook()
    d = Demoter(LAST4, hook)
    msgs = chat(10)
    if committed_before:
        hook.release.set()
        load(d, "c", msgs[:6])
        hook.release.clear()
        hook.entered.clear()
    t, box = run_in_thread(lambda: load(d, "c", msgs))
    assert hook.entered.wait(5)
    getattr(d, how)("c")
    hook.release.set()
    t.join(5)
    assert "error" not in box
    state = d.state.get("c")
    if how == "forget":
        assert state is None, "a stale delivery resurrected state after forget"
        assert d.tracked_conversations() == 0
    else:  # clear leaves a tombstone one generation on, which nothing stale overwrote
        assert state == ConversationState(generation=1)
    # The conversation starts over cleanly.
    fresh = chat(6, "fresh")
    assert load(d, "c", fresh).start == 2
    assert d.state_of("c").window_start == 2


# -- durability and rewrites ----------------------------------------------------------------


def test_watermarks_persist_across_a_new_demoter(tmp_path: Path) -> None:
    hook = RecordingHook()
    path = tmp_path / "state.db"
    msgs = chat(10)
    d1 = Demoter(LAST4, hook, state=SQLiteStateStore(path))
    assert load(d1, "c", msgs).demoted == 6
    d1.state.close()
    d2 = Demoter(LAST4, hook, state=SQLiteStateStore(path))
    assert d2.state_of("c").window_start == 6
    w = load(d2, "c", list(msgs))
    assert (w.start, w.demoted) == (6, 0)
    msgs += chat(4)
    assert load(d2, "c", msgs).demoted == 4
    assert hook.indexes("c") == list(range(10)) and hook.duplicates() == 0
    d2.state.close()


@pytest.mark.parametrize("rewrite", ["diverged", "edited"])
def test_rewritten_history_is_resynced_without_redelivery(
    rewrite: str, caplog: pytest.LogCaptureFixture
) -> None:
    hook = KeyedHook()
    d = Demoter(LAST4, hook)
    msgs = chat(10)
    load(d, "c", msgs)
    before = d.state_of("c")
    assert before.window_start == 6
    if rewrite == "diverged":  # shorter, and not a copy of what was seen
        changed = [*msgs[:4], Msg("user", "a different question")]
        expect_start, new_keys = 2, 0  # 0 and 1 are held already
    else:
        changed = [*msgs[:5], Msg("assistant", "edited"), *msgs[6:]]
        expect_start, new_keys = 6, 1
    with caplog.at_level(logging.WARNING, logger="demote"):
        w = load(d, "c", changed)
    assert "no longer matches" in caplog.text
    assert w.start == expect_start
    assert w.demoted == new_keys
    assert hook.duplicates() == 0
    after = d.state_of("c")
    assert after.generation == before.generation + 1
    assert after.window_start == expect_start
    # And it is stable from there: the next load is not a rewrite.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="demote"):
        assert load(d, "c", changed).demoted == 0
    assert "no longer matches" not in caplog.text


def test_truncated_copy_is_served_without_commit_then_resynced_once_it_diverges(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A prefix of what was seen is indistinguishable from a stale read: it gets its own
    # window and changes nothing; new content after it is a rewrite, re-synced then.
    hook = KeyedHook()
    d = Demoter(LAST4, hook)
    msgs = chat(10)
    load(d, "c", msgs)
    before = d.state_of("c")
    with caplog.at_level(logging.WARNING, logger="demote"):
        w = load(d, "c", msgs[:5])
    assert "no longer matches" not in caplog.text
    assert (w.start, w.demoted) == (2, 0)
    assert d.state_of("c") == before
    continued = [*msgs[:5], Msg("assistant", "a new answer")]
    with caplog.at_level(logging.WARNING, logger="demote"):
        w = load(d, "c", continued)
    assert "no longer matches" in caplog.text
    assert w.start == 2 and hook.duplicates() == 0
    assert d.state_of("c").generation == before.generation + 1


# -- sync and async hooks from either side ------------------------------------------------


async def test_sync_only_hook_from_aload_runs_off_the_event_loop() -> None:
    hook = RecordingHook()
    d = Demoter(LAST4, hook)
    w = await aload(d, "c", chat(10))
    assert w.demoted == 6
    assert hook.threads and hook.threads[0] is not threading.current_thread()


def test_async_only_hook_from_sync_load() -> None:
    hook = AsyncOnlyHook()
    d = Demoter(LAST4, hook)
    assert load(d, "c", chat(10)).demoted == 6
    assert hook.inner.indexes("c") == list(range(6))


async def test_async_only_hook_from_sync_load_inside_a_running_loop() -> None:
    hook = AsyncOnlyHook()
    d = Demoter(LAST4, hook)
    assert load(d, "c", chat(10)).demoted == 6
    assert hook.inner.indexes("c") == list(range(6))


# -- bad conversation ids -------------------------------------------------------------------

ACCEPTED = [
    "plain",
    "with \"quotes\" and 'single'",
    "100%_done",
    "a; DROP TABLE demote_state; --",
    "../../etc/passwd",
    "..\\windows",
    "x" * 10_000,
    "ünïcødé ☃",
]
REJECTED = ["", "nul\x00inside", "y" * 20_000, 42, None, b"bytes"]


@pytest.mark.parametrize("cid", ACCEPTED, ids=lambda c: repr(c)[:20])
def test_odd_conversation_ids_round_trip_safely(cid: str, tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    d = Demoter(LAST4, RecordingHook(), state=store)
    load(d, "other", chat(10))
    other = d.state_of("other")
    files = sorted(os.listdir(tmp_path))
    w = load(d, cid, chat(10))
    assert w.conversation_id == cid and w.demoted == 6
    assert d.state_of(cid).window_start == 6
    assert d.state_of("other") == other
    assert sorted(store.conversations()) == sorted([cid, "other"])
    assert sorted(os.listdir(tmp_path)) == files, "no file is made from the id"
    d.clear(cid)
    assert d.state_of(cid) == ConversationState(generation=1)
    d.forget(cid)
    assert store.conversations() == ["other"]
    store.close()


@pytest.mark.parametrize("cid", REJECTED, ids=lambda c: repr(c)[:20])
def test_bad_conversation_ids_are_rejected(cid: object, tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    d = Demoter(LAST4, RecordingHook(), state=store)
    load(d, "other", chat(10))
    other = d.state_of("other")
    files = sorted(os.listdir(tmp_path))
    with pytest.raises(ConversationIdError) as info:
        d.load(cid, chat(10), describer(d))  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert "conversation_id" in str(info.value)
    for op in (d.clear, d.forget, d.state_of):
        with pytest.raises(ConversationIdError):
            op(cid)  # type: ignore[arg-type]
    assert store.conversations() == ["other"] and d.state_of("other") == other
    assert sorted(os.listdir(tmp_path)) == files
    store.close()


async def test_bad_conversation_id_is_rejected_by_aload() -> None:
    d = Demoter(LAST4)
    with pytest.raises(ConversationIdError):
        await d.aload("", chat(2), describer(d))


def test_after_a_resync_later_loads_do_not_redeliver_held_messages() -> None:
    """Found by the state machine: the re-sync restarts the watermark at 0, so a later
    load (not itself a re-sync) offered again what the hook got before the rewrite."""
    hook = KeyedHook()
    d = Demoter(SlidingWindow.last_messages(1), hook)
    msgs = unique([Msg("user", "a"), Msg("user", "b"), Msg("user", "c"), Msg("assistant", "d")])
    first = load(d, "c", msgs)
    assert first.demoted == first.start >= 2  # (a window inside the turn: its opener too)
    shorter = msgs[:1]
    assert load(d, "c", shorter).start == 0  # rewritten: re-synced from scratch
    grown = [*shorter, *unique([Msg("user", "e")])]
    w = load(d, "c", grown)
    assert w.start == 1 and w.demoted == 0, "message 0 was delivered before the rewrite"
    assert hook.duplicates() == 0


def test_cached_views_are_bounded_and_a_miss_only_costs_a_redescribe() -> None:
    described: list[str] = []
    d = Demoter(LAST4, KeyedHook(), cached_conversations=2)

    def describe(m: Msg) -> Any:
        described.append(m.text)
        return d.describe(m.role, m.text, opens=m.opens, answers=m.answers)

    chats = {cid: chat(10, cid) for cid in ("a", "b", "c")}
    first = {cid: d.load(cid, chats[cid], describe) for cid in chats}
    assert len(d._views) == 2 and "a" not in d._views  # least recently loaded went first
    described.clear()
    again = d.load("a", chats["a"], describe)  # a miss: described again, same answer
    assert described and (again.start, again.messages) == (first["a"].start, first["a"].messages)
    described.clear()
    d.load("a", chats["a"], describe)  # now cached: nothing described
    assert described == []
    with pytest.raises(ConfigError, match="cached_conversations"):
        Demoter(LAST4, cached_conversations=0)


def test_removing_the_pinned_system_message_before_any_demotion_keeps_every_message() -> None:
    # Found by the state machine: the window started after the old pinned prefix, so a
    # message written where the system message had been was neither shown nor delivered.
    hook = KeyedHook()
    d = Demoter(SlidingWindow.last_messages(1), hook)
    load(d, "c", [Msg("system", "be brief"), Msg("user", "first")])
    rewritten = [Msg("user", "rewritten")]
    w = load(d, "c", rewritten)
    assert w.pinned == [] and w.messages == rewritten
    state = d.state_of("c")
    assert state.delivered <= state.window_start == 0


def test_a_rewrite_whose_resync_failed_is_not_mistaken_for_a_stale_copy_on_the_next_load() -> None:
    # Found by the state machine: the failed re-sync left the rewritten history in the
    # view, so loading it again looked like a stale copy and its window hid a message
    # that was neither delivered nor covered by a summary.
    hook = KeyedHook()
    d = Demoter(SlidingWindow.last_messages(1), hook, retry=Backoff(0, 0))
    load(d, "c", unique([Msg("user", "a"), Msg("user", "b"), Msg("user", "c"), Msg("user", "d")]))
    assert d.state_of("c").window_start == 3
    hook.fail = True
    rewritten = unique([Msg("user", "x"), Msg("user", "y")])
    w = load(d, "c", rewritten)  # re-sync: the window moves, its delivery failed
    assert (w.start, w.pending) == (1, 1)
    state = d.state_of("c")
    assert (state.generation, state.window_start, state.delivered) == (1, 1, 0)
    w = load(d, "c", rewritten)
    assert (w.start, w.pending) == (1, 1), "message 0 stays pending, not lost"
    hook.fail = False
    w = load(d, "c", rewritten)
    assert (w.start, w.pending) == (1, 0)
    assert rewritten[0].text in {text for _, _, text in hook.store.values()}


def test_a_failed_delivery_after_the_pinned_head_shrank_keeps_every_message_in_the_window() -> None:
    # Found by the state machine: with nothing demoted yet, the window the failed delivery
    # fell back to started after the old pinned prefix, so the message written in place of
    # the removed system message was neither shown nor delivered.
    hook = KeyedHook()
    d = Demoter(SlidingWindow.last_messages(1), hook)
    load(d, "c", unique([Msg("system", "be brief"), Msg("user", "first")]))
    assert d.state_of("c").pinned == 1
    hook.fail = True
    rewritten = unique([Msg("user", "rewritten"), Msg("user", "second")])
    w = load(d, "c", rewritten)
    assert w.pinned == [] and (w.start, w.pending) == (1, 1), "message 0 is pending"
    hook.fail = False
    d2 = Demoter(SlidingWindow.last_messages(1), hook, state=d.state)  # no backoff yet
    w = load(d2, "c", rewritten)
    assert (w.start, w.pending) == (1, 0)
    assert rewritten[0].text in {text for _, _, text in hook.store.values()}


def test_a_stale_copy_past_the_window_start_commits_nothing_so_a_late_result_keeps_its_call() -> (
    None
):
    # Found by the state machine: a copy read before a tool result arrived, planned as the
    # current history, cut between the call and its result (they are one group only once
    # the result is there), and the next load's window started with an orphan result.
    hook = KeyedHook()
    d = Demoter(SlidingWindow.last_messages(1), hook)
    msgs = unique(
        [
            Msg("assistant", "calling", opens=("late",)),
            Msg("user", "meanwhile"),
            Msg("assistant", "ok"),
            Msg("tool", "result", answers="late"),
        ]
    )
    assert load(d, "c", msgs).start == 0  # one group: the call is answered at the end
    before = d.state_of("c")
    w = load(d, "c", msgs[:3])  # a request that read the history before the result came
    # It is served its own plan: in the copy the call is unanswered, so it is not sent.
    shown = ([w.opener] if w.opener is not None else []) + w.messages
    assert shown[0] is msgs[1] and w.demoted == 0
    assert d.state_of("c") == before
    assert load(d, "c", msgs).start == 0, "the result lost its call"


def test_window_calls_says_whether_a_kept_message_may_open_a_tool_call() -> None:
    """``Window.calls`` is False exactly when nothing in the planned region opens a call.

    Adapters skip pairing calls with their results on ``False``: it must never be
    ``False`` while a kept message opens one (the stateful machine checks that on random
    histories); here, that it is ``False`` for a chat, ``True`` while a call is kept, and
    ``False`` again once the call and its result left the window.
    """
    d = Demoter(SlidingWindow.last_messages(3))
    chat = unique([Msg("user", "hi"), Msg("assistant", "hello"), Msg("user", "how are you")])
    w = d.load("chat", chat, describer(d))
    assert not w.calls and len(w.messages) == 3

    call = [Msg("assistant", "", opens=("c1",)), Msg("tool", "42", answers="c1")]
    agent = [*chat, *unique(call)]
    w = d.load("chat", agent, describer(d))
    assert w.calls and any(m.opens for m in w.messages)

    later = [
        *agent,
        *unique([Msg("user", "and now?"), Msg("assistant", "fine"), Msg("user", "ok")]),
    ]
    w = d.load("chat", later, describer(d))
    assert not any(m.opens for m in w.messages) and not w.calls
