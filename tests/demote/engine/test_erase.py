"""Demoter.erase: state and every tier, reported; races with deliveries in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from demote import (
    CallbackHook,
    ConfigError,
    ConversationState,
    Demoter,
    Demotion,
    FanOutHook,
    InMemoryStateStore,
    SlidingWindow,
)
from demote.erase import TierReport
from demote.records import make_key
from tests.strategies import Msg, describer, unique

LAST2 = SlidingWindow.last_messages(2)


class Tier:
    """A key-keyed long tail that erases, and refuses writers older than its last erase."""

    def __init__(self, *, fencing: bool = True) -> None:
        self.rows: dict[str, tuple[str, int]] = {}
        self.fencing = fencing
        self.erased_at: dict[str, int] = {}
        self.erased_keys: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def deliver(self, batch: Demotion) -> None:
        self.entered.set()
        assert self.gate.wait(10)
        cid = batch.conversation_id
        if self.fencing and batch.fence is not None and batch.fence < self.erased_at.get(cid, 0):
            raise RuntimeError(f"stale writer: fence {batch.fence}")
        for m in batch.messages:
            self.rows[m.key] = (cid, m.index)

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        if fence is not None:
            self.erased_at[conversation_id] = fence
        self.erased_keys = list(keys or ())
        mine = [k for k, (c, _) in self.rows.items() if c == conversation_id]
        for k in mine:
            del self.rows[k]
        return len(mine)

    def of(self, cid: str) -> list[int]:
        return sorted(i for c, i in self.rows.values() if c == cid)


def chat(n: int, tag: str = "") -> list[Msg]:
    return unique([Msg(("user", "assistant")[i % 2], f"m{i}") for i in range(n)], tag)


def test_erase_removes_the_state_and_every_tier_and_reports_each() -> None:
    a, b = Tier(), Tier()
    calls: list[int] = []
    hook = FanOutHook(a, FanOutHook(b, CallbackHook(lambda batch: calls.append(len(batch)))))
    d = Demoter(LAST2, hook)
    msgs, other = chat(10, "c"), chat(10, "o")
    d.load("c", msgs, describer(d))
    d.load("other", other, describer(d))
    assert a.of("c") == list(range(8)) and b.of("c") == list(range(8))
    report = d.erase("c", messages=msgs, describe=describer(d))
    assert report.tiers == (
        TierReport("FanOutHook[0].Tier", "erased", 8),
        TierReport("FanOutHook[1].FanOutHook[0].Tier", "erased", 8),
        TierReport("FanOutHook[1].FanOutHook[1].CallbackHook", "unsupported"),
    )
    assert not report.complete and report.state and not report.took_over
    assert a.of("c") == [] and b.of("c") == []
    assert a.erased_keys == [
        make_key("c", i, describer(d)(m).fingerprint) for i, m in enumerate(msgs)
    ]
    assert d.state.get("c") is None, "no tombstone: the state's bytes are gone"
    assert a.of("other") == list(range(8)) and d.state_of("other").delivered == 8
    # The conversation can start over.
    fresh = chat(4, "fresh")
    assert d.load("c", fresh, describer(d)).demoted == 2


def test_a_failing_tier_is_reported_and_the_others_still_erase() -> None:
    class Broken(Tier):
        def erase(self, conversation_id: str, **kw: Any) -> int:
            raise OSError("disk gone")

    good = Tier()
    d = Demoter(LAST2, FanOutHook(Broken(), good))
    d.load("c", chat(6), describer(d))
    report = d.erase("c")
    assert [t.status for t in report.tiers] == ["failed", "erased"]
    assert "disk gone" in (report.tiers[0].error or "")
    assert good.of("c") == [] and d.state.get("c") is None


def test_erase_waits_for_a_delivery_in_flight_so_no_row_is_left_behind() -> None:
    tier = Tier()
    tier.gate.clear()
    d = Demoter(LAST2, tier)
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("w", d.load("c", chat(10), describer(d))))
    t.start()
    assert tier.entered.wait(5)
    threading.Timer(0.3, tier.gate.set).start()  # the delivery ends while erase waits
    began = time.monotonic()
    report = d.erase("c")
    t.join(5)
    assert report.complete and time.monotonic() - began >= 0.2
    assert tier.of("c") == [], "the delivery in flight landed before the erase, not after"
    assert d.state.get("c") is None


def test_a_delivery_that_outlives_the_wait_is_fenced_out() -> None:
    store = InMemoryStateStore()
    tier = Tier()
    tier.gate.clear()
    worker = Demoter(LAST2, tier, state=store)  # another worker, mid-delivery
    admin = Demoter(LAST2, tier, state=store)
    t = threading.Thread(target=lambda: worker.load("c", chat(10), describer(worker)))
    t.start()
    assert tier.entered.wait(5)
    report = admin.erase("c", wait=0.1)
    assert report.took_over and not report.complete
    tier.gate.set()  # the late write arrives with the revoked, older token
    t.join(5)
    assert tier.of("c") == [], "refused by its fence"
    assert store.get("c") is None, "and its commit refused by the revoked lease"


async def test_aerase() -> None:
    tier = Tier()
    d = Demoter(LAST2, tier)
    await d.aload("c", chat(8), describer(d))
    report = await d.aerase("c")
    assert report.complete and tier.of("c") == []
    assert await d.astate_of("c") == ConversationState()


def test_erase_needs_both_messages_and_describe() -> None:
    d = Demoter(LAST2)
    with pytest.raises(ConfigError, match="describe"):
        d.erase("c", messages=chat(2))


def test_also_erases_another_holder_after_the_hook_with_the_same_fence_and_keys() -> None:
    store = InMemoryStateStore()
    hook, capture = Tier(), Tier()
    d = Demoter(LAST2, hook, state=store)
    Demoter(LAST2, hook, state=store)  # a second one sharing the store: leases, fences
    msgs = chat(6, "c")
    d.load("c", msgs, describer(d))
    capture.rows["k"] = ("c", 0)  # what a capture sink (mem0's extractor) holds of it
    capture.rows["j"] = ("other", 0)
    report = d.erase("c", messages=msgs, describe=describer(d), also=(FanOutHook(capture),))
    assert report.tiers == (
        TierReport("Tier", "erased", 4),
        TierReport("FanOutHook[0].Tier", "erased", 1),
    )
    assert capture.of("c") == [] and capture.of("other") == [0]
    assert capture.erased_keys == hook.erased_keys and len(hook.erased_keys) == 6
    assert capture.erased_at["c"] == hook.erased_at["c"] > 0


def test_conversation_hash_names_a_conversation_without_its_id() -> None:
    from demote.erase import conversation_hash

    h = conversation_hash("user-42")
    assert len(h) == 32 and "user-42" not in h and h == conversation_hash("user-42")
    assert h != conversation_hash("user-43")
    assert len(conversation_hash("\ud800")) == 32  # a lone surrogate hashes too


def test_keys_given_reach_the_tiers_with_those_derived_from_the_messages() -> None:
    tier = Tier()
    d = Demoter(LAST2, tier)
    msgs = chat(4, "c")
    d.load("c", msgs, describer(d))
    d.erase("c", keys=["pruned-1", "pruned-2"])
    assert tier.erased_keys == ["pruned-1", "pruned-2"]
    derived = [make_key("c", i, describer(d)(m).fingerprint) for i, m in enumerate(msgs)]
    d.erase("c", messages=msgs, describe=describer(d), keys=[derived[0], "pruned-1"])
    assert tier.erased_keys == [*derived, "pruned-1"]


# -- what the report names -------------------------------------------------------------------


@pytest.mark.parametrize("shared", [False, True], ids=["gate", "lease"])
def test_the_report_names_the_state_among_the_tiers_it_touched(shared: bool) -> None:
    store = InMemoryStateStore()
    tier = Tier()
    d = Demoter(LAST2, tier, state=store)
    if shared:  # a second Demoter on the store: the erase takes the conversation's lease
        Demoter(LAST2, tier, state=store)
    d.load("c", chat(6), describer(d))
    report = d.erase("c")
    assert report.state == TierReport("InMemoryStateStore", "erased", 1, kind="state")
    assert report.tiers == (TierReport("Tier", "erased", 4),)
    assert report.touched == (*report.tiers, report.state), "the long tail, then the state"
    assert report.inner is None, "the engine alone has no inner store"
    assert report.found is True and report.complete


def test_an_id_nothing_knew_is_reported_as_such_not_as_deleted() -> None:
    tier = Tier()
    d = Demoter(LAST2, tier)
    d.load("known", chat(6), describer(d))
    report = d.erase("never-seen-id")
    assert report.state == TierReport("InMemoryStateStore", "erased", 0, kind="state")
    assert report.tiers == (TierReport("Tier", "erased", 0),)
    assert report.found is False, "every tier counted, none held it"
    assert report.complete, "nothing is left behind: the erase itself is complete"
    assert tier.of("known") == [0, 1, 2, 3]
    cleared = d.erase("known")  # and one that was known
    assert cleared.found is True and cleared.state.removed == 1


def test_found_is_unknown_when_a_tier_cannot_count_or_cannot_erase() -> None:
    class Uncounted(Tier):
        def erase(self, conversation_id: str, **kw: Any) -> int | None:  # type: ignore[override]
            super().erase(conversation_id, **kw)
            return None

    d = Demoter(LAST2, Uncounted())
    assert d.erase("nobody").found is None, "a tier that cannot count may have held it"
    d = Demoter(LAST2, print)
    report = d.erase("nobody")
    assert report.tiers == (TierReport("CallbackHook", "unsupported"),)
    assert report.found is None and not report.complete


def test_a_state_store_that_fails_to_delete_is_a_failed_tier_after_the_long_tail() -> None:
    class Failing(InMemoryStateStore):
        def delete(self, conversation_id: str) -> None:
            raise OSError("state disk gone")

    tier = Tier()
    d = Demoter(LAST2, tier, state=Failing())
    d.load("c", chat(6), describer(d))
    report = d.erase("c")
    assert report.tiers == (TierReport("Tier", "erased", 4),), "the long tail still erased"
    assert report.state.status == "failed" and report.state.kind == "state"
    assert "state disk gone" in (report.state.error or "")
    assert not report.complete and report.found is True
