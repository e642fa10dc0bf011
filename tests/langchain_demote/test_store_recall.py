"""StoreRecall: the items StoreHook wrote, read back for one conversation.

Without an index the store's items are ranked exactly as the SQLite archive ranks the
same messages (the same hits, in the same order, within the same budget); with an index
the store's own semantic search ranks them. Either way only the asked conversation's
items in its own namespace come back, the in-memory copy follows what the store holds
(new items, deleted ones), ``fetch`` finds a key of the conversation only, the async
twins answer alike, and ``StoreRecall()`` reads the running graph's store.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.store.memory import InMemoryStore
from typing_extensions import TypedDict

from demote import Demoter, FanOutHook, SlidingWindow, SQLiteArchive
from demote.errors import ArgumentTypeError, ConfigError, ConversationIdError, DemoteError
from demote.records import DemotedMessage, Demotion, Recalled
from langchain_demote import StoreHook, StoreRecall
from tests.langchain_demote.test_store_hook import (
    CountingStore,
    Words,
    indexed_store,
    items,
    load,
    snapshot,
    thread,
)

QUERIES = [
    "what was the weather in city3?",
    "rain degrees",
    "question 7",
    "lookup city5",
    "forecast",
    "nothing matches zebra",
]


def _hits(hits: list[Recalled]) -> list[tuple[str, int, str, str]]:
    return [(h.key, h.index, h.role, h.text) for h in hits]


def _filled(store: InMemoryStore, tmp_path: Path) -> tuple[Demoter, SQLiteArchive]:
    """Twelve turns demoted from "t" into the store and, the same batches, an archive."""
    archive = SQLiteArchive(tmp_path / "archive.db")
    hook = FanOutHook(StoreHook(store), archive)
    demoter = Demoter(SlidingWindow.last_messages(4), hook, hook_wait=None)
    load(demoter, "t", thread(12))
    return demoter, archive


@pytest.mark.parametrize("budget", [None, 40])
def test_without_an_index_the_items_rank_as_the_archive_ranks_them(
    tmp_path: Path, budget: int | None
) -> None:
    store = InMemoryStore()
    _, archive = _filled(store, tmp_path)
    recall = StoreRecall(store)
    assert archive.count("t") == len(items(store)) == 44
    for query in QUERIES:
        expected = archive.search("t", query, k=3, budget_tokens=budget)
        assert _hits(recall.search("t", query, k=3, budget_tokens=budget)) == _hits(expected)
        assert _hits(asyncio.run(recall.asearch("t", query, 3, budget_tokens=budget))) == _hits(
            expected
        )
    top = recall.search("t", "what was the weather in city3?", k=1)[0]
    assert top.text == 'lookup {"city": "city3"}'  # the call, lifted by its question
    assert top.data is not None and top.data["tool_calls"][0]["args"] == {"city": "city3"}
    assert top.at == next(i for i in items(store) if i.key == top.key).created_at.timestamp()


def test_with_an_index_the_stores_semantic_search_ranks_them(tmp_path: Path) -> None:
    embeddings = Words()
    store = indexed_store(embeddings)
    _, archive = _filled(store, tmp_path)
    recall = StoreRecall(store)
    hits = recall.search("t", "forecast city5 rain degrees", k=3)
    assert hits[0].text == "Forecast for city5: rain, 15 degrees"
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    expected = store.search(("demote", "t"), query="forecast city5 rain degrees", limit=3)
    assert [(h.key, h.score) for h in hits] == [(i.key, i.score) for i in expected]
    assert _hits(asyncio.run(recall.asearch("t", "forecast city5 rain degrees", 3))) == _hits(hits)
    # The budget cuts the best hits as the archives do: one that does not fit is skipped.
    cut = recall.search("t", "forecast city5 rain degrees", k=3, budget_tokens=10)
    assert sum(len(h.text) // 4 + (len(h.text) % 4 > 0) for h in cut) <= 10
    assert cut and set(_hits(cut)) <= set(_hits(hits))
    # The same store ranked lexically is the archive's ranking again.
    lexical = StoreRecall(store, ranking="lexical")
    for query in QUERIES:
        assert _hits(lexical.search("t", query, k=3)) == _hits(archive.search("t", query, k=3))


def test_only_the_conversations_own_items_in_its_own_namespace_come_back() -> None:
    store = InMemoryStore()
    per_user = lambda cid: ("users", cid.split("/")[0])  # noqa: E731
    hook = StoreHook(store, namespace=per_user)
    for cid in ("ann/1", "ann/2", "bob/1"):
        hook.deliver(
            Demotion(
                cid,
                tuple(DemotedMessage("user", f"the secret is {cid}", i, f"k{i}") for i in range(3)),
            )
        )
    # Items that are not this conversation's own, where a prefix search reaches them.
    store.put(
        ("users", "ann", "ann/1", "deeper"),
        "x",
        {"conversation_id": "ann/1", "role": "user", "text": "the secret is deeper", "index": 9},
    )
    store.put(("users", "ann", "ann/1"), "notes", {"text": "the secret is a user note"})
    recall = StoreRecall(store, namespace=per_user)
    for ranking in ("auto", "lexical"):
        hits = StoreRecall(store, namespace=per_user, ranking=ranking).search(
            "ann/1", "secret", k=10
        )  # type: ignore[arg-type]
        assert {h.text for h in hits} == {"the secret is ann/1"}
        assert len(hits) == 3
    assert recall.search("bob/1", "secret ann", k=10)[0].text == "the secret is bob/1"
    assert all(h.text == "the secret is bob/1" for h in recall.search("bob/1", "ann", k=10))
    assert recall.search("carl/1", "secret") == []
    # A store with an index: the same scoping.
    indexed = indexed_store()
    hook = StoreHook(indexed)
    for cid in ("a", "b"):
        hook.deliver(Demotion(cid, (DemotedMessage("user", f"the secret is {cid}", 0, "k"),)))
    assert _hits(StoreRecall(indexed).search("a", "the secret is b", k=5)) == [
        ("k", 0, "user", "the secret is a")
    ]


def test_fetch_finds_a_key_of_the_conversation_only() -> None:
    store = InMemoryStore()
    hook = StoreHook(store)
    data = {"role": "tool", "text": "42 rows", "tool_call_id": "c1", "tool": "sql"}
    hook.deliver(Demotion("a", (DemotedMessage("tool", "42 rows", 5, "ka", data=data),)))
    hook.deliver(Demotion("b", (DemotedMessage("user", "other", 0, "kb"),)))
    recall = StoreRecall(store)
    found = recall.fetch("a", "ka")
    assert found is not None and (found.index, found.text, found.data) == (5, "42 rows", data)
    assert asyncio.run(recall.afetch("a", "ka")) == found
    assert recall.fetch("a", "kb") is None and recall.fetch("b", "ka") is None
    assert recall.fetch("a", "") is None and recall.fetch("a", "k\x00") is None
    with pytest.raises(ArgumentTypeError, match="key"):
        recall.fetch("a", 3)  # type: ignore[arg-type]


def test_the_lexical_copy_follows_what_the_store_holds() -> None:
    store = InMemoryStore()
    hook = StoreHook(store)
    recall = StoreRecall(store, cached_conversations=2)

    def say(cid: str, i: int, text: str) -> None:
        hook.deliver(Demotion(cid, (DemotedMessage("user", text, i, f"k{i}"),)))

    say("c", 0, "the boat is red")
    assert [h.text for h in recall.search("c", "boat")] == ["the boat is red"]
    say("c", 1, "the boat sank")  # written after the copy was made
    assert {h.text for h in recall.search("c", "boat")} == {"the boat is red", "the boat sank"}
    store.delete(("demote", "c"), "k0")  # deleted by hand
    assert [h.text for h in recall.search("c", "boat")] == ["the boat sank"]
    mirror = recall._mirrors[store]
    for cid in ("d", "e"):  # two more conversations: "c" is the least recently searched
        say(cid, 0, f"boat {cid}")
        recall.search(cid, "boat")
    assert mirror.archive.conversations() == ["d", "e"]
    assert [h.text for h in recall.search("c", "boat")] == ["the boat sank"]  # copied again
    assert mirror.archive.conversations() == ["c", "e"]  # "d" went to make room
    recall.forget("c")
    assert mirror.archive.conversations() == ["e"]
    recall.close()
    assert [h.text for h in recall.search("d", "boat")] == ["boat d"]


def grow_and_search(store: Any) -> None:
    """Items written after each search, across positions 9 -> 10 and 99 -> 100, are found
    by the next one (a store whose filters compare text must compare positions right)."""
    hook = StoreHook(store)
    recall = StoreRecall(store)

    def say(start: int, stop: int, word: str) -> None:
        batch = [
            DemotedMessage("user", f"{word} number {i}", i, f"k{i}") for i in range(start, stop)
        ]
        hook.deliver(Demotion("c", tuple(batch)))

    say(0, 9, "apple")
    assert [h.index for h in recall.search("c", "apple number 3", k=1)] == [3]
    for start, word in [(9, "pear"), (11, "plum"), (99, "fig"), (101, "kiwi")]:
        say(start, start + 2, word)
        hits = recall.search("c", word, k=2)
        assert sorted(h.index for h in hits) == [start, start + 1], word


def test_a_search_lists_only_what_was_written_since_the_one_before() -> None:
    store = CountingStore()
    grow_and_search(store)
    assert store.listings[0] == {"conversation_id": "c"}  # the first: the whole namespace
    after = [f.get("position") for f in store.listings[1:]]
    assert after == [{"$gt": f"{n:016d}"} for n in (8, 10, 12, 100)]
    # relist=0: the whole namespace at every search.
    store.listings.clear()
    StoreRecall(store, relist=0).search("c", "fig")
    StoreRecall(store, relist=0).search("c", "fig")
    assert store.listings == [{"conversation_id": "c"}] * 2


def test_a_hit_gone_from_the_store_is_never_returned() -> None:
    store = InMemoryStore()
    hook = StoreHook(store)
    recall = StoreRecall(store)
    hook.deliver(
        Demotion("c", tuple(DemotedMessage("user", f"secret {i}", i, f"k{i}") for i in range(4)))
    )
    assert len(recall.search("c", "secret", k=10)) == 4
    for i in range(4):  # erased elsewhere (another process): not through this hook
        store.delete(("demote", "c"), f"k{i}")
    assert recall.search("c", "secret", k=10) == []
    assert recall._mirrors[store].archive.count("c") == 0  # the copy started over


def test_nothing_to_search_is_no_hit() -> None:
    store = InMemoryStore()
    StoreHook(store).deliver(Demotion("c", (DemotedMessage("user", "hello", 0, "k"),)))
    recall = StoreRecall(store)
    assert recall.search("c", "hello", k=0) == []
    assert recall.search("c", "   ") == []
    assert recall.search("c", "hello", budget_tokens=0) == []
    assert recall.search("c", "the of and") == []  # only stop words


class _State(TypedDict):
    query: str
    hits: list[str]


def _graph(recall: StoreRecall, store: InMemoryStore | None) -> Any:
    def sync_node(state: _State) -> dict[str, Any]:
        return {"hits": [h.text for h in recall.search("c", state["query"])]}

    async def async_node(state: _State) -> dict[str, Any]:
        return {"hits": [h.text for h in await recall.asearch("c", state["query"])]}

    builder = StateGraph(_State)
    builder.add_node("recall", RunnableLambda(sync_node, afunc=async_node))
    builder.add_edge(START, "recall")
    builder.add_edge("recall", END)
    return builder.compile(store=store)


def test_without_a_store_it_reads_the_running_graphs_store() -> None:
    store = InMemoryStore()
    StoreHook(store).deliver(Demotion("c", (DemotedMessage("user", "the tent leaked", 0, "k"),)))
    recall = StoreRecall()
    assert _graph(recall, store).invoke({"query": "tent"})["hits"] == ["the tent leaked"]
    done = asyncio.run(_graph(recall, store).ainvoke({"query": "tent"}))
    assert done["hits"] == ["the tent leaked"]
    with pytest.raises(ConfigError, match="outside"):
        recall.search("c", "tent")
    with pytest.raises(ConfigError, match="no store"):
        _graph(recall, None).invoke({"query": "tent"})
    indexed = StoreRecall(ranking="semantic")
    with pytest.raises(ConfigError, match="has no index"):
        _graph(indexed, store).invoke({"query": "tent"})


BAD_CALLS: list[tuple[str, str, Any]] = [
    ("store", "store", lambda s: StoreRecall(object())),  # type: ignore[arg-type]
    ("ranking", "ranking", lambda s: StoreRecall(s, ranking="fuzzy")),  # type: ignore[arg-type]
    ("semantic without index", "semantic", lambda s: StoreRecall(s, ranking="semantic")),
    ("counter", "counter", lambda s: StoreRecall(s, counter=3)),
    ("unknown counter", "counter", lambda s: StoreRecall(s, counter="nope")),
    ("scan_limit", "scan_limit", lambda s: StoreRecall(s, scan_limit=0)),
    ("cached", "cached_conversations", lambda s: StoreRecall(s, cached_conversations=1.5)),  # type: ignore[arg-type]
    ("relist", "relist", lambda s: StoreRecall(s, relist=-1)),
    ("relist nan", "relist", lambda s: StoreRecall(s, relist=float("nan"))),
    ("namespace", "namespace", lambda s: StoreRecall(s, namespace=("a.b",))),
    ("query", "query", lambda s: StoreRecall(s).search("c", None)),  # type: ignore[arg-type]
    ("k", "k", lambda s: StoreRecall(s).search("c", "x", k=-1)),
    ("k bool", "k", lambda s: StoreRecall(s).search("c", "x", k=True)),
    ("budget", "budget_tokens", lambda s: StoreRecall(s).search("c", "x", budget_tokens="5")),  # type: ignore[arg-type]
    ("id", "conversation_id", lambda s: StoreRecall(s).search("", "x")),
    ("fetch id", "conversation_id", lambda s: StoreRecall(s).fetch(None, "k")),  # type: ignore[arg-type]
    ("fetch key", "key", lambda s: StoreRecall(s).fetch("c", b"k")),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "argument", "call"), BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_input_is_refused_by_name_and_the_store_stays_as_it_was(
    name: str, argument: str, call: Any
) -> None:
    store = InMemoryStore()
    StoreHook(store).deliver(Demotion("c", (DemotedMessage("user", "x", 0, "k"),)))
    before = snapshot(store)
    with pytest.raises(DemoteError) as refused:
        call(store)
    assert argument in str(refused.value).lower()
    assert isinstance(refused.value, ConfigError | ArgumentTypeError | ConversationIdError)
    assert snapshot(store) == before
