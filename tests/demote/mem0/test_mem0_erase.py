"""Erase in mem0: Mem0Hook and Mem0Capture against a real offline mem0 ``Memory`` /
``AsyncMemory`` (configured as in test_mem0), and the hosted client's path against a
recorded fake of its methods (the platform is not reachable here)."""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import demote.mem0._drivers as drivers
from demote.capture import Recorder, RetryPolicy, SQLiteOutbox
from demote.erase import tiers
from demote.errors import HookError
from demote.mem0 import CONVERSATION_FIELD, Mem0Capture, Mem0Hook, Mem0Recall
from tests.demote.mem0 import test_mem0
from tests.demote.mem0.test_mem0 import (
    RecordedAsyncMemoryClient,
    RecordedMemoryClient,
    SlowExtractor,
    astored,
    batches,
    conversation,
    storable,
    stored,
    turn,
)

# test_mem0's fixtures: the offline mem0, and the guard that fails a test reaching the network.
mem0_module = test_mem0.mem0_module
make_memory = test_mem0.make_memory
network_attempts = test_mem0.network_attempts

LOCKER = "what is my locker code"


def fill(hook: Mem0Hook, cid: str, fact: str, n: int = 20) -> int:
    messages = conversation(cid, fact, n=n)
    for batch in batches(cid, messages):
        hook.deliver(batch)
    return len(storable(messages))


def test_erase_deletes_the_conversation_namespace_and_nothing_else(
    make_memory: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(drivers, "_ERASE_BATCH", 4)  # several rounds of get_all + delete
    memory = make_memory()
    hook = Mem0Hook(memory, user_id="alice")
    written = fill(hook, "chat-1", "my locker code is 1111")
    fill(hook, "chat-2", "my locker code is 2222")
    # What the application itself stored in that namespace goes too; bob's run stays.
    memory.add("my bike lock is 9090", user_id="alice", run_id="chat-1", infer=False)
    memory.add("my locker code is 3333", user_id="bob", run_id="chat-1", infer=False)

    assert hook.erase("chat-1") == written + 1
    assert stored(memory, "chat-1") == [
        r for r in stored(memory, "chat-1") if r["user_id"] == "bob"
    ]
    recall = Mem0Recall(memory, user_id="alice")
    assert recall.search("chat-1", LOCKER) == []
    assert recall.search("chat-2", LOCKER)[0].text.endswith("2222")
    assert len(stored(memory, "chat-2")) == written
    assert hook.erase("chat-1") == 0
    # The conversation can start over: the key cache forgot it.
    assert fill(hook, "chat-1", "my locker code is 1111") == len(
        [r for r in stored(memory, "chat-1") if r["user_id"] == "alice"]
    )


def test_erase_in_a_shared_namespace_deletes_only_what_demote_wrote_for_it(
    make_memory: Callable[..., Any],
) -> None:
    memory = make_memory()
    # One user's memories shared across conversations: the namespace is not chat-1's own.
    hook = Mem0Hook(memory, namespace=lambda cid: {"user_id": "alice"})
    written = fill(hook, "chat-1", "my locker code is 1111")
    kept = fill(hook, "chat-2", "my locker code is 2222")
    memory.add("alice likes tea", user_id="alice", infer=False)
    assert hook.erase("chat-1") == written
    rows = memory.get_all(filters={"user_id": "alice"}, top_k=1000)["results"]
    assert len(rows) == kept + 1
    assert not any((r.get("metadata") or {}).get(CONVERSATION_FIELD) == "chat-1" for r in rows)


async def test_async_memory_aerase_and_erase(make_memory: Callable[..., Any]) -> None:
    memory = make_memory(asynchronous=True)
    hook = Mem0Hook(memory)
    messages = conversation("chat-1", n=12)
    for batch in [*batches("chat-1", messages), *batches("chat-2", conversation("chat-2"))]:
        await hook.adeliver(batch)
    assert await hook.aerase("chat-1") == len(storable(messages))
    assert await astored(memory, "chat-1") == []
    assert await Mem0Recall(memory).asearch("chat-1", LOCKER) == []
    assert hook.erase("chat-2") > 0  # the sync method, from inside a running loop
    assert await astored(memory, "chat-2") == []


def test_mem0_failures_during_erase_are_hook_errors(make_memory: Callable[..., Any]) -> None:
    memory = make_memory()
    hook = Mem0Hook(memory)
    fill(hook, "chat-1", "my locker code is 1111", n=8)

    def refuse(memory_id: str) -> None:
        raise RuntimeError("vector store down")

    memory.delete = refuse
    with pytest.raises(HookError, match="vector store down"):
        hook.erase("chat-1")


def test_capture_tiers_drop_queued_turns_then_delete_the_memories(
    make_memory: Callable[..., Any], tmp_path: Path
) -> None:
    memory = make_memory()
    memory.llm = SlowExtractor({"Lisbon": "Lives in Lisbon", "cello": "Plays the cello"}, 0.3)
    outbox = SQLiteOutbox(tmp_path / "capture.db", retry=RetryPolicy(base_delay=30, max_delay=30))
    capture = Mem0Capture(memory, recorder=lambda sink: Recorder(sink, outbox=outbox))
    capture.capture(turn("chat-1", 1, "user", "I moved to Lisbon last year."))
    capture.capture(turn("chat-1", 3, "user", "I also play the cello."))
    capture.capture(turn("chat-2", 1, "user", "I moved to Lisbon too."))
    found = list(tiers(capture))
    assert [label for label, _ in found] == [
        "Mem0Capture[0].Recorder",
        "Mem0Capture[0].Recorder[0].Mem0Writer",
    ]
    # What an adapter's erase does: every tier in order. The first turn is being
    # extracted: the Recorder waits for it, drops the rest, then the writer deletes.
    removed = [tier.erase("chat-1") for _, tier in found]  # type: ignore[attr-defined]
    assert removed[0] == 2 and removed[1] in (0, 1)
    capture.close()
    assert stored(memory, "chat-1") == []
    assert [r["memory"] for r in stored(memory, "chat-2")] == ["Lives in Lisbon"]
    assert outbox.pending() == 0
    outbox.close()


# --------------------------------------------------------------------------- hosted client


class ErasableMemoryClient(RecordedMemoryClient):
    """The recorded fake of ``MemoryClient`` plus ``delete`` (real signature, checked)."""

    def delete(self, memory_id: str, delete_linked: bool = False) -> dict[str, Any]:
        self.calls.append(("delete", {"memory_id": memory_id, "delete_linked": delete_linked}))
        before = len(self.rows)
        self.rows = [r for r in self.rows if r["id"] != memory_id]
        if len(self.rows) == before:
            raise ValueError(f"Memory {memory_id} not found")
        return {"message": "Memory deleted successfully!"}


class AsyncErasableMemoryClient(RecordedAsyncMemoryClient, ErasableMemoryClient):
    """The same with ``AsyncMemoryClient``'s coroutine ``delete``."""

    async def delete(self, memory_id: str, delete_linked: bool = False) -> dict[str, Any]:  # type: ignore[override]
        return ErasableMemoryClient.delete(self, memory_id, delete_linked)


def test_erasable_fakes_match_the_real_delete(mem0_module: ModuleType) -> None:
    for fake, real in (
        (ErasableMemoryClient, mem0_module.MemoryClient),
        (AsyncErasableMemoryClient, mem0_module.AsyncMemoryClient),
    ):
        assert list(inspect.signature(fake.delete).parameters) == list(
            inspect.signature(real.delete).parameters
        )
        assert inspect.iscoroutinefunction(fake.delete) == inspect.iscoroutinefunction(real.delete)


def test_hosted_erase_scans_every_page_and_deletes_by_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(drivers, "_HOSTED_PAGE_SIZE", 3)
    client = ErasableMemoryClient()
    hook = Mem0Hook(client, user_id="alice")
    written = fill(hook, "chat-1", "my locker code is 1111", n=14)
    kept = fill(hook, "chat-2", "my locker code is 2222", n=14)
    client.calls.clear()
    assert hook.erase("chat-1") == written
    scans = [kw for name, kw in client.calls if name == "get_all"]
    assert all(
        kw["filters"] == {"AND": [{"user_id": "alice"}, {"run_id": "chat-1"}]} for kw in scans
    )
    assert len(scans) == -(-written // 3)  # every page, once
    deletes = [kw for name, kw in client.calls if name == "delete"]
    assert len(deletes) == written and all(kw["delete_linked"] for kw in deletes)
    assert {r["run_id"] for r in client.rows} == {"chat-2"} and len(client.rows) == kept
    assert Mem0Recall(client, user_id="alice").search("chat-1", LOCKER) == []


async def test_hosted_async_aerase_in_a_shared_namespace() -> None:
    client = AsyncErasableMemoryClient()
    hook = Mem0Hook(client, namespace=lambda cid: {"user_id": "alice"})
    for cid in ("chat-1", "chat-2"):
        for batch in batches(cid, conversation(cid, n=10)):
            await hook.adeliver(batch)
    kept = [r for r in client.rows if r["metadata"][CONVERSATION_FIELD] == "chat-2"]
    before = len(client.rows)
    assert await hook.aerase("chat-1") == before - len(kept) > 0
    assert client.rows == kept
    deletes = [kw for name, kw in client.calls if name == "delete"]
    assert deletes and not any(kw["delete_linked"] for kw in deletes), "linked may be chat-2's"


def history_rows(memory: Any, word: str) -> int:
    """Rows of mem0's own history database (read as a file) whose text holds ``word``."""
    with sqlite3.connect(f"file:{memory.config.history_db_path}?mode=ro", uri=True) as db:
        (n,) = db.execute(
            "SELECT count(*) FROM history WHERE instr(coalesce(old_memory, ''), ?) > 0"
            " OR instr(coalesce(new_memory, ''), ?) > 0",
            (word, word),
        ).fetchone()
    return int(n)


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_erase_purges_the_erased_memories_from_mem0s_own_history(
    make_memory: Callable[..., Any], asynchronous: bool
) -> None:
    memory = make_memory(asynchronous=asynchronous)
    hook = Mem0Hook(memory)
    for cid, fact in (("chat-1", "locker zebra4417"), ("chat-2", "locker heron2222")):
        for batch in batches(cid, conversation(cid, f"my {fact}", n=12)):
            await hook.adeliver(batch)
    assert history_rows(memory, "zebra4417") > 0 and history_rows(memory, "heron2222") > 0
    kept = history_rows(memory, "heron2222")

    assert await hook.aerase("chat-1") > 0

    # mem0 logged each deletion with the memory's text; those rows went with the rest,
    # and secure_delete left no copy in the file's free pages.
    assert history_rows(memory, "zebra4417") == 0
    assert b"zebra4417" not in Path(memory.config.history_db_path).read_bytes()
    assert history_rows(memory, "heron2222") == kept


def test_a_history_purge_that_fails_is_a_hook_error_not_a_complete_erase(
    make_memory: Callable[..., Any],
) -> None:
    memory = make_memory()
    hook = Mem0Hook(memory)
    for batch in batches("chat-1", conversation("chat-1", "my locker zebra4417", n=12)):
        hook.deliver(batch)
    # mem0's file, broken behind its back where only the purge looks (mem0's own delete
    # writes the history table, not the saved messages).
    memory.db.connection.execute("DROP TABLE messages")
    with pytest.raises(HookError, match="history database"):
        hook.erase("chat-1")
    assert stored(memory, "chat-1") == []  # the memories themselves went first
