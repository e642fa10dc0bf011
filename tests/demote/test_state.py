"""State stores: InMemoryStateStore and SQLiteStateStore behave the same."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from demote import (
    ConversationState,
    DemoteError,
    InMemoryStateStore,
    SQLiteStateStore,
    StateStore,
    StoreError,
)

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


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    s: StateStore = (
        InMemoryStateStore() if request.param == "memory" else SQLiteStateStore(tmp_path / "s.db")
    )
    yield s
    s.close()


def test_is_a_state_store(store: StateStore) -> None:
    assert isinstance(store, StateStore)


def test_get_cas_delete_count(store: StateStore) -> None:
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


def test_cas_fails_on_mismatch(store: StateStore) -> None:
    assert store.compare_and_set("a", None, S1)
    assert not store.compare_and_set("a", None, S2), "already exists"
    assert not store.compare_and_set("a", S2, S1), "stale expectation"
    assert store.get("a") == S1
    assert not store.compare_and_set("missing", S1, S2)
    assert store.get("missing") is None


def test_every_field_round_trips(store: StateStore) -> None:
    odd = ConversationState(summary="ünï\n'quote\"; DROP", anchor=None, generation=2**40)
    assert store.compare_and_set("x", None, odd)
    assert store.get("x") == odd


def test_only_one_of_many_racing_cas_wins(store: StateStore) -> None:
    assert store.compare_and_set("a", None, S1)
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def racer(n: int) -> None:
        barrier.wait(5)
        if store.compare_and_set("a", S1, ConversationState(window_start=100 + n)):
            wins.append(n)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(wins) == 1
    assert store.get("a") == ConversationState(window_start=100 + wins[0])


def test_sqlite_persists_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SQLiteStateStore(path) as s:
        assert s.compare_and_set("a", None, S2)
    with SQLiteStateStore(path) as s:
        assert s.get("a") == S2 and s.count() == 1
        assert s.conversations() == ["a"]


def test_two_connections_to_one_file_only_one_cas_wins(tmp_path: Path) -> None:
    """Two processes simulated by two store objects on the same file."""
    path = tmp_path / "s.db"
    one, two = SQLiteStateStore(path), SQLiteStateStore(path)
    try:
        assert one.compare_and_set("a", None, S1)
        assert two.get("a") == S1
        results: dict[str, bool] = {}
        barrier = threading.Barrier(2)

        def go(name: str, s: SQLiteStateStore, new: ConversationState) -> None:
            barrier.wait(5)
            results[name] = s.compare_and_set("a", S1, new)

        a = threading.Thread(target=go, args=("one", one, S2))
        b = threading.Thread(target=go, args=("two", two, ConversationState(window_start=1)))
        a.start(), b.start()
        a.join(10), b.join(10)
        assert sorted(results.values()) == [False, True]
        winner = S2 if results["one"] else ConversationState(window_start=1)
        assert one.get("a") == two.get("a") == winner
        # The loser re-reads and sees the winner's state.
        assert not two.compare_and_set("a", None, S1)
    finally:
        one.close()
        two.close()


def test_sqlite_bad_path_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as info:
        SQLiteStateStore(tmp_path / "no" / "such" / "dir" / "s.db")
    assert isinstance(info.value, DemoteError)
    assert "no" in str(info.value)
    (tmp_path / "adir").mkdir()
    with pytest.raises(StoreError):
        SQLiteStateStore(tmp_path / "adir")


def test_sqlite_closed_store_is_a_store_error(tmp_path: Path) -> None:
    s = SQLiteStateStore(tmp_path / "s.db")
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        s.get("a")


def test_sqlite_ids_are_parameters_not_sql(tmp_path: Path) -> None:
    with SQLiteStateStore(tmp_path / "s.db") as s:
        evil = "a'); DROP TABLE demote_state; --"
        assert s.compare_and_set(evil, None, S1)
        assert s.compare_and_set("b", None, S2)
        assert s.get(evil) == S1 and s.count() == 2
        s.delete(evil)
        assert s.conversations() == ["b"]
