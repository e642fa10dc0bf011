"""Latency of single state store operations, per store, sync and async.

``python -m bench.state_ops [--n 2000] [--redis URL] [--postgres URL]``

For each store (SQLite file; Redis and Postgres when their URL is given) it times get,
compare-and-set, acquire, fenced compare-and-set with release, and clear, on one
conversation, one call at a time, and prints p50/p99 in microseconds. Redis keys go under
a fresh prefix, Postgres into a fresh table that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from demote import ConversationState
from demote.state import PostgresStateStore, RedisStateStore, SQLiteStateStore


def _pct(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100)[q - 1] * 1e6 if len(samples) > 1 else 0.0


def _time(call: Callable[[int], Any], n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        out.append(time.perf_counter() - t0)
    return out


async def _atime(call: Callable[[int], Awaitable[Any]], n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await call(i)
        out.append(time.perf_counter() - t0)
    return out


def measure(name: str, store: Any, n: int) -> None:
    """Print p50/p99 of each operation on ``store``."""
    s = [ConversationState(window_start=i, delivered=i) for i in range(2 * n + 2)]
    store.compare_and_set("c", None, s[0])
    ops: dict[str, list[float]] = {"get": _time(lambda i: store.get("c"), n)}
    ops["cas"] = _time(lambda i: store.compare_and_set("c", s[i], s[i + 1]), n)
    store.delete("c")
    store.compare_and_set("c", None, s[0])

    leases: list[Any] = []
    ops["acquire"] = _time(lambda i: leases.append(store.acquire_lease(f"l{i}", "w", 30)), n)

    def fenced(i: int) -> None:
        lease = leases[i]
        assert store.compare_and_set(f"l{i}", None, s[1], lease=lease, release=True)

    ops["fenced cas+release"] = _time(fenced, n)
    ops["clear"] = _time(lambda i: store.clear(f"l{i}"), n)

    async def async_ops() -> None:
        ops["aget"] = await _atime(lambda i: store.aget("c"), n)
        ops["acas"] = await _atime(lambda i: store.acompare_and_set("c", s[n + i], s[n + i + 1]), n)
        await store.aclose()

    store.delete("c")
    store.compare_and_set("c", None, s[n])
    asyncio.run(async_ops())
    for op, samples in ops.items():
        print(f"{name:9} {op:20} p50 {_pct(samples, 50):8.1f} us   p99 {_pct(samples, 99):8.1f} us")


def main() -> None:
    """Run the measurements."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--redis")
    parser.add_argument("--postgres")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        measure("sqlite", SQLiteStateStore(Path(tmp) / "s.db"), args.n)
    if args.redis:
        measure("redis", RedisStateStore(args.redis, prefix=f"b{uuid.uuid4().hex[:6]}:"), args.n)
    if args.postgres:
        table = f"bench_{uuid.uuid4().hex[:8]}"
        try:
            measure("postgres", PostgresStateStore(args.postgres, table=table), args.n)
        finally:
            import psycopg

            with psycopg.connect(args.postgres, autocommit=True) as conn:
                for suffix in ("", "_lease", "_meta"):
                    conn.execute(f"DROP TABLE IF EXISTS {table}{suffix}")
                conn.execute(f"DROP SEQUENCE IF EXISTS {table}_fence")


if __name__ == "__main__":
    main()
