"""StoreHook: each demoted message is one item of a real LangGraph store, once.

On ``InMemoryStore`` (with and without a semantic index): one item per message, in the
conversation's namespace under its prefix (fixed, or per user), keyed by its dedup key
(a re-delivery overwrites), holding the whole message and the text the index embeds;
``has_keys``, ``erase`` (fenced) and the engine's erase through it; a failing store
gives a ``StoreError`` and is then skipped by its breaker; bad input gets a typed error
naming it, and the store stays as it was. The support here (a word-hashing embedding, a
store that counts its puts, a thread of tool calls) serves the other test_store files.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest
from langchain_core.embeddings import Embeddings
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.store.base import PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from demote import Backoff, Demoter, SlidingWindow
from demote.errors import (
    ArgumentTypeError,
    ConfigError,
    ConversationIdError,
    DemoteError,
    FencedOut,
    StoreError,
    StoreUnavailable,
)
from demote.records import DemotedMessage, Demotion, make_key, searchable_text
from langchain_demote import StoreHook, StoreRecall
from langchain_demote.messages import from_data, to_core, to_data

DIMS = 512


class Words(Embeddings):
    """A stand-in embedding model: each word hashed into one of ``DIMS`` buckets.

    Texts that share words are near each other, so a semantic index ranks by overlap.
    It records every text it embeds.
    """

    def __init__(self) -> None:
        self.embedded: list[str] = []
        self.lock = threading.Lock()

    def _vector(self, text: str) -> list[float]:
        vector = [0.0] * DIMS
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIMS] += 1.0
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        with self.lock:
            self.embedded.extend(texts)
        return [self._vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._vector(text)


def indexed_store(embeddings: Words | None = None) -> InMemoryStore:
    return InMemoryStore(index={"dims": DIMS, "embed": embeddings or Words()})


class CountingStore(InMemoryStore):
    """An ``InMemoryStore`` that counts every put (and delete) by key, sync and async, and
    records the filter of every listing (a search without a query)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.puts: Counter[str] = Counter()
        self.deletes: Counter[str] = Counter()
        self.listings: list[dict[str, Any]] = []
        self.count_lock = threading.RLock()

    def _count(self, ops: Iterable[Any]) -> list[Any]:
        ops = list(ops)
        with self.count_lock:
            for op in ops:
                if isinstance(op, PutOp):
                    (self.puts if op.value is not None else self.deletes)[op.key] += 1
                elif isinstance(op, SearchOp) and op.query is None:
                    self.listings.append(dict(op.filter or {}))
        return ops

    def batch(self, ops: Iterable[Any]) -> list[Any]:
        with self.count_lock:  # InMemoryStore's dicts are not safe across threads
            return super().batch(self._count(ops))

    async def abatch(self, ops: Iterable[Any]) -> list[Any]:
        return await super().abatch(self._count(ops))


class FlakyStore(InMemoryStore):
    """An ``InMemoryStore`` that raises ``ConnectionError`` while ``down``; counts calls."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.calls = 0

    def batch(self, ops: Iterable[Any]) -> list[Any]:
        self.calls += 1
        if self.down:
            raise ConnectionError("connection refused")
        return super().batch(ops)

    async def abatch(self, ops: Iterable[Any]) -> list[Any]:
        return self.batch(ops)


def thread(turns: int, tag: str = "") -> list[BaseMessage]:
    """A conversation of ``turns`` turns: a question, a tool call, its result, an answer."""
    messages: list[BaseMessage] = []
    for i in range(turns):
        call = {"name": "lookup", "args": {"city": f"city{i}{tag}"}, "id": f"call_{i}{tag}"}
        messages += [
            HumanMessage(f"Question {i}{tag}: what is the weather in city{i}{tag}?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage(
                f"Forecast for city{i}{tag}: rain, {10 + i} degrees", tool_call_id=call["id"]
            ),
            AIMessage(f"It rains in city{i}{tag}, {10 + i} degrees."),
        ]
    return messages


def load(demoter: Demoter, cid: str, messages: list[BaseMessage]) -> Any:
    return demoter.load(cid, messages, lambda m: to_core(m, demoter.describe))


def expected_keys(demoter: Demoter, cid: str, messages: list[BaseMessage], upto: int) -> list[str]:
    return [
        make_key(cid, i, to_core(m, demoter.describe).fingerprint)
        for i, m in enumerate(messages[:upto])
    ]


def items(store: InMemoryStore, namespace: tuple[str, ...] = ("demote",)) -> list[Any]:
    return store.search(namespace, limit=10_000)


def snapshot(store: InMemoryStore) -> dict[tuple[tuple[str, ...], str], Any]:
    return {(tuple(i.namespace), i.key): i.value for i in items(store, ())}


# -- one item per message -------------------------------------------------------------------


@pytest.mark.parametrize("indexed", [False, True], ids=["no-index", "index"])
def test_each_demoted_message_is_one_item_holding_the_whole_message(indexed: bool) -> None:
    embeddings = Words()
    store = indexed_store(embeddings) if indexed else InMemoryStore()
    demoter = Demoter(SlidingWindow.last_messages(4), StoreHook(store), hook_wait=None)
    messages = thread(6)
    load(demoter, "trip-1", messages)
    delivered = demoter.state_of("trip-1").delivered
    assert delivered == len(messages) - 4

    found = {item.key: item for item in items(store)}
    assert sorted(found) == sorted(expected_keys(demoter, "trip-1", messages, delivered))
    for i, message in enumerate(messages[:delivered]):
        key = make_key("trip-1", i, to_core(message, demoter.describe).fingerprint)
        item = found[key]
        assert tuple(item.namespace) == ("demote", "trip-1")
        value = item.value
        assert value["conversation_id"] == "trip-1" and value["index"] == i
        assert value["message"] == to_data(message)
        assert from_data(value["message"]) == message  # whole: tool calls, ids, type
        assert value["text"] == searchable_text(value["message"]["text"], value["message"])
    call = next(i.value for i in found.values() if i.value["message"].get("tool_calls"))
    assert call["text"] == 'lookup {"city": "city0"}'  # a call is found by its name and args
    if indexed:  # the index embeds the text field alone, once per message
        assert sorted(embeddings.embedded) == sorted(i.value["text"] for i in found.values())


async def test_a_redelivered_batch_overwrites_its_items_sync_and_async() -> None:
    store = CountingStore()
    hook = StoreHook(store)
    batch = Demotion(
        "c1", tuple(DemotedMessage("user", f"m{i}", i, f"k{i}", data=None) for i in range(3))
    )
    hook.deliver(batch)
    await hook.adeliver(batch)
    hook.deliver(batch)
    assert sorted(i.key for i in items(store)) == ["k0", "k1", "k2"]
    assert store.puts == Counter({"k0": 3, "k1": 3, "k2": 3})
    assert items(store)[0].value["message"] == {"role": "user", "text": "m0"}


def test_namespace_prefix_fixed_or_per_user_and_ids_that_are_not_labels() -> None:
    store = InMemoryStore()
    per_user = StoreHook(store, namespace=lambda cid: ("users", cid.split("/")[0], "chats"))
    fixed = StoreHook(store, namespace=["memory"])
    for hook, cid in [
        (per_user, "ann/1"),
        (per_user, "bob/1"),
        (fixed, "a.b"),
        (fixed, "a%2Eb"),
        (fixed, "100%_like"),
    ]:
        hook.deliver(Demotion(cid, (DemotedMessage("user", f"hello from {cid}", 0, "k"),)))
    assert per_user.namespace("ann/1") == ("users", "ann", "chats", "ann/1")
    assert fixed.namespace("a.b") == ("memory", "a%2Eb")
    assert fixed.namespace("a%2Eb") == ("memory", "a%252Eb")
    held = {tuple(i.namespace): i.value["conversation_id"] for i in items(store, ())}
    assert held == {
        ("users", "ann", "chats", "ann/1"): "ann/1",
        ("users", "bob", "chats", "bob/1"): "bob/1",
        ("memory", "a%2Eb"): "a.b",
        ("memory", "a%252Eb"): "a%2Eb",
        ("memory", "100%25_like"): "100%_like",
    }


def test_media_is_stored_by_reference_unless_bytes_are_asked_for() -> None:
    image = {"type": "image", "base64": "iVBORw0KGgo" * 20, "mime_type": "image/png"}
    message = HumanMessage([{"type": "text", "text": "my cat"}, image])
    data = to_data(message)
    for media, kept in [("reference", False), ("bytes", True)]:
        store = InMemoryStore()
        StoreHook(store, media=media).deliver(  # type: ignore[arg-type]
            Demotion("c", (DemotedMessage("user", "my cat", 0, "k", data=data),))
        )
        block = items(store)[0].value["message"]["blocks"][1]
        assert (block.get("base64") == image["base64"]) is kept


def test_has_keys_names_only_this_conversations_items() -> None:
    store = InMemoryStore()
    hook = StoreHook(store)
    hook.deliver(Demotion("a", (DemotedMessage("user", "x", 0, "k0"),)))
    hook.deliver(Demotion("b", (DemotedMessage("user", "y", 0, "k1"),)))
    assert hook.has_keys("a", ["k0", "k1", "k9"]) == {"k0"}
    assert asyncio.run(hook.ahas_keys("b", ["k0", "k1"])) == {"k1"}
    assert hook.has_keys("a", []) == set()


# -- erase ---------------------------------------------------------------------------------


def test_erase_removes_the_conversations_items_only_and_fences_late_batches() -> None:
    store = InMemoryStore()
    hook = StoreHook(store)
    for cid in ("gone", "kept"):
        hook.deliver(
            Demotion(cid, tuple(DemotedMessage("user", f"{cid} {i}", i, f"k{i}") for i in range(5)))
        )
    store.put(("demote", "gone"), "mine", {"note": "the user's own item"})
    store.put(("demote", "gone", "deeper"), "k0", {"conversation_id": "gone", "note": "deeper"})
    before = snapshot(store)

    assert hook.erase("gone", fence=7) == 5
    after = snapshot(store)
    assert {k for k in before if k not in after} == {
        (("demote", "gone"), f"k{i}") for i in range(5)
    }
    assert (("demote", "kept"), "k0") in after and (("demote", "gone"), "mine") in after

    late = Demotion("gone", (DemotedMessage("user", "late", 9, "k9"),), fence=6)
    with pytest.raises(FencedOut, match="older than its erase"):
        hook.deliver(late)
    assert snapshot(store) == after
    hook.deliver(Demotion("gone", (DemotedMessage("user", "new", 9, "k9"),), fence=8))
    assert asyncio.run(hook.aerase("gone")) == 1
    assert hook.erase("never-seen") == 0


def test_the_engines_erase_reaches_the_store_and_the_recalls_copies() -> None:
    store = InMemoryStore()
    demoter = Demoter(SlidingWindow.last_messages(4), StoreHook(store), hook_wait=None)
    messages = thread(5)
    load(demoter, "t", messages)
    recall = StoreRecall(store)
    assert recall.search("t", "weather city1", k=2)  # the lexical copy holds the conversation
    mirror = recall._mirrors[store]
    assert mirror.archive.count("t") == len(messages) - 4

    report = demoter.erase("t")
    assert report.complete, report
    assert [(t.tier, t.status, t.removed) for t in report.tiers] == [
        ("StoreHook", "erased", len(messages) - 4)
    ]
    assert items(store) == []
    assert mirror.archive.count("t") == 0, "the recall's copy went with the items"
    assert recall.search("t", "weather city1") == []


# -- a failing store ------------------------------------------------------------------------


def test_a_failing_store_is_a_store_error_then_skipped_until_a_probe_finds_it_back() -> None:
    store = FlakyStore()
    hook = StoreHook(store)
    batch = Demotion("c", (DemotedMessage("user", "x", 0, "k"),))
    store.down = True
    with pytest.raises(StoreError, match="connection refused") as failed:
        hook.deliver(batch)
    assert not isinstance(failed.value, StoreUnavailable)
    assert isinstance(failed.value.__cause__, ConnectionError)
    calls = store.calls
    with pytest.raises(StoreUnavailable, match="failed recently"):
        hook.deliver(batch)
    with pytest.raises(StoreUnavailable):
        StoreRecall(store).search("c", "x")
    assert store.calls == calls, "the breaker skipped the store without calling it"
    store.down = False
    for _ in range(100):  # the probe goes once the breaker's interval (<= 0.6 s) is over
        try:
            hook.deliver(batch)
            break
        except StoreUnavailable:
            threading.Event().wait(0.02)
    assert [i.key for i in items(store)] == ["k"]


def test_the_engine_keeps_a_failed_batch_pending_and_delivers_it_once_the_store_is_back() -> None:
    store = FlakyStore()
    demoter = Demoter(
        SlidingWindow.last_messages(4), StoreHook(store), hook_wait=None, retry=Backoff(0, 0)
    )
    messages = thread(4)
    store.down = True
    window = load(demoter, "c", messages)
    assert window.pending == len(messages) - 4 and len(window.messages) == 4
    store.down = False
    assert items(store) == []
    for _ in range(200):  # retried with backoff, through the breaker's probe
        window = load(demoter, "c", messages)
        if window.pending == 0:
            break
        threading.Event().wait(0.02)
    assert window.pending == 0
    assert sorted(i.key for i in items(store)) == sorted(
        expected_keys(demoter, "c", messages, len(messages) - 4)
    )


# -- hostile input: a typed error naming it, the store as it was ----------------------------


def _filled() -> tuple[InMemoryStore, StoreHook]:
    store = InMemoryStore()
    hook = StoreHook(store)
    hook.deliver(Demotion("c", (DemotedMessage("user", "kept", 0, "k0"),)))
    return store, hook


def _raise(cid: str) -> tuple[str, ...]:
    raise RuntimeError("no user for " + cid)


BAD_CALLS: list[tuple[str, str, Any]] = [
    ("store", "store", lambda s, h: StoreHook(object())),  # type: ignore[arg-type]
    ("empty prefix", "namespace", lambda s, h: StoreHook(s, namespace=())),
    ("dotted label", "namespace", lambda s, h: StoreHook(s, namespace=("a.b",))),
    ("reserved root", "namespace", lambda s, h: StoreHook(s, namespace=("langgraph",))),
    ("str prefix", "namespace", lambda s, h: StoreHook(s, namespace="demote")),  # type: ignore[arg-type]
    ("int label", "namespace", lambda s, h: StoreHook(s, namespace=(1,))),  # type: ignore[arg-type]
    ("media", "media", lambda s, h: StoreHook(s, media="inline")),  # type: ignore[arg-type]
    (
        "failing callable",
        "namespace",
        lambda s, h: StoreHook(s, namespace=_raise).deliver(
            Demotion("c", (DemotedMessage("user", "x", 1, "k1"),))
        ),
    ),
    (
        "callable giving a dotted label",
        "namespace",
        lambda s, h: StoreHook(s, namespace=lambda cid: ("u", "x.y")).deliver(
            Demotion("c", (DemotedMessage("user", "x", 1, "k1"),))
        ),
    ),
    ("batch", "batch", lambda s, h: h.deliver(["not", "a", "batch"])),  # type: ignore[arg-type]
    ("batch messages", "batch", lambda s, h: h.deliver(Demotion("c", ("text",)))),  # type: ignore[arg-type]
    (
        "batch fence",
        "fence",
        lambda s, h: h.deliver(Demotion("c", (DemotedMessage("user", "x", 1, "k1"),), fence=-1)),
    ),
    ("empty id", "conversation_id", lambda s, h: h.deliver(Demotion("", ()))),
    ("nul id", "conversation_id", lambda s, h: h.erase("a\x00b")),
    ("has_keys str", "keys", lambda s, h: h.has_keys("c", "k0")),  # type: ignore[arg-type]
    ("has_keys ints", "keys", lambda s, h: h.has_keys("c", [1])),  # type: ignore[list-item]
    ("erase fence", "fence", lambda s, h: h.erase("c", fence=float("nan"))),  # type: ignore[arg-type]
    ("erase keys", "keys", lambda s, h: h.erase("c", keys=[None])),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("name", "argument", "call"), BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_input_is_refused_by_name_and_the_store_stays_as_it_was(
    name: str, argument: str, call: Any
) -> None:
    store, hook = _filled()
    before = snapshot(store)
    with pytest.raises(DemoteError) as refused:
        call(store, hook)
    assert argument in str(refused.value).lower()
    assert isinstance(refused.value, ConfigError | ArgumentTypeError | ConversationIdError)
    assert snapshot(store) == before


# -- without langgraph -----------------------------------------------------------------------

WITHOUT_LANGGRAPH = """
import importlib.abc, sys

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "langgraph":
            raise ImportError(f"blocked for this test: {name}")
        return None

sys.meta_path.insert(0, Blocker())
import langchain_demote
from demote.errors import MissingExtraError
for name in ("StoreHook", "StoreRecall"):
    try:
        getattr(langchain_demote, name)
    except MissingExtraError as exc:
        print(name, exc)
"""


def test_the_adapter_imports_without_langgraph_and_names_the_extra() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_LANGGRAPH],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["StoreHook", "StoreRecall"]
    assert all("demote[langgraph]" in line for line in lines), lines
