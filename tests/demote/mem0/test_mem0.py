"""demote.mem0 against a real mem0 2.x ``Memory`` / ``AsyncMemory``, fully offline.

How mem0 runs here (see ``mem0_offline_config``):

* ``MEM0_TELEMETRY=False`` and ``MEM0_DIR`` (a temp folder) are set before mem0 is imported
  (it reads both at import; telemetry off also turns off its remote "notice" config
  fetch). ``tests/conftest.py`` sets them too; the ``mem0_module`` fixture re-asserts it.
* Vector store: embedded qdrant on a tmp path (``path=...``), one per test.
* History: SQLite on a tmp path.
* Embedder: mem0's ``langchain`` provider with :class:`HashingEmbeddings`, a deterministic
  hashed bag of words (no model, no network), so "what is my locker code" really is
  nearest to "my locker code is 4512".
* LLM: mem0's ``langchain`` provider with langchain-core's ``FakeListChatModel``; it is
  never called with ``infer=False``. For extraction (``infer=True``) the instance's
  ``llm`` is replaced by :class:`SlowExtractor`, a fake returning canned JSON after a
  delay: a real LLM cannot run here, and that is the only thing mocked.
* spaCy and fastembed are not installed, so mem0 skips lemmatisation, entity boosts and
  BM25 (it logs a warning); had spaCy been installed without its model, mem0 would try
  to download it: the ``network_attempts`` guard would fail the test.

Every test runs under ``network_attempts``, which fails the test if anything tried to
resolve or connect to a non-loopback address, even where mem0 swallows the error.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import FakeListChatModel

from demote.errors import ConfigError, ConversationIdError, HookError, MissingExtraError, StoreError
from demote.hooks.base import ArchiveRecall, AsyncHook, Capture, Recall, SyncHook
from demote.mem0 import (
    KEY_FIELD,
    Mem0Capture,
    Mem0Hook,
    Mem0Recall,
    conversation_namespace,
    memory_from_config,
)
from demote.records import CapturedTurn, DemotedMessage, Demotion, fingerprint, make_key

DIMS = 512
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "at",
        "be",
        "do",
        "i",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "the",
        "to",
        "was",
        "what",
        "you",
        "your",
    ]
)


# --------------------------------------------------------------------------- offline mem0


@pytest.fixture(scope="module")
def mem0_module() -> Iterator[ModuleType]:
    """mem0, imported with telemetry off and its home in a temp folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEM0_TELEMETRY", "False")
        if "MEM0_DIR" not in os.environ:
            import tempfile

            mp.setenv("MEM0_DIR", tempfile.mkdtemp(prefix="demote-mem0-"))
        mp.setenv("LANGSMITH_TRACING", "false")
        mp.setenv("LANGCHAIN_TRACING_V2", "false")
        mem0 = importlib.import_module("mem0")
        telemetry = importlib.import_module("mem0.memory.telemetry")
        assert telemetry.MEM0_TELEMETRY is False, "mem0 was imported with telemetry on"
        yield mem0


@pytest.fixture(autouse=True)
def network_attempts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record (and refuse) every non-loopback resolve or connect; the test fails on any."""
    attempts: list[str] = []
    connect = socket.socket.connect
    getaddrinfo = socket.getaddrinfo

    def local(host: object) -> bool:
        return str(host) in ("localhost", "::1", "") or str(host).startswith("127.")

    def guarded_connect(self: socket.socket, address: Any) -> Any:
        if isinstance(address, tuple) and not local(address[0]):
            attempts.append(f"connect {address!r}")
            raise ConnectionRefusedError(f"network blocked: {address!r}")
        return connect(self, address)

    def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not local(host):
            attempts.append(f"resolve {host!r}")
            raise socket.gaierror(f"network blocked: {host!r}")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    yield attempts
    assert attempts == [], f"something tried to reach the network: {attempts}"


class HashingEmbeddings(Embeddings):
    """Deterministic hashed bag of words (stopwords dropped), L2-normalised."""

    def __init__(self, dims: int = DIMS) -> None:
        self.dims = dims

    def embed_query(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for token in re.findall(r"\w+", text.lower()):
            if token in STOPWORDS:
                continue
            h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "big")
            vector[h % self.dims] += 1.0
        norm = sum(x * x for x in vector) ** 0.5 or 1.0
        return [x / norm for x in vector]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_query(t) for t in texts]


def mem0_offline_config(folder: Path, collection: str = "demote") -> dict[str, Any]:
    """A mem0 config that never touches the network (reusable in notebooks/benchmarks)."""
    return {
        "vector_store": {
            "provider": "qdrant",
            "config": {
                "collection_name": collection,
                "path": str(folder / "qdrant"),
                "embedding_model_dims": DIMS,
                "on_disk": False,
            },
        },
        "embedder": {
            "provider": "langchain",
            "config": {"model": HashingEmbeddings(), "embedding_dims": DIMS},
        },
        "llm": {"provider": "langchain", "config": {"model": FakeListChatModel(responses=["{}"])}},
        "history_db_path": str(folder / "history.db"),
    }


@pytest.fixture
def make_memory(mem0_module: ModuleType, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Builds offline ``Memory`` / ``AsyncMemory`` objects, each in its own folder."""
    built: list[Any] = []

    def make(*, asynchronous: bool = False) -> Any:
        folder = tmp_path / f"mem0-{len(built)}"
        folder.mkdir()
        memory = memory_from_config(mem0_offline_config(folder), asynchronous=asynchronous)
        assert type(memory).__name__ == ("AsyncMemory" if asynchronous else "Memory")
        built.append(memory)
        return memory

    yield make
    for memory in built:
        memory.close()
        memory.vector_store.client.close()


class SlowExtractor:
    """Fake mem0 LLM (mocked: no real LLM runs here): canned JSON after ``delay`` seconds.

    For each ``(needle, fact)`` pair whose needle is in the new messages, the fact is
    "extracted". Records every prompt it was given.
    """

    def __init__(self, facts: dict[str, str], delay: float = 0.4) -> None:
        self.facts = facts
        self.delay = delay
        self.prompts: list[str] = []
        self.lock = threading.Lock()

    def generate_response(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        prompt = messages[-1]["content"]
        with self.lock:
            self.prompts.append(prompt)
        time.sleep(self.delay)
        new = prompt.split("New Messages", 1)[-1] if "New Messages" in prompt else prompt
        found = [{"text": fact} for needle, fact in self.facts.items() if needle in new]
        return json.dumps({"memory": found})


def stored(memory: Any, run_id: str) -> list[dict[str, Any]]:
    result = memory.get_all(filters={"run_id": run_id}, top_k=1000)
    return list(result["results"])


async def astored(memory: Any, run_id: str) -> list[dict[str, Any]]:
    result = await memory.get_all(filters={"run_id": run_id}, top_k=1000)
    return list(result["results"])


# --------------------------------------------------------------------------- conversations

TOPICS = [
    "hiking in the mountains last weekend",
    "a new sourdough recipe with rye flour",
    "the football match on Sunday",
    "planting tomatoes on the balcony",
    "a podcast about ancient Rome",
    "learning to play the cello",
    "a trip to Lisbon in spring",
    "fixing a squeaky bicycle chain",
    "the best way to brew green tea",
    "a novel about lighthouse keepers",
]


def message(cid: str, index: int, role: Any, text: str) -> DemotedMessage:
    return DemotedMessage(role, text, index, make_key(cid, index, fingerprint(role, text)))


def conversation(
    cid: str, fact: str = "my locker code is 4512", n: int = 64
) -> list[DemotedMessage]:
    """``n`` messages: system prompt, the fact early on, small talk, a tool exchange."""
    out = [
        message(cid, 0, "system", "You are a helpful assistant."),
        message(cid, 1, "user", "Hi there, quick note before we start."),
        message(cid, 2, "user", fact),
        message(cid, 3, "assistant", "Noted, I will remember that."),
        message(cid, 4, "assistant", ""),  # a tool-call-only turn: nothing to store
        message(cid, 5, "tool", "weather: sunny, 21 degrees"),
    ]
    while len(out) < n:
        i = len(out)
        topic = TOPICS[(i // 2) % len(TOPICS)]
        if i % 2 == 0:
            out.append(message(cid, i, "user", f"Tell me about {topic} (turn {i})."))
        else:
            out.append(message(cid, i, "assistant", f"Here is a thought on {topic} (turn {i})."))
    return out


def batches(cid: str, messages: list[DemotedMessage], size: int = 7) -> list[Demotion]:
    return [Demotion(cid, tuple(messages[i : i + size])) for i in range(0, len(messages), size)]


def storable(messages: list[DemotedMessage]) -> list[DemotedMessage]:
    return [m for m in messages if m.role != "system" and m.text.strip()]


# --------------------------------------------------------------------------- import & config


def test_importing_demote_mem0_does_not_import_mem0() -> None:
    code = (
        "import sys, demote.mem0\n"
        "bad = [m for m in sys.modules if m == 'mem0' or m.startswith('mem0.')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_mem0_raises_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mem0", None)
    with pytest.raises(MissingExtraError) as info:
        memory_from_config({})
    assert info.value.extra == "mem0"
    assert "demote[mem0]" in str(info.value)


def test_classes_meet_the_protocols(make_memory: Callable[..., Any]) -> None:
    memory = make_memory()
    hook = Mem0Hook(memory)
    assert isinstance(hook, SyncHook)
    assert isinstance(hook, AsyncHook)
    assert isinstance(Mem0Recall(memory), Recall)
    # mem0 keeps memories, not the archived messages: it cannot back a recall tool.
    assert not isinstance(Mem0Recall(memory), ArchiveRecall)
    with Mem0Capture(memory, infer=False) as capture:
        assert isinstance(capture, Capture)


def test_namespace_rules(make_memory: Callable[..., Any]) -> None:
    assert conversation_namespace()("chat-1") == {"run_id": "chat-1"}
    assert conversation_namespace(user_id="alice", agent_id="bot")("c") == {
        "user_id": "alice",
        "agent_id": "bot",
        "run_id": "c",
    }
    spaced = conversation_namespace()("a chat with spaces")["run_id"]
    assert spaced.startswith("demote-") and " " not in spaced
    assert spaced == conversation_namespace()("a chat with spaces")["run_id"]  # stable
    with pytest.raises(ConversationIdError):
        conversation_namespace()("  ")
    with pytest.raises(ConfigError):
        conversation_namespace(user_id="has space")
    memory = make_memory()
    with pytest.raises(ConfigError, match="not both"):
        Mem0Hook(memory, user_id="alice", namespace=lambda cid: {"run_id": cid})
    bad = Mem0Hook(memory, namespace=lambda cid: {"session": cid})
    with pytest.raises(ConfigError, match="namespace"):
        bad.deliver(Demotion("c", (message("c", 0, "user", "hello"),)))


# --------------------------------------------------------------------------- hook & recall


def test_long_conversation_is_demoted_and_an_early_fact_recalled(
    make_memory: Callable[..., Any],
) -> None:
    memory = make_memory()
    hook, recall = Mem0Hook(memory), Mem0Recall(memory)
    messages = conversation("chat-1")
    for batch in batches("chat-1", messages):
        hook.deliver(batch)

    rows = stored(memory, "chat-1")
    assert sorted(r["metadata"][KEY_FIELD] for r in rows) == sorted(
        m.key for m in storable(messages)
    )
    assert all(r["memory"] for r in rows)  # verbatim, no system prompt, no empty turn
    by_key = {r["metadata"][KEY_FIELD]: r for r in rows}
    assert by_key[messages[5].key]["role"] == "tool"
    assert by_key[messages[5].key]["memory"] == messages[5].text

    found = recall.search("chat-1", "what is my locker code", k=3)
    assert found[0].text == "my locker code is 4512"
    assert (found[0].role, found[0].index, found[0].key) == ("user", 2, messages[2].key)
    assert found[0].score > 0.5
    assert len(found) <= 3
    assert recall.search("chat-1", "   ") == []
    assert recall.search("chat-1", "locker", k=0) == []


def test_repeat_delivery_adds_nothing(make_memory: Callable[..., Any]) -> None:
    memory = make_memory()
    messages = conversation("chat-1")
    hook = Mem0Hook(memory)
    for batch in batches("chat-1", messages):
        hook.deliver(batch)
    count = len(stored(memory, "chat-1"))

    for batch in batches("chat-1", messages):  # same process: the key cache answers
        hook.deliver(batch)
    assert len(stored(memory, "chat-1")) == count

    restarted = Mem0Hook(memory)  # a new process: empty cache, mem0 is asked
    for batch in batches("chat-1", messages, size=5):
        restarted.deliver(batch)
    assert len(stored(memory, "chat-1")) == count

    # A batch that overlaps stored messages and new ones adds only the new ones.
    more = [*messages[-3:], message("chat-1", len(messages), "user", "one more thing")]
    Mem0Hook(memory).deliver(Demotion("chat-1", tuple(more)))
    assert len(stored(memory, "chat-1")) == count + 1


def test_conversations_never_see_each_other(make_memory: Callable[..., Any]) -> None:
    memory = make_memory()
    # The same user in two conversations: the run_id still keeps them apart.
    hook = Mem0Hook(memory, user_id="alice")
    recall = Mem0Recall(memory, user_id="alice")
    a = conversation("chat-a", "my locker code is 1111")
    b = conversation("chat-b", "my locker code is 2222")
    for batch in [*batches("chat-a", a), *batches("chat-b", b)]:
        hook.deliver(batch)

    assert recall.search("chat-a", "what is my locker code")[0].text.endswith("1111")
    assert recall.search("chat-b", "what is my locker code")[0].text.endswith("2222")
    for cid, other in (("chat-a", "2222"), ("chat-b", "1111")):
        texts = [r.text for r in recall.search(cid, "what is my locker code", k=50)]
        assert not any(other in t for t in texts)
        assert {r.key for r in recall.search(cid, "tell me about hiking", k=50)} <= {
            m.key for m in (a if cid == "chat-a" else b)
        }
    assert recall.search("chat-c", "what is my locker code") == []
    # Another user's recall sees nothing of alice's conversation.
    assert Mem0Recall(memory, user_id="bob").search("chat-a", "what is my locker code") == []


async def test_async_memory_hook_and_recall(make_memory: Callable[..., Any]) -> None:
    memory = make_memory(asynchronous=True)
    hook, recall = Mem0Hook(memory), Mem0Recall(memory)
    messages = conversation("chat-1")
    for batch in batches("chat-1", messages):
        await hook.adeliver(batch)
    count = len(await astored(memory, "chat-1"))
    assert count == len(storable(messages))

    found = await recall.asearch("chat-1", "what is my locker code")
    assert found[0].text == "my locker code is 4512"
    assert found[0].key == messages[2].key

    # The sync methods on an AsyncMemory, called from inside a running loop.
    for batch in batches("chat-1", messages):
        Mem0Hook(memory).deliver(batch)
    assert len(await astored(memory, "chat-1")) == count
    assert recall.search("chat-1", "what is my locker code")[0].key == messages[2].key


def test_sync_methods_on_async_memory_without_a_loop(make_memory: Callable[..., Any]) -> None:
    memory = make_memory(asynchronous=True)
    hook, recall = Mem0Hook(memory), Mem0Recall(memory)
    for batch in batches("chat-1", conversation("chat-1")):
        hook.deliver(batch)
    assert recall.search("chat-1", "what is my locker code")[0].text == "my locker code is 4512"


async def test_async_methods_on_sync_memory(make_memory: Callable[..., Any]) -> None:
    memory = make_memory()
    hook, recall = Mem0Hook(memory), Mem0Recall(memory)
    messages = conversation("chat-1")
    # One batch at a time, as the engine delivers a conversation. (Not gather: mem0's
    # embedded qdrant is not thread-safe, and each adeliver runs in its own thread.)
    for batch in batches("chat-1", messages):
        await hook.adeliver(batch)
    assert len(stored(memory, "chat-1")) == len(storable(messages))
    found = await recall.asearch("chat-1", "what is my locker code")
    assert found[0].key == messages[2].key


def test_extracting_hook_stores_facts_once(make_memory: Callable[..., Any]) -> None:
    memory = make_memory()
    memory.llm = SlowExtractor({"locker code": "Locker code is 4512"}, delay=0)
    hook = Mem0Hook(memory, infer=True, metadata={"source": "demote"})
    messages = conversation("chat-1", n=12)
    for batch in batches("chat-1", messages):
        hook.deliver(batch)
    rows = stored(memory, "chat-1")
    assert [r["memory"] for r in rows] == ["Locker code is 4512"]
    assert rows[0]["metadata"]["source"] == "demote"
    calls = len(memory.llm.prompts)
    Mem0Hook(memory, infer=True).deliver(batches("chat-1", messages)[0])  # restart, repeat
    assert len(memory.llm.prompts) == calls
    found = Mem0Recall(memory).search("chat-1", "what is my locker code")
    assert (found[0].text, found[0].role) == ("Locker code is 4512", "memory")


def test_mem0_errors_become_hook_and_store_errors(make_memory: Callable[..., Any]) -> None:
    class Broken:
        def embed(self, text: str, memory_action: str | None = None) -> list[float]:
            raise RuntimeError("embedder down")

    memory = make_memory()
    memory.embedding_model = Broken()
    batch = Demotion("chat-1", (message("chat-1", 0, "user", "hello"),))
    with pytest.raises(HookError, match="embedder down") as info:
        Mem0Hook(memory).deliver(batch)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(StoreError, match="embedder down"):
        Mem0Recall(memory).search("chat-1", "hello")
    assert stored(memory, "chat-1") == []


# --------------------------------------------------------------------------- capture


def turn(cid: str, index: int, role: Any, text: str) -> CapturedTurn:
    return CapturedTurn(cid, role, text, index, make_key(cid, index, fingerprint(role, text)))


def test_capture_returns_at_once_and_only_user_turns_reach_mem0(
    make_memory: Callable[..., Any],
) -> None:
    memory = make_memory()
    extractor = SlowExtractor(
        {"Lisbon": "Lives in Lisbon", "cello": "Plays the cello", "SECRET": "leaked"}, delay=0.4
    )
    memory.llm = extractor
    capture = Mem0Capture(memory, user_id="alice")
    turns = [
        turn("chat-1", 0, "system", "SECRET system prompt"),
        turn("chat-1", 1, "user", "I moved to Lisbon last year."),
        turn("chat-1", 2, "assistant", "SECRET: Lisbon is lovely."),
        turn("chat-1", 3, "user", "I also play the cello."),
        turn("chat-1", 4, "user", "   "),
    ]
    started = time.perf_counter()
    for t in turns:
        capture.capture(t)
    capture.capture(turns[1])  # a repeat of a captured turn is ignored
    elapsed = time.perf_counter() - started
    assert elapsed < 0.2, f"capture blocked for {elapsed:.2f}s"
    assert capture.stats.delivered == 0  # the extraction is still running

    capture.close()  # drains
    assert capture.stats.delivered == 2
    assert len(extractor.prompts) == 2
    assert not any("SECRET" in p.split("New Messages", 1)[-1] for p in extractor.prompts)
    rows = memory.get_all(filters={"user_id": "alice", "run_id": "chat-1"}, top_k=100)
    assert sorted(r["memory"] for r in rows["results"]) == ["Lives in Lisbon", "Plays the cello"]
    found = Mem0Recall(memory, user_id="alice").search("chat-1", "where does she live, Lisbon?")
    assert found[0].text == "Lives in Lisbon"


def test_capture_context_manager_drains_and_survives_a_restart(
    make_memory: Callable[..., Any],
) -> None:
    memory = make_memory(asynchronous=True)
    memory.llm = SlowExtractor({"Lisbon": "Lives in Lisbon"}, delay=0.1)
    t = turn("chat-1", 1, "user", "I moved to Lisbon last year.")
    with Mem0Capture(memory) as capture:
        capture.capture(t)
    assert capture.stats.delivered == 1
    with Mem0Capture(memory) as again:  # a restarted process re-sends the same turn
        again.capture(t)
    assert again.stats.delivered == 1
    assert len(memory.llm.prompts) == 1  # mem0 already held it: no second extraction
    found = asyncio.run(Mem0Recall(memory).asearch("chat-1", "Lisbon"))
    assert [r.text for r in found] == ["Lives in Lisbon"]


def test_capture_verbatim(make_memory: Callable[..., Any]) -> None:
    memory = make_memory()
    with Mem0Capture(memory, infer=False) as capture:
        capture.capture(turn("chat-1", 7, "user", "my locker code is 4512"))
    found = Mem0Recall(memory).search("chat-1", "what is my locker code")
    assert (found[0].text, found[0].index, found[0].role) == ("my locker code is 4512", 7, "user")


# --------------------------------------------------------------------------- hosted client


class RecordedMemoryClient:
    """A recorded fake of hosted ``mem0.MemoryClient`` (the platform is not reachable here).

    Only ``add`` / ``get_all`` / ``search``, with the real signatures (checked below) and
    the v3 API's observed behaviour: identity in ``filters`` (``add``) or ``{"AND": [...]}``
    filters (``get_all`` / ``search``), top-level entity ids rejected, ``get_all`` paged
    (``count`` / ``next`` / ``results``), metadata echoed under ``metadata``.
    """

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def add(self, messages: Any, options: Any = None, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("add", kwargs))
        scope = kwargs["filters"]
        for m in messages:
            self.rows.append(
                {
                    "id": f"m{len(self.rows)}",
                    "memory": m["content"],
                    **scope,
                    "metadata": dict(kwargs.get("metadata") or {}),
                }
            )
        return {"results": [{"status": "PENDING", "event_id": "e1"}]}

    def get_all(self, options: Any = None, **kwargs: Any) -> dict[str, Any]:
        self._reject_entity_params(kwargs)
        self.calls.append(("get_all", kwargs))
        rows = [r for r in self.rows if self._match(r, kwargs["filters"])]
        page, size = kwargs.get("page", 1), kwargs.get("page_size", 100)
        chunk = rows[(page - 1) * size : page * size]
        more = page * size < len(rows)
        return {
            "count": len(rows),
            "next": "…" if more else None,
            "previous": None,
            "results": chunk,
        }

    def search(self, query: str, options: Any = None, **kwargs: Any) -> dict[str, Any]:
        self._reject_entity_params(kwargs)
        self.calls.append(("search", kwargs))
        words = set(query.lower().split()) - STOPWORDS
        hits = []
        for r in self.rows:
            if self._match(r, kwargs["filters"]):
                score = len(words & set(r["memory"].lower().split())) / (len(words) or 1)
                hits.append({**r, "score": score})
        hits.sort(key=lambda h: -h["score"])
        return {"results": hits[: kwargs.get("top_k", 10)]}

    @staticmethod
    def _reject_entity_params(kwargs: dict[str, Any]) -> None:
        if {"user_id", "agent_id", "app_id", "run_id"} & set(kwargs):
            raise ValueError("Top-level entity parameters are not supported")

    @staticmethod
    def _match(row: dict[str, Any], filters: dict[str, Any]) -> bool:
        return all(row.get(k) == v for cond in filters["AND"] for k, v in cond.items())


class RecordedAsyncMemoryClient(RecordedMemoryClient):
    """The same recorded fake with ``AsyncMemoryClient``'s coroutine methods."""

    async def add(self, messages: Any, options: Any = None, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return super().add(messages, options, **kwargs)

    async def get_all(self, options: Any = None, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return super().get_all(options, **kwargs)

    async def search(self, query: str, options: Any = None, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return super().search(query, options, **kwargs)


def test_recorded_fakes_match_the_real_client_signatures(mem0_module: ModuleType) -> None:
    for fake, real in (
        (RecordedMemoryClient, mem0_module.MemoryClient),
        (RecordedAsyncMemoryClient, mem0_module.AsyncMemoryClient),
    ):
        for name in ("add", "get_all", "search"):
            fake_params = list(inspect.signature(getattr(fake, name)).parameters)
            real_params = list(inspect.signature(getattr(real, name)).parameters)
            assert fake_params == real_params, (fake, name)
            assert inspect.iscoroutinefunction(getattr(fake, name)) == (
                inspect.iscoroutinefunction(getattr(real, name))
            )


def test_hosted_client_path_against_a_recorded_fake() -> None:
    client = RecordedMemoryClient()
    messages = conversation("chat-1")
    hook = Mem0Hook(client, user_id="alice")
    for batch in batches("chat-1", messages):
        hook.deliver(batch)
    adds = [kw for name, kw in client.calls if name == "add"]
    assert len(adds) == len(storable(messages))
    assert adds[0]["filters"] == {"user_id": "alice", "run_id": "chat-1"}
    assert adds[0]["infer"] is False
    assert adds[0]["metadata"][KEY_FIELD] == storable(messages)[0].key
    # One namespace scan per conversation, not one per batch.
    assert sum(1 for name, _ in client.calls if name == "get_all") == 1

    client.calls.clear()
    restarted = Mem0Hook(client, user_id="alice")
    for batch in batches("chat-1", messages):
        restarted.deliver(batch)
    assert [name for name, _ in client.calls] == ["get_all"]  # one paged scan, no add
    assert len(client.rows) == len(storable(messages))

    recall = Mem0Recall(client, user_id="alice")
    found = recall.search("chat-1", "what is my locker code", k=2)
    assert found[0].text == "my locker code is 4512" and found[0].index == 2
    search_kw = client.calls[-1][1]
    assert search_kw["filters"] == {"AND": [{"user_id": "alice"}, {"run_id": "chat-1"}]}
    assert search_kw["top_k"] == 2
    assert recall.search("chat-2", "what is my locker code") == []


async def test_hosted_async_client_path_against_a_recorded_fake() -> None:
    client = RecordedAsyncMemoryClient()
    messages = conversation("chat-1", n=20)
    hook = Mem0Hook(client)
    for batch in batches("chat-1", messages):
        await hook.adeliver(batch)
        await hook.adeliver(batch)
    assert len(client.rows) == len(storable(messages))
    found = await Mem0Recall(client).asearch("chat-1", "what is my locker code")
    assert found[0].key == messages[2].key
    with Mem0Capture(client, prompt="Only facts about the user.") as capture:
        capture.capture(turn("chat-1", 30, "user", "I play the cello"))
    add = [kw for name, kw in client.calls if name == "add"][-1]
    assert add["infer"] is True and add["custom_instructions"] == "Only facts about the user."
