"""RedisStateStore beyond the contract: keys it writes, bad values, clients, options."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from demote import ConversationState, StoreError
from demote.state import RedisStateStore
from demote.state._codec import encode_state

S1 = ConversationState(window_start=4, delivered=4, anchor="ab")


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}:"


def test_layout_of_earlier_releases_still_reads(redis_url: str, prefix: str) -> None:
    """States written before leases had tokens are the same JSON: they read and CAS."""
    raw = redis.Redis.from_url(redis_url)
    raw.set(f"{prefix}state:a", encode_state(S1))
    raw.sadd(f"{prefix}ids", "a")
    raw.set(f"{prefix}lease:b", "old-holder", px=200)  # an old-style lease: just a holder
    raw.close()
    with RedisStateStore(redis_url, prefix=prefix) as store:
        assert store.get("a") == S1 and store.count() == 1
        assert store.acquire_lease("b", "w", 30) is None, "the old lease still excludes"
        lease = store.acquire_lease("a", "w", 30)
        assert lease is not None and lease.state == S1
        assert store.compare_and_set("a", S1, ConversationState(window_start=5), lease=lease)


@pytest.mark.parametrize(
    "value",
    ['{"window_start": "four"}', "not json", "[1, 2]", encode_state(S1).replace("4", '"4"', 1)],
)
def test_a_value_of_the_wrong_shape_is_a_store_error(
    redis_url: str, prefix: str, value: str
) -> None:
    raw = redis.Redis.from_url(redis_url)
    raw.set(f"{prefix}state:a", value)
    raw.close()
    with RedisStateStore(redis_url, prefix=prefix) as store:
        with pytest.raises(StoreError, match="corrupt"):
            store.get("a")
        with pytest.raises(StoreError):
            store.acquire_lease("a", "w", 30)


def test_a_key_of_the_wrong_type_is_a_store_error_until_cleared(
    redis_url: str, prefix: str
) -> None:
    raw = redis.Redis.from_url(redis_url)
    raw.hset(f"{prefix}state:a", "x", "y")
    raw.close()
    with RedisStateStore(redis_url, prefix=prefix) as store:
        for call in (
            lambda: store.get("a"),
            lambda: store.compare_and_set("a", None, S1),
            lambda: store.acquire_lease("a", "w", 30),
        ):
            with pytest.raises(StoreError, match="WRONGTYPE"):
                call()
        assert store.clear("a") == ConversationState(generation=1)  # clear repairs it
        assert store.acquire_lease("a", "w", 30) is not None


def test_existing_clients_are_used_and_left_open(redis_url: str, prefix: str) -> None:
    sync_client = redis.Redis.from_url(redis_url)
    async_client = redis.asyncio.Redis.from_url(redis_url)
    store = RedisStateStore(client=sync_client, async_client=async_client, prefix=prefix)

    async def main() -> ConversationState | None:
        assert await store.acompare_and_set("a", None, S1)
        got = await store.aget("a")
        await store.aclose()
        assert await async_client.ping(), "the caller's async client stays open"
        await async_client.aclose()
        return got

    assert asyncio.run(main()) == S1
    assert sync_client.ping(), "the caller's client stays open"
    sync_client.close()


def test_a_sync_client_alone_serves_the_async_twins_from_threads(
    redis_url: str, prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    store = RedisStateStore(client=client, prefix=prefix)

    async def main() -> ConversationState | None:
        assert await store.acompare_and_set("a", None, S1)
        return await store.aget("a")

    try:
        assert asyncio.run(main()) == S1
    finally:
        store.close()
        client.close()


def test_a_store_made_while_redis_is_down_fails_its_calls_not_its_construction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A worker whose Redis restarts at the wrong moment still boots: its calls fail
    # like those of a store that went down later (the engine degrades those loads).
    with caplog.at_level("WARNING", logger="demote"):
        store = RedisStateStore("redis://127.0.0.1:1/0", socket_connect_timeout=0.5, retries=1)
    try:
        assert "built without it" in caplog.text and "Connection refused" in caplog.text
        with pytest.raises(StoreError, match="ConnectionError"):
            store.get("a")
    finally:
        store.close()


def test_a_store_made_while_redis_is_down_works_once_it_answers(
    redis_url: str, prefix: str
) -> None:
    from tests.support.tcp_proxy import TcpProxy

    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with TcpProxy(port) as proxy:
        proxy.down()
        store = RedisStateStore(proxy.url("redis://", "/" + redis_url.rsplit("/", 1)[1]),
                                prefix=prefix)  # fmt: skip
        try:
            with pytest.raises(StoreError):
                store.get("a")
            proxy.restore()
            assert store.compare_and_set("a", None, S1)
            assert store.get("a") == S1
        finally:
            store.close()


def test_a_refusal_for_good_still_raises_at_construction(redis_url: str) -> None:
    with pytest.raises(StoreError, match="DB index"):
        RedisStateStore(redis_url.rsplit("/", 1)[0] + "/9999")
