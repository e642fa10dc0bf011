"""No blocking call on the event loop: the async paths under an event-loop blocking detector.

``blockbuster`` patches the blocking primitives (socket and file I/O, sqlite3, time.sleep,
a contended lock, ...) and raises when one is called on a thread running an event loop from
a frame of ours. Each case runs ``Demoter.aload`` and both adapters' async methods, with
every state store (in memory, an SQLite file, Redis, Postgres) and a sync hook (the SQLite
archive, run on the engine's own threads), through demotions, deliveries, a failing hook,
recall and clears.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

blockbuster = pytest.importorskip("blockbuster")

from demote import (  # noqa: E402
    Backoff,
    CallbackHook,
    Demoter,
    Demotion,
    FanOutHook,
    InMemoryStateStore,
    PostgresStateStore,
    RedisStateStore,
    SlidingWindow,
    SQLiteArchive,
    SQLiteStateStore,
)
from tests.strategies import Msg, describer, unique  # noqa: E402

OURS = ["demote", "langchain_demote", "llamaindex_demote"]


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    made: list[Any] = []
    kind = request.param

    def make() -> Any:
        if kind == "memory":
            store: Any = InMemoryStateStore()
        elif kind == "sqlite":
            store = SQLiteStateStore(tmp_path / "state.db")
        elif kind == "redis":
            url = request.getfixturevalue("redis_url")
            store = RedisStateStore(url, prefix=f"bb{uuid.uuid4().hex[:8]}:")
        else:
            url = request.getfixturevalue("postgres_url")
            store = PostgresStateStore(url, table=f"bb_{uuid.uuid4().hex[:12]}")
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@contextmanager
def detector() -> Iterator[None]:
    """Blocking calls from our frames on the loop raise from here on (objects are built
    before: opening a file or a pool is a constructor's business, not a turn's).

    One exception, not ours: redis-py reads its own version from the package metadata
    (an ``os.stat``) each time it opens an async connection.
    """
    with blockbuster.blockbuster_ctx(OURS) as bb:
        bb.functions["os.stat"].can_block_in("redis/driver_info.py", "__post_init__")
        yield


async def _close(d: Demoter, archive: SQLiteArchive) -> None:
    # Async clients belong to this test's loop: close them on it, before it ends.
    aclose = getattr(d.state, "aclose", None)
    if aclose is not None:
        await aclose()
    archive.close()
    d.close()


def _turns(n: int, tag: str) -> list[Msg]:
    return unique([Msg(("user", "assistant")[i % 2], f"turn {i} about {tag}") for i in range(n)])


async def test_aload_never_blocks_the_loop(
    store_factory: Callable[[], Any], tmp_path: Path
) -> None:
    failing = {"on": True}

    async def flaky(batch: Demotion) -> None:
        if failing["on"]:
            raise RuntimeError("down")

    archive = SQLiteArchive(tmp_path / "archive.db")
    d = Demoter(
        SlidingWindow.last_messages(4),
        FanOutHook(archive, CallbackHook(flaky)),
        state=store_factory(),
        retry=Backoff(0, 0),
        hook_timeout=5,
    )
    history: list[Msg] = []
    with detector():
        for i in range(12):
            history += _turns(2, f"t{i}")
            w = await d.aload("c", history, describer(d))
            assert len(w.messages) <= 4
            if i == 5:
                failing["on"] = False
        assert w.pending == 0 and w.delivered == w.start
        stats = await d.aconversation_stats("c")
        assert stats.pending == 0
        await d.aclear("c")
        assert (await d.astate_of("c")).window_start == 0
        await d.aforget("c")
    await _close(d, archive)


async def test_the_langchain_history_never_blocks_the_loop(
    store_factory: Callable[[], Any], tmp_path: Path
) -> None:
    from langchain_core.chat_history import InMemoryChatMessageHistory
    from langchain_core.messages import AIMessage, HumanMessage

    from langchain_demote import DemotingChatMessageHistory

    archive = SQLiteArchive(tmp_path / "archive.db")
    d = Demoter(SlidingWindow.last_messages(4), archive, state=store_factory())
    history = DemotingChatMessageHistory(InMemoryChatMessageHistory(), d, "lc")
    with detector():
        for i in range(8):
            await history.aadd_messages([HumanMessage(f"question {i}"), AIMessage(f"answer {i}")])
            assert len(await history.aget_messages()) <= 4
        assert len(await history.aget_all_messages()) == 16
        await history.aclear()
        assert await history.aget_messages() == []
    await _close(d, archive)


async def test_the_agents_middleware_never_blocks_the_loop(
    store_factory: Callable[[], Any], tmp_path: Path
) -> None:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langgraph.checkpoint.memory import InMemorySaver

    from langchain_demote import DemotingMiddleware

    archive = SQLiteArchive(tmp_path / "archive.db")
    d = Demoter(SlidingWindow.last_messages(4), archive, state=store_factory())
    agent = create_agent(
        FakeListChatModel(responses=["ok"] * 20),
        [],
        checkpointer=InMemorySaver(),
        middleware=[DemotingMiddleware(demoter=d, prune_state=True)],
    )
    config = {"configurable": {"thread_id": "agent"}}
    with detector():
        for i in range(6):
            await agent.ainvoke({"messages": [{"role": "user", "content": f"q{i}"}]}, config)
        assert (await d.astate_of("agent")).delivered > 0
    await _close(d, archive)


async def test_the_llamaindex_memory_never_blocks_the_loop(
    store_factory: Callable[[], Any], tmp_path: Path
) -> None:
    from llama_index.core.llms import ChatMessage

    from llamaindex_demote import DemotingMemory

    archive = SQLiteArchive(tmp_path / "archive.db")
    d = Demoter(SlidingWindow.last_messages(4), archive, state=store_factory())
    memory = DemotingMemory.from_defaults(demoter=d, chat_store_key="li")
    with detector():
        for i in range(8):
            await memory.aput_messages(
                [
                    ChatMessage(role="user", content=f"q{i}"),
                    ChatMessage(role="assistant", content="a"),
                ]
            )
            assert len(await memory.aget()) <= 4
        assert len(await memory.aget_all()) == 16
        await memory.areset()
        assert await memory.aget() == []
    await _close(d, archive)


def test_the_detector_is_live() -> None:
    # The control: a blocking call from a frame of ours on the loop is caught.
    import asyncio
    import time

    async def main() -> None:
        from demote import flow as _flow

        with detector():
            await _flow.Sleep(0.001).run_async()  # fine: awaited
            with pytest.raises(blockbuster.BlockingError):
                _flow.Sleep(0.001).run_sync()  # time.sleep on the loop

    asyncio.run(main())
    time.sleep(0)
