"""State stores behind a TCP proxy, for outage tests: open one, take it away, give it back.

``proxied(kind, url)`` opens a Redis or PostgreSQL state store with its *default* settings
(timeouts, retries) whose every connection goes through a :class:`TcpProxy`, under a fresh
key prefix or table, and returns it with the proxy and a cleanup. ``fault(proxy, how)``
takes the store away: ``"cut"`` (connections closed, new ones refused) or ``"blackhole"``
(nothing answered). :class:`KeySink` is a hook that counts every key it is handed.
:func:`settled` and :func:`asettled` make the final load of a conversation after the
outage.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from demote.records import Demotion
from tests.support.tcp_proxy import TcpProxy

__all__ = ["HOWS", "KeySink", "asettled", "fault", "proxied", "settled", "through"]

HOWS = ["cut", "blackhole"]


def through(url: str, proxy: TcpProxy) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return f"{parts.scheme}://{auth}127.0.0.1:{proxy.port}{parts.path}"


def proxied(
    kind: str, url: str, *, down_first: str | None = None
) -> tuple[TcpProxy, Any, Callable[[], None]]:
    """A default-settings state store of ``kind`` through a new proxy, and its cleanup.

    With ``down_first`` (``"cut"`` or ``"blackhole"``), the proxy takes the server away
    before the store is made: a worker booting while its store is down.
    """
    parts = urlsplit(url)
    proxy = TcpProxy(parts.port or (6379 if kind == "redis" else 5432)).start()
    if down_first is not None:
        fault(proxy, down_first)
    via = through(url, proxy)
    store: Any
    if kind == "redis":
        from demote.state import RedisStateStore

        store = RedisStateStore(via, prefix=f"outage{uuid.uuid4().hex[:8]}:")

        def drop() -> None:
            pass  # the redis_url fixture flushes the test database
    else:
        from demote.state import PostgresStateStore
        from tests.demote.state.conftest import drop_pg_tables

        table = f"outage_{uuid.uuid4().hex[:12]}"
        store = PostgresStateStore(via, table=table)

        def drop() -> None:
            drop_pg_tables(url, table)

    def cleanup() -> None:
        proxy.restore()
        try:
            store.close()
        finally:
            proxy.close()
            drop()

    return proxy, store, cleanup


def fault(proxy: TcpProxy, how: str) -> None:
    """Take the store away: ``cut`` (stopped server) or ``blackhole`` (frozen one)."""
    if how == "cut":
        proxy.down()
    else:
        proxy.blackhole()


class KeySink:
    """A key-aware hook that counts every key it is handed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: Counter[str] = Counter()

    def deliver(self, batch: Demotion) -> None:
        with self.lock:
            self.keys.update(m.key for m in batch.messages)

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        with self.lock:
            return {k for k in keys if k in self.keys}

    # Awaited on the async path (no I/O): no hook thread is taken, so 16 tasks catching up
    # at once are not refused for want of threads (HookBusy, then retry backoff).
    async def adeliver(self, batch: Demotion) -> None:
        self.deliver(batch)

    async def ahas_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        return self.has_keys(conversation_id, keys)

    def twice(self) -> list[str]:
        with self.lock:
            return [k for k, n in self.keys.items() if n > 1]


# A chat turn that fails in the outage's last moments (a connection the cut left half-open,
# a reply starved past the 0.5 s timeout on a loaded machine) reopens the breaker for up to
# 0.6 s, so the first load after the chats stop may be skipped. The final load is made
# again past the probe interval while it is degraded, for at most this long: demotion must
# resume well within it.
RESUME_WITHIN = 2.0
#: How long a final load waits for a background delivery of its conversation to end.
SETTLE_WITHIN = 10.0


def settled(load: Callable[[], Any], store: Any) -> Any:
    """``load()`` until its window is neither degraded (past the breaker's probe) nor pending.

    Pending: the process's own background retry of the conversation (or a delivery that
    outlived ``hook_wait``) may hold its lease when the load comes, and the load then
    leaves the delivery to it; the next load finds it done. Bounded in time.
    """
    from demote.backends.breaker import breaker_of

    began = time.monotonic()
    window = load()
    while (window.degraded and time.monotonic() < began + RESUME_WITHIN) or (
        not window.degraded and window.pending and time.monotonic() < began + SETTLE_WITHIN
    ):
        time.sleep(max(0.01, breaker_of(store).retry_in()) if window.degraded else 0.05)
        window = load()
    return window


async def asettled(load: Callable[[], Awaitable[Any]], store: Any) -> Any:
    """:func:`settled` for an async load."""
    from demote.backends.breaker import breaker_of

    began = time.monotonic()
    window = await load()
    while (window.degraded and time.monotonic() < began + RESUME_WITHIN) or (
        not window.degraded and window.pending and time.monotonic() < began + SETTLE_WITHIN
    ):
        await asyncio.sleep(max(0.01, breaker_of(store).retry_in()) if window.degraded else 0.05)
        window = await load()
    return window
