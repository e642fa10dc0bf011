"""The contract of a demoting memory, written once for every adapter.

Subclass :class:`DemotingMemoryContract` in an adapter's test module (the class name must
start with ``Test`` there; this base has no ``Test`` prefix, so pytest collects it only
through subclasses) and give it a ``make_driver`` fixture returning a
:class:`~tests.conformance.driver.MakeDriver`::

    class TestDemotingChatMessageHistory(DemotingMemoryContract):
        @pytest.fixture
        def make_driver(self, tmp_path: Path) -> MakeDriver:
            return build_langchain_driver

Every test that does not compare flavours runs once per flavour (``sync``, ``async``)
through the ``flavour`` fixture. What is checked, after every step of every script:

- the window is the pinned system messages followed by a suffix of the history that
  starts on a turn-group boundary (a user message), holds the newest message, and stays
  within the policy's bound (``limit``, or ``limit + overflow`` under ``Bulk``; a single
  group larger than the limit is kept whole);
- ``PerItem`` (and ``Bulk`` right after a cut) trims no more than it must;
- everything between the pinned messages and the window start is in the recording hook
  exactly once, in order, with its absolute index, under unique keys; nothing else is;
- reading twice without writing returns the same window and demotes nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from demote import (
    Bulk,
    ConversationIdError,
    ConversationState,
    Demotion,
    PerItem,
    SlidingWindow,
    SQLiteStateStore,
    StateStore,
)
from demote.state.memory import InMemoryStateStore
from demote.window.planner import turn_groups
from tests.conformance.driver import Flavour, MakeDriver, MemoryDriver, Pair

__all__ = ["POLICIES", "DemotingMemoryContract", "RecordingHook", "check_window", "say"]


class RecordingHook:
    """A hook that keeps every batch it is given (sync and async), for assertions."""

    def __init__(self) -> None:
        self.batches: list[Demotion] = []
        self.erased_keys: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def deliver(self, batch: Demotion) -> None:
        with self._lock:
            self.batches.append(batch)

    async def adeliver(self, batch: Demotion) -> None:
        await asyncio.sleep(0)
        self.deliver(batch)

    def records(self, conversation_id: str | None = None) -> list[tuple[str, str, int, str]]:
        """``(role, text, index, key)`` of every delivered message, in delivery order."""
        return [
            (m.role, m.text, m.index, m.key)
            for b in self.batches
            if conversation_id is None or b.conversation_id == conversation_id
            for m in b.messages
        ]

    def clear(self) -> None:
        with self._lock:
            self.batches.clear()

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """Forget one conversation's batches (a tier of :meth:`demote.Demoter.erase`)."""
        with self._lock:
            self.erased_keys[conversation_id] = list(keys or ())
            gone = self.records(conversation_id)
            self.batches = [b for b in self.batches if b.conversation_id != conversation_id]
        return len(gone)


#: The policies every bound test runs under (id -> policy).
POLICIES: dict[str, SlidingWindow] = {
    "messages-peritem": SlidingWindow.last_messages(6),
    "messages-bulk": SlidingWindow.last_messages(6, eviction=Bulk(overflow=4)),
    "turns-peritem": SlidingWindow.last_turns(3),
    "turns-bulk": SlidingWindow.last_turns(3, eviction=Bulk(overflow=2)),
    "tokens-peritem": SlidingWindow.last_tokens(120, eviction=PerItem()),
    "tokens-bulk": SlidingWindow.last_tokens(120, eviction=Bulk(overflow=60)),
    "tokens-lowwater": SlidingWindow.last_tokens(120),  # the default: LowWater
}

_WORDS: tuple[str, ...] = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")
_WORDS += ("golf", "hotel", "india", "juliet", "kilo", "lima")


def say(tag: str, i: int) -> list[Pair]:
    """One user/assistant turn with distinct texts of varying length (for token windows)."""
    words = " ".join(_WORDS[(i * 7 + j) % len(_WORDS)] for j in range(1 + (i * 5) % 9))
    return [("user", f"{tag} question {i}: {words}?"), ("assistant", f"{tag} answer {i}. {words}")]


def _size(driver: MemoryDriver, pairs: list[Pair]) -> int:
    """Size of ``pairs`` in the policy's unit, as the planner counts it."""
    policy = driver.demoter.policy
    if not pairs:
        return 0
    if policy.unit == "messages":
        return len(pairs)
    records = [driver.demoter.describe(role, text) for role, text in pairs]
    if policy.unit == "turns":
        return len(turn_groups(records))
    return sum(r.tokens for r in records)


def _pinned(driver: MemoryDriver, history: list[Pair]) -> int:
    if not driver.demoter.policy.pin_system:
        return 0
    n = 0
    while n < len(history) and history[n][0] == "system":
        n += 1
    return n


def check_window(
    driver: MemoryDriver, hook: RecordingHook, previous_start: int | None = None
) -> int:
    """Assert the contract on the current window; returns the window start (absolute)."""
    window = driver.window()
    history = driver.all()
    cid = driver.conversation_id
    policy = driver.demoter.policy
    pinned = _pinned(driver, history)
    assert driver.demoter.state_of(cid).summary is None  # no Compact in this suite
    assert window[:pinned] == history[:pinned], "pinned system messages must lead the window"
    kept = window[pinned:]
    start = len(history) - len(kept)
    if kept != history[start:] and len(kept) > 1 and kept[0][0] == "user":
        # The window starts inside a turn: the turn's opener leads its newest steps.
        start = len(history) - (len(kept) - 1)
        assert kept[0] in history[pinned:start], "the opener comes from earlier in the turn"
        assert kept[1:] == history[start:], "the steps must be a suffix of the history"
    assert start >= pinned
    assert kept[-(len(history) - start) :] == history[start:] if start < len(history) else True, (
        "the window must be a suffix of the history"
    )
    if len(history) > pinned:
        assert kept, "the newest message is always in the window"
    if start > pinned:
        assert kept[0][0] == "user", f"window starts mid-group: {kept[:2]!r}"
    # Bound: within the limit (+ overflow), unless the window is one oversized group.
    # In a token window the pinned head counts toward the limit (the provider bills it).
    head = _size(driver, window[:pinned]) if policy.unit == "tokens" and pinned else 0
    size = _size(driver, kept) + head
    allowance = policy.limit
    if isinstance(policy.eviction, Bulk):
        allowance += policy.eviction.overflow
    single_group = sum(1 for role, _ in kept[1:] if role == "user") == 0
    assert size <= allowance or single_group, f"window of {size} over {allowance}"
    # Tightness: PerItem (and Bulk right after a cut) drops no group it could have kept.
    cut = previous_start is not None and start != previous_start
    # LowWater cuts well below the limit on purpose (cache-true); the bound is its check.
    tight = isinstance(policy.eviction, PerItem) or (cut and isinstance(policy.eviction, Bulk))
    if start > pinned and tight:
        before = history[pinned:start]
        last_user = max(i for i, (role, _) in enumerate(before) if role == "user")
        assert _size(driver, before[last_user:] + kept) + head > policy.limit, "trimmed too much"
        if isinstance(policy.eviction, Bulk):
            assert size <= policy.limit, "a bulk cut goes back to the limit"
    # Exactly once: the hook holds exactly history[pinned:start], in order, keys unique.
    delivered = hook.records(cid)
    assert [(r, t, i) for r, t, i, _ in delivered] == [
        (role, text, i) for i, (role, text) in enumerate(history[pinned:start], pinned)
    ], "every demoted message is delivered once, in order, and nothing else"
    keys = [k for *_, k in delivered]
    assert len(set(keys)) == len(keys), "dedup keys must be unique"
    return start


def _script(driver: MemoryDriver, hook: RecordingHook, turns: int, tag: str = "t") -> int:
    start: int | None = None
    for i in range(turns):
        driver.add(say(tag, i))
        start = check_window(driver, hook, start)
    assert start is not None
    return start


class DemotingMemoryContract:
    """The conformance suite; subclasses provide the ``make_driver`` fixture."""

    @pytest.fixture
    def make_driver(self) -> MakeDriver:
        """Return a :class:`MakeDriver` for the adapter under test (override this)."""
        raise NotImplementedError("subclasses provide make_driver")

    @pytest.fixture(params=["sync", "async"])
    def flavour(self, request: pytest.FixtureRequest) -> Flavour:
        return request.param  # type: ignore[no-any-return]

    @pytest.fixture
    def hook(self) -> RecordingHook:
        return RecordingHook()

    @pytest.fixture
    def state(self) -> StateStore:
        return InMemoryStateStore()

    # -- read / write / clear -----------------------------------------------------------

    def test_append_and_read(
        self, make_driver: MakeDriver, hook: RecordingHook, state: StateStore, flavour: Flavour
    ) -> None:
        driver = make_driver(SlidingWindow.last_messages(50), hook, state, "rw", flavour=flavour)
        assert driver.all() == []
        assert driver.window() == []
        pairs = [("system", "be brief"), *say("rw", 0), *say("rw", 1)]
        driver.add(pairs[:1])
        driver.add(pairs[1:])
        assert driver.all() == pairs
        assert driver.window() == pairs
        assert hook.batches == []

    def test_read_twice_is_stable(
        self, make_driver: MakeDriver, hook: RecordingHook, state: StateStore, flavour: Flavour
    ) -> None:
        driver = make_driver(SlidingWindow.last_messages(4), hook, state, "twice", flavour=flavour)
        for i in range(6):
            driver.add(say("twice", i))
            first = driver.window()
            delivered = len(hook.records())
            assert driver.window() == first
            assert len(hook.records()) == delivered

    def test_clear_resets_history_and_state(
        self, make_driver: MakeDriver, hook: RecordingHook, state: StateStore, flavour: Flavour
    ) -> None:
        driver = make_driver(SlidingWindow.last_messages(4), hook, state, "clr", flavour=flavour)
        _script(driver, hook, 8, "before")
        assert hook.batches
        driver.clear()
        assert driver.all() == []
        assert driver.window() == []
        assert driver.demoter.state_of("clr") == ConversationState(generation=1)  # tombstone
        hook.clear()
        _script(driver, hook, 8, "after")  # demotion starts over from index 0
        assert all("after" in text for _, text, _, _ in hook.records())

    def test_erase_forgets_the_long_tail_too_and_clear_does_not(
        self, make_driver: MakeDriver, hook: RecordingHook, state: StateStore, flavour: Flavour
    ) -> None:
        policy = SlidingWindow.last_messages(4)
        driver = make_driver(policy, hook, state, "era", flavour=flavour)
        other = make_driver(policy, hook, state, "keep", flavour=flavour)
        _script(driver, hook, 6, "first")
        _script(other, hook, 6, "kept")
        kept, kept_window = hook.records("keep"), other.window()
        driver.clear()
        assert hook.records("era"), "clear keeps what the long tail holds"
        hook.erase("era")
        _script(driver, hook, 6, "second")
        history = driver.all()
        report = driver.erase()
        assert report.complete and report.found and len(history) == 12
        assert report.inner is not None and report.inner.kind in ("history", "chat store")
        assert (report.inner.status, report.inner.removed) == ("erased", 12)
        assert [(t.tier, t.removed) for t in report.tiers] == [("RecordingHook", 8)]
        assert report.state.kind == "state" and report.state.removed == 1
        assert report.touched == (report.inner, *report.tiers, report.state)
        assert len(hook.erased_keys["era"]) == 12, "the history's keys reached the tier"
        assert hook.records("era") == [] and driver.all() == [] and driver.window() == []
        assert driver.demoter.state.get("era") is None
        assert hook.records("keep") == kept and other.window() == kept_window
        _script(driver, hook, 6, "third")  # a new conversation under the same id
        assert [i for _, _, i, _ in hook.records("era")] == list(range(8))

    def test_erase_can_keep_the_inner_store(
        self, make_driver: MakeDriver, hook: RecordingHook, state: StateStore, flavour: Flavour
    ) -> None:
        driver = make_driver(SlidingWindow.last_messages(4), hook, state, "kp", flavour=flavour)
        _script(driver, hook, 5, "kp")
        history = driver.all()
        report = driver.erase(inner=False)
        assert report.complete and report.inner is not None
        assert (report.inner.status, report.inner.removed) == ("kept", None)
        assert driver.all() == history and hook.records("kp") == []
        check_window(driver, hook)  # the next read demotes the history again, from 0
        assert [i for _, _, i, _ in hook.records("kp")] == list(range(6))

    def test_erase_of_a_conversation_nothing_knew_says_so(
        self, make_driver: MakeDriver, hook: RecordingHook, state: StateStore, flavour: Flavour
    ) -> None:
        policy = SlidingWindow.last_messages(4)
        known = make_driver(policy, hook, state, "known", flavour=flavour)
        _script(known, hook, 5, "known")
        report = make_driver(policy, hook, state, "never-seen", flavour=flavour).erase()
        assert report.found is False and report.complete
        assert [(t.status, t.removed) for t in report.touched] == [("erased", 0)] * 3
        assert report.state.kind == "state", "named, with nothing removed: not 'deleted'"
        assert hook.records("known") and known.all(), "nothing else was touched"

    # -- window bounds --------------------------------------------------------------------

    @pytest.mark.parametrize("policy_id", list(POLICIES))
    def test_window_bounds(
        self,
        make_driver: MakeDriver,
        hook: RecordingHook,
        state: StateStore,
        flavour: Flavour,
        policy_id: str,
    ) -> None:
        driver = make_driver(POLICIES[policy_id], hook, state, "bounds", flavour=flavour)
        start = _script(driver, hook, 30)
        assert start > 0, "a 30-turn chat must have demoted something"

    @pytest.mark.parametrize("policy_id", ["messages-peritem", "tokens-bulk"])
    def test_pinned_system_kept(
        self,
        make_driver: MakeDriver,
        hook: RecordingHook,
        state: StateStore,
        flavour: Flavour,
        policy_id: str,
    ) -> None:
        driver = make_driver(POLICIES[policy_id], hook, state, "pin", flavour=flavour)
        system = [("system", "you are terse"), ("system", "answer in English")]
        driver.add(system)
        _script(driver, hook, 25)
        assert driver.window()[:2] == system
        assert all(role != "system" for role, *_ in hook.records())

    def test_bulk_prefix_stable_between_cuts(
        self, make_driver: MakeDriver, hook: RecordingHook, state: StateStore, flavour: Flavour
    ) -> None:
        policy = SlidingWindow.last_messages(6, eviction=Bulk(overflow=6))
        driver = make_driver(policy, hook, state, "bulk", flavour=flavour)
        starts = []
        for i in range(20):
            driver.add(say("bulk", i))
            starts.append(check_window(driver, hook))
        cuts = sum(1 for a, b in itertools.pairwise(starts) if a != b)
        assert 0 < cuts <= len(starts) // 3, f"bulk eviction cut too often: {starts}"

    # -- tool exchanges -------------------------------------------------------------------

    def test_tool_groups_never_split(
        self, make_driver: MakeDriver, hook: RecordingHook, state: StateStore, flavour: Flavour
    ) -> None:
        driver = make_driver(SlidingWindow.last_messages(5), hook, state, "tools", flavour=flavour)
        start: int | None = None
        for i in range(12):
            if i % 3 == 1:
                ids = [f"call-{i}-{j}" for j in range(1 + i % 4)]
                driver.add_tool_exchange(f"look up {i}", ids, f"found {i}")
                tail = driver.all()[-(3 + len(ids)) :]
                assert [r for r, _ in tail] == ["user", "assistant"] + ["tool"] * len(ids) + [
                    "assistant"
                ]
                assert tail[0][1] == f"look up {i}" and tail[-1][1] == f"found {i}"
            else:
                driver.add(say("tools", i))
            start = check_window(driver, hook, start)
            kept = driver.window()
            for j, (role, _) in enumerate(kept):
                if role == "tool":
                    assert any(r == "assistant" for r, _ in kept[:j]), "tool result lost its call"

    def test_an_oversized_tool_turn_is_cut_at_steps(
        self, make_driver: MakeDriver, hook: RecordingHook, state: StateStore, flavour: Flavour
    ) -> None:
        # A turn larger than the window is cut at a step boundary, the turn's request kept
        # in front: the four parallel calls and their results leave together.
        driver = make_driver(SlidingWindow.last_messages(3), hook, state, "big", flavour=flavour)
        driver.add(say("big", 0))
        driver.add_tool_exchange("do four things", ["a", "b", "c", "d"], "done")
        check_window(driver, hook)
        window = driver.window()
        assert window[0] == ("user", "do four things") and len(window) <= 3
        assert all(role != "tool" for role, _ in window)

    # -- exactly once, isolation, restarts -----------------------------------------------

    def test_conversations_are_isolated(
        self, make_driver: MakeDriver, hook: RecordingHook, state: StateStore, flavour: Flavour
    ) -> None:
        policy = SlidingWindow.last_messages(4)
        one = make_driver(policy, hook, state, "one", flavour=flavour)
        two = make_driver(policy, hook, state, "two", flavour=flavour)
        for i in range(10):
            one.add(say("one", i))
            two.add(say("two", i))
            check_window(one, hook)
            check_window(two, hook)
        for batch in hook.batches:
            tag = batch.conversation_id
            assert all(m.text.startswith(tag) for m in batch.messages)
        assert all(text.startswith("two") for _, text in two.window())

    def test_restart_does_not_redeliver(
        self, make_driver: MakeDriver, hook: RecordingHook, tmp_path: Path, flavour: Flavour
    ) -> None:
        # One hook across the "restart": check_window then proves nothing came twice.
        policy = SlidingWindow.last_messages(6, eviction=Bulk(overflow=2))
        inner, db = tmp_path / "inner", tmp_path / "state.db"
        with SQLiteStateStore(db) as state:
            driver = make_driver(policy, hook, state, "r", flavour=flavour, persist=inner)
            driver.add([("system", "remember me")])
            _script(driver, hook, 15, "one")
            before, delivered = driver.window(), len(hook.records())
        with SQLiteStateStore(db) as state:
            driver = make_driver(policy, hook, state, "r", flavour=flavour, persist=inner)
            assert driver.window() == before
            assert len(hook.records()) == delivered, "a restart must not re-deliver"
            start: int | None = None
            for i in range(15, 30):
                driver.add(say("two", i))
                start = check_window(driver, hook, start)
        assert len(hook.records()) > delivered, "the restarted memory keeps demoting"

    @pytest.mark.parametrize(
        "bad",
        ["", "nul\x00byte", 42, None, "x" * 20_000],
        ids=["empty", "nul", "int", "none", "long"],
    )
    def test_bad_conversation_id(
        self,
        make_driver: MakeDriver,
        hook: RecordingHook,
        state: StateStore,
        flavour: Flavour,
        bad: object,
    ) -> None:
        with pytest.raises(ConversationIdError):
            driver = make_driver(SlidingWindow.last_messages(2), hook, state, bad, flavour=flavour)  # type: ignore[arg-type]
            driver.add(say("bad", 0) + say("bad", 1))
            driver.window()
        assert state.count() == 0
        assert hook.batches == []

    # -- sync and async agree -------------------------------------------------------------

    @pytest.mark.parametrize("policy_id", ["messages-bulk", "tokens-peritem"])
    def test_async_equals_sync(self, make_driver: MakeDriver, policy_id: str) -> None:
        runs = []
        for flavour in ("sync", "async"):
            hook = RecordingHook()
            driver = make_driver(
                POLICIES[policy_id], hook, InMemoryStateStore(), "same", flavour=flavour
            )
            windows = []
            driver.add([("system", "pinned")])
            for i in range(16):
                if i % 5 == 2:
                    driver.add_tool_exchange(f"tool {i}", [f"c{i}"], f"ok {i}")
                else:
                    driver.add(say("same", i))
                windows.append(driver.window())
                if i == 10:
                    driver.clear()
            runs.append((windows, hook.records(), driver.all()))
        assert runs[0] == runs[1]
