"""The state store contract, run against every store, sync and async.

One suite (see ``conftest.stores``): InMemory, SQLite, Redis and Postgres, each through
its sync methods and through its async twins. What one store does, all do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from demote import ConversationState
from demote.errors import ConfigError, ConversationIdError, StoreError
from demote.state.base import (
    AsyncStateStore,
    Lease,
    LeasingStateStore,
    StateStore,
    tombstone,
)
from tests.demote.state.conftest import Facade

Stores = Callable[[], Facade]

S1 = ConversationState(window_start=4, delivered=4, pinned=1, anchor="ab" * 16)
S2 = ConversationState(
    window_start=9,
    delivered=7,
    pinned=1,
    anchor="cd" * 16,
    summary="they talked",
    summarized=2,
    offset=1,
    generation=3,
)


def state(n: int) -> ConversationState:
    return ConversationState(window_start=n, delivered=n, anchor=f"a{n}")


def is_durable(store: Facade) -> bool:
    return not getattr(store.store, "nonblocking", False)


def test_speaks_the_protocol(stores: Stores) -> None:
    store = stores().store
    assert isinstance(store, StateStore) and isinstance(store, LeasingStateStore)
    assert isinstance(store, AsyncStateStore) or store.nonblocking


def test_get_cas_delete_count(stores: Stores) -> None:
    store = stores()
    assert store.get("a") is None and store.count() == 0
    assert store.compare_and_set("a", None, S1)
    assert store.get("a") == S1 and store.count() == 1
    assert store.compare_and_set("a", S1, S2)
    assert store.get("a") == S2
    assert store.compare_and_set("b", None, S1)
    assert store.count() == 2
    store.delete("a")
    assert store.get("a") is None and store.get("b") == S1 and store.count() == 1
    store.delete("a")  # idempotent
    assert store.count() == 1


def test_cas_refuses_a_stale_expectation(stores: Stores) -> None:
    store = stores()
    assert store.compare_and_set("a", None, S1)
    assert not store.compare_and_set("a", None, S2), "already exists"
    assert not store.compare_and_set("a", S2, S1), "stale expectation"
    assert store.get("a") == S1
    assert not store.compare_and_set("missing", S1, S2)
    assert store.get("missing") is None and store.count() == 1


def test_every_field_round_trips(stores: Stores) -> None:
    store = stores()
    odd = ConversationState(summary="ünï\n'quote\"; DROP %s", anchor=None, generation=2**40)
    assert store.compare_and_set("x", None, odd)
    assert store.get("x") == odd
    assert store.compare_and_set("x", odd, S2)


def test_only_one_of_many_racing_cas_wins_across_store_objects(stores: Stores) -> None:
    first = stores()
    assert first.compare_and_set("a", None, S1)
    racers = [stores() for _ in range(2)] + [first]
    wins: list[int] = []
    barrier = threading.Barrier(6)

    def racer(n: int) -> None:
        barrier.wait(10)
        if racers[n % 3].compare_and_set("a", S1, state(100 + n)):
            wins.append(n)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(wins) == 1
    assert first.get("a") == state(100 + wins[0])


def test_clear_leaves_a_tombstone_one_generation_on(stores: Stores) -> None:
    store = stores()
    assert store.clear("new") == tombstone(None) == ConversationState(generation=1)
    assert store.compare_and_set("a", None, S2)
    tomb = store.clear("a")
    assert tomb == tombstone(S2) == ConversationState(generation=S2.generation + 1)
    assert store.get("a") == tomb and store.count() == 2  # a tombstone is state
    assert not store.compare_and_set("a", S2, S1), "the cleared state is gone"
    assert store.clear("a") == ConversationState(generation=S2.generation + 2)
    assert store.compare_and_set("a", ConversationState(generation=5), S1)
    store.delete("a")
    assert store.clear("a") == ConversationState(generation=1), "delete forgets the generation"


def test_lease_is_exclusive_until_released(stores: Stores) -> None:
    a, b = stores(), stores()
    lease = a.acquire_lease("c", "worker-a", 30)
    assert isinstance(lease, Lease) and lease.holder == "worker-a" and lease.conversation_id == "c"
    assert b.acquire_lease("c", "worker-b", 30) is None
    assert a.acquire_lease("c", "worker-a", 30) is None, "not re-entrant"
    b.release_lease(Lease("c", "worker-b", lease.token))  # not b's: no effect
    b.release_lease(Lease("c", "worker-a", lease.token + 1))  # wrong token: no effect
    assert b.acquire_lease("c", "worker-b", 30) is None
    assert b.acquire_lease("other", "worker-b", 30) is not None, "per conversation"
    a.release_lease(lease)
    assert b.acquire_lease("c", "worker-b", 30) is not None


def test_lease_carries_the_state_read_with_the_grant(stores: Stores) -> None:
    store = stores()
    first = store.acquire_lease("c", "w", 30)
    assert first is not None and first.state is None
    assert store.compare_and_set("c", None, S1, lease=first, release=True)
    second = store.acquire_lease("c", "w", 30)
    assert second is not None and second.state == S1


def test_lease_expires(stores: Stores) -> None:
    a, b = stores(), stores()
    lease = a.acquire_lease("c", "worker-a", 0.2)
    assert lease is not None and b.acquire_lease("c", "worker-b", 30) is None
    deadline = time.monotonic() + 5
    taken = None
    while taken is None and time.monotonic() < deadline:
        time.sleep(0.05)
        taken = b.acquire_lease("c", "worker-b", 30)
    assert taken is not None and taken.token > lease.token
    assert not a.renew_lease(lease, 30), "renewing a lease someone else holds"


def test_renew_extends_and_fails_after_expiry(stores: Stores) -> None:
    a, b = stores(), stores()
    lease = a.acquire_lease("c", "worker-a", 0.5)
    assert lease is not None
    for _ in range(4):  # 1.2 s in all: well past the first ttl
        time.sleep(0.3)
        assert a.renew_lease(lease, 0.5)
        assert b.acquire_lease("c", "worker-b", 30) is None
    time.sleep(0.8)
    assert not a.renew_lease(lease, 30), "expired: renewing must not revive it"
    assert b.acquire_lease("c", "worker-b", 30) is not None


def test_renew_fails_after_release_and_after_clear(stores: Stores) -> None:
    store = stores()
    lease = store.acquire_lease("c", "w", 30)
    assert lease is not None
    store.release_lease(lease)
    assert not store.renew_lease(lease, 30)
    again = store.acquire_lease("c", "w", 30)
    assert again is not None
    store.clear("c")
    assert not store.renew_lease(again, 30), "clear revokes the lease"
    assert store.acquire_lease("c", "w2", 30) is not None


def test_fencing_tokens_strictly_increase_across_conversations_clear_and_delete(
    stores: Stores,
) -> None:
    a, b = stores(), stores()
    tokens: list[int] = []
    for round_ in range(3):
        for i, cid in enumerate(["x", "y", "z"]):
            store = (a, b)[(round_ + i) % 2]
            lease = store.acquire_lease(cid, f"w{i}", 30)
            assert lease is not None
            tokens.append(lease.token)
            if round_ == 0:
                store.release_lease(lease)
            elif round_ == 1:
                store.clear(cid)
            else:
                store.delete(cid)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens


def test_fenced_cas_succeeds_only_while_the_lease_holds(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.compare_and_set("c", None, S1)
    lease = a.acquire_lease("c", "worker-a", 30)
    assert lease is not None and lease.state == S1
    assert a.compare_and_set("c", S1, state(5), lease=lease)
    assert not a.compare_and_set("c", S1, state(6), lease=lease), "the comparison still counts"
    stranger = Lease("c", "worker-b", lease.token)
    assert not b.compare_and_set("c", state(5), state(6), lease=stranger)
    assert a.get("c") == state(5)


def test_fenced_cas_refused_after_expiry(stores: Stores) -> None:
    store = stores()
    assert store.compare_and_set("c", None, S1)
    lease = store.acquire_lease("c", "w", 0.2)
    assert lease is not None
    time.sleep(0.5)
    assert not store.compare_and_set("c", S1, S2, lease=lease), "expired, though nobody took it"
    assert store.get("c") == S1


def test_fenced_cas_refused_after_clear(stores: Stores) -> None:
    a, b = stores(), stores()
    lease = a.acquire_lease("c", "w", 30)
    assert lease is not None
    tomb = b.clear("c")
    assert not a.compare_and_set("c", tomb, S1, lease=lease), "the lease went with the clear"
    assert a.get("c") == tomb


def test_fenced_cas_refused_after_another_holder_took_over(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.compare_and_set("c", None, S1)
    old = a.acquire_lease("c", "worker-a", 0.2)
    assert old is not None
    time.sleep(0.5)
    new = b.acquire_lease("c", "worker-b", 30)
    assert new is not None and new.token > old.token and new.state == S1
    assert not a.compare_and_set("c", S1, S2, lease=old, release=True)
    assert b.acquire_lease("c", "worker-c", 30) is None, "the old holder's release is a no-op"
    assert b.compare_and_set("c", S1, S2, lease=new, release=True)
    assert b.get("c") == S2


def test_release_in_the_same_step_as_the_commit(stores: Stores) -> None:
    a, b = stores(), stores()
    lease = a.acquire_lease("c", "worker-a", 30)
    assert lease is not None
    assert a.compare_and_set("c", None, S1, lease=lease, release=True)
    assert not a.renew_lease(lease, 30), "released with the commit"
    again = b.acquire_lease("c", "worker-b", 30)
    assert again is not None
    assert not b.compare_and_set("c", S2, S1, lease=again, release=True), "stale expectation"
    assert a.acquire_lease("c", "worker-a", 30) is not None, "released even though refused"
    assert a.get("c") == S1


def test_unfenced_cas_ignores_leases(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.acquire_lease("c", "worker-a", 30) is not None
    assert b.compare_and_set("c", None, S1)
    assert a.get("c") == S1


ODD_IDS = [
    "quo'te\"s",
    "100%;drop table x;--",
    "%s %(id)s {}",
    "../../etc/passwd",
    "a:b:lease:c*?[x]",
    "é" * 3000,
    "e\u0301",  # a decomposed é: not the same id as the composed one
    "\ud800lone",
    "tab\tnew\nline",
]


@pytest.mark.parametrize("cid", ODD_IDS, ids=range(len(ODD_IDS)))
def test_odd_ids_round_trip_or_are_refused_typed(stores: Stores, cid: str) -> None:
    store = stores()
    assert store.compare_and_set("é", None, S2)
    try:
        assert store.compare_and_set(cid, None, S1)
    except (ConversationIdError, StoreError):
        assert "\ud800" in cid, "only ids that are not valid Unicode text may be refused"
        assert store.count() == 1 and store.get("é") == S2
        return
    assert store.get(cid) == S1 and store.get("é") == S2 and store.count() == 2
    lease = store.acquire_lease(cid, "w", 30)
    assert lease is not None and lease.state == S1
    assert store.compare_and_set(cid, S1, state(2), lease=lease, release=True)
    assert store.clear(cid) == ConversationState(generation=1)
    store.delete(cid)
    assert store.get(cid) is None and store.get("é") == S2 and store.count() == 1


@pytest.mark.parametrize("bad", ["", 42, None, "nul\x00byte", "x" * 16_385])
def test_every_store_refuses_unusable_ids_typed(stores: Stores, bad: Any) -> None:
    store = stores()
    for call in (
        lambda: store.get(bad),
        lambda: store.compare_and_set(bad, None, S1),
        lambda: store.acquire_lease(bad, "w", 30),
        lambda: store.clear(bad),
    ):
        with pytest.raises(ConversationIdError):
            call()
    assert store.count() == 0


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), "30", None, True])
def test_every_store_refuses_a_bad_ttl(stores: Stores, ttl: Any) -> None:
    store = stores()
    with pytest.raises(ConfigError, match="ttl"):
        store.acquire_lease("c", "w", ttl)
    lease = store.acquire_lease("c", "w", 30)
    assert lease is not None
    with pytest.raises(ConfigError, match="ttl"):
        store.renew_lease(lease, ttl)
    assert store.renew_lease(lease, 30)
