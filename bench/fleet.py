"""Section 5: a fleet of worker processes on one shared state store.

N worker processes (1, 2, 4; :mod:`bench.fleet_worker`) serve 1,000 conversations on
Redis, on Postgres and on an SQLite file: each turn appends a user message and a reply to
a random conversation and loads it (a window of the newest 8 messages, cut back to 8 once
4 more came; each conversation starts with 10 messages, so a third of the turns demote).
The workers start at once and share 3,000 turns; loads/s is every load of the fleet over
the wall time from the start to the last worker's end (appends included), latency the
``Demoter.load`` call alone. Each setup runs three times, interleaved with the others.

Then, alone, every conversation is loaded once more (what is pending is delivered) and
the shared record is checked: a *duplicate* is a key delivered twice, a *loss* a message
below the final watermark that no worker delivered. Both must be 0 (leases are renewed
by the engine's keeper, fenced, and released with the commit). Round trips per load are
the state store operations each load performed (counted in a store subclass; each
operation is one round trip by the stores' design), demoting loads and others apart.

Redis and Postgres come from ``--redis``/``--postgres`` or ``DEMOTE_BENCH_REDIS_URL`` /
``DEMOTE_BENCH_POSTGRES_URL`` (else ``DEMOTE_TEST_*_URL``); without them only SQLite runs.
Keys go under a fresh prefix and tables are fresh, both removed afterwards.

Run alone with ``python -m bench.fleet [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import RESULTS, agg_backend, environment, table, write_json
from bench.fleet_worker import (
    POLICY,
    PREFILL,
    Histories,
    KeySink,
    Lengths,
    cid,
    key_of,
    open_store,
)
from demote import Demoter

SECTION = "fleet"
ROOT = Path(__file__).resolve().parents[1]


def _settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"conversations": 50, "turns": 200, "workers": [2], "repeats": 1}
    return {"conversations": 1_000, "turns": 3_000, "workers": [1, 2, 4], "repeats": 3}


def backends(redis: str | None, postgres: str | None) -> dict[str, str]:
    """The stores to run on: SQLite always, Redis and Postgres when a URL is known."""
    env = os.environ.get
    found = {"sqlite": ""}
    redis = redis or env("DEMOTE_BENCH_REDIS_URL") or env("DEMOTE_TEST_REDIS_URL")
    postgres = postgres or env("DEMOTE_BENCH_POSTGRES_URL") or env("DEMOTE_TEST_POSTGRES_URL")
    if redis:
        found["redis"] = redis
    if postgres:
        found["postgres"] = postgres
    return found


def _fresh(kind: str, url: str, tmp: Path) -> tuple[str, str, str]:
    """A new tag, and the store target and namespace of a fresh run of ``kind``."""
    tag = uuid.uuid4().hex[:8]
    if kind == "sqlite":
        return tag, str(tmp / f"state-{tag}.db"), ""
    if kind == "redis":
        return tag, url, f"bench-fleet-{tag}:"
    return tag, url, f"bench_fleet_{tag}"


def _cleanup(kind: str, target: str, namespace: str) -> None:
    if kind == "redis":
        import redis

        client = redis.Redis.from_url(target)
        keys = list(client.scan_iter(match=f"{namespace}*", count=1000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i : i + 1000])
        client.close()
    elif kind == "postgres":
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            for suffix in ("", "_lease", "_meta", "_len"):
                conn.execute(f"DROP TABLE IF EXISTS {namespace}{suffix}")
            conn.execute(f"DROP SEQUENCE IF EXISTS {namespace}_fence")


def _percentile(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100)[q - 1] if len(samples) > 1 else samples[0]


def run_one(
    kind: str, url: str, workers: int, cfg: dict[str, Any], tmp: Path
) -> tuple[dict[str, Any], list[float]]:
    """N workers on one fresh namespace: the run's figures, and every load's latency."""
    tag, target, namespace = _fresh(kind, url, tmp)
    inner = str(tmp / f"inner-{tag}.db")
    conversations = cfg["conversations"]
    try:
        open_store(kind, target, namespace).close()  # the schema, once
        lengths = Lengths(kind, target, namespace, inner)
        lengths.create(conversations, PREFILL)
        procs, outs = [], []
        for w in range(workers):
            config = {
                "kind": kind,
                "target": target,
                "namespace": namespace,
                "inner": inner,
                "conversations": conversations,
                "turns": cfg["turns"] // workers,
                "seed": w,
                "ready": str(tmp / f"ready-{tag}-{w}"),
                "go": str(tmp / f"go-{tag}"),
                "out": str(tmp / f"out-{tag}-{w}.json"),
            }
            path = tmp / f"config-{tag}-{w}.json"
            path.write_text(json.dumps(config))
            outs.append(Path(config["out"]))
            procs.append(
                subprocess.Popen([sys.executable, "-m", "bench.fleet_worker", str(path)], cwd=ROOT)
            )
        try:
            deadline = time.monotonic() + 120
            while not all((tmp / f"ready-{tag}-{w}").exists() for w in range(workers)):
                if time.monotonic() > deadline or any(p.poll() for p in procs):
                    raise RuntimeError(f"fleet workers on {kind} did not start")
                time.sleep(0.01)
            (tmp / f"go-{tag}").touch()
            for p in procs:
                if p.wait(timeout=600) != 0:
                    raise RuntimeError(f"a fleet worker on {kind} failed ({p.returncode})")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
        results = [json.loads(o.read_text()) for o in outs]
        row = _row(kind, workers, results)
        row.update(_check(kind, target, namespace, inner, conversations, results))
        lengths.close()
        return row, [x for r in results for x in r["latencies"]]
    finally:
        _cleanup(kind, target, namespace)


def _row(kind: str, workers: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = [x for r in results for x in r["latencies"]]
    loads = sum(r["loads"] for r in results)
    wall = max(r["ended"] for r in results) - min(r["began"] for r in results)
    demoting = sum(r["demoting"] for r in results)
    trips: Counter[str] = Counter()
    for r in results:
        trips.update(r["trips"])
    t_demoting = sum(r["trips_demoting"] for r in results)
    t_other = sum(r["trips_other"] for r in results)
    return {
        "store": kind,
        "workers": workers,
        "loads": loads,
        "seconds": wall,
        "loads_per_second": loads / wall,
        "mean_ms": statistics.fmean(latencies) * 1000,
        "demoting_loads": demoting,
        "trips_demoting": t_demoting,
        "trips_other": t_other,
        "trips": dict(trips),
    }


def _combine(runs: list[dict[str, Any]], latencies: list[float], floor_ms: float) -> dict[str, Any]:
    """One row of the table from the repeated runs of one setup."""
    rates = [r["loads_per_second"] for r in runs]
    sums = ("loads", "demoting_loads", "delivered", "duplicates", "lost", "pending_at_end")
    row: dict[str, Any] = {k: runs[0][k] for k in ("store", "workers")}
    row.update({k: sum(r[k] for r in runs) for k in sums})
    trips: Counter[str] = Counter()
    for r in runs:
        trips.update(r["trips"])
    t_demoting = sum(r["trips_demoting"] for r in runs)
    t_other = sum(r["trips_other"] for r in runs)
    other = row["loads"] - row["demoting_loads"]
    row.update(
        runs=len(runs),
        loads_per_second=statistics.median(rates),
        loads_per_second_range=[min(rates), max(rates)],
        p50_ms=_percentile(latencies, 50) * 1000,
        p99_ms=_percentile(latencies, 99) * 1000,
        mean_ms=statistics.fmean(latencies) * 1000,
        get_p50_ms=floor_ms,
        trips_per_load=(t_demoting + t_other) / row["loads"],
        trips_per_demoting_load=t_demoting / row["demoting_loads"]
        if row["demoting_loads"]
        else None,
        trips_per_other_load=t_other / other if other else None,
        trips=dict(trips),
    )
    return row


def _floor(kind: str, url: str, tmp: Path, n: int = 500) -> float:
    """p50 of one bare ``get`` on the store (ms): a round trip and nothing else."""
    _, target, namespace = _fresh(kind, url, tmp)
    try:
        store = open_store(kind, target, namespace)
        try:
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                store.get("c")
                samples.append(time.perf_counter() - t0)
        finally:
            store.close()
        return _percentile(samples, 50) * 1000
    finally:
        _cleanup(kind, target, namespace)


def _check(
    kind: str,
    target: str,
    namespace: str,
    inner: str,
    conversations: int,
    results: list[dict[str, Any]],
) -> dict[str, Any]:
    """Duplicates, then a final load of every conversation, then losses."""
    delivered = Counter(k for r in results for k in r["keys"])
    store = open_store(kind, target, namespace)
    lengths = Lengths(kind, target, namespace, inner)
    pending = 0
    try:
        for c in range(conversations):
            state = store.get(cid(c))
            if state is not None:
                pending += state.window_start - state.delivered
        sink = KeySink()
        demoter = Demoter(POLICY, sink, state=store)
        histories = Histories()
        for c in range(conversations):
            n = lengths.append(c, 0)
            demoter.load(cid(c), histories.of(c, n), lambda m: demoter.describe(m[0], m[1]))
        demoter.close()
        delivered.update(sink.keys)
        lost = 0
        for c in range(conversations):
            state = store.get(cid(c))
            upto = state.delivered if state is not None else 0
            lost += sum(1 for i in range(upto) if key_of(c, i) not in delivered)
    finally:
        store.close()
        lengths.close()
    return {
        "delivered": sum(delivered.values()),
        "duplicates": sum(n - 1 for n in delivered.values() if n > 1),
        "lost": lost,
        "pending_at_end": pending,
    }


def run(
    *,
    quick: bool = False,
    out: Path = RESULTS,
    quiet: bool = False,
    redis: str | None = None,
    postgres: str | None = None,
) -> dict[str, Any]:
    """Run the section; returns (and writes) its results."""
    began = time.perf_counter()
    cfg = _settings(quick)
    found = backends(redis, postgres)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    latencies: dict[tuple[str, int], list[float]] = {}
    floors = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, url in found.items():
            floors[kind] = _floor(kind, url, Path(tmp))
        for rep in range(cfg["repeats"]):  # interleaved, so the machine's noise is shared
            for kind, url in found.items():
                for workers in cfg["workers"]:
                    if not quiet:
                        print(
                            f"fleet: {kind}, {workers} worker(s), run {rep + 1}...",
                            file=sys.stderr,
                            flush=True,
                        )
                    row, samples = run_one(kind, url, workers, cfg, Path(tmp))
                    runs.setdefault((kind, workers), []).append(row)
                    latencies.setdefault((kind, workers), []).extend(samples)
    rows = [_combine(done, latencies[k], floors[k[0]]) for k, done in runs.items()]
    payload = {
        "section": SECTION,
        "quick": quick,
        "settings": cfg,
        "policy": "last_messages(8, eviction=Bulk(overflow=4))",
        "prefill_messages": PREFILL,
        "rows": rows,
        "seconds": time.perf_counter() - began,
        "environment": environment(),
    }
    payload["plot"] = _plot(payload, out)
    write_json(SECTION, payload, out)
    return payload


def _plot(payload: dict[str, Any], out: Path) -> str | None:
    agg_backend()
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    stores = sorted({r["store"] for r in payload["rows"]})
    for store in stores:
        rows = [r for r in payload["rows"] if r["store"] == store]
        n = [r["workers"] for r in rows]
        rate = [r["loads_per_second"] for r in rows]
        spread = [
            [v - r["loads_per_second_range"][0] for v, r in zip(rate, rows, strict=True)],
            [r["loads_per_second_range"][1] - v for v, r in zip(rate, rows, strict=True)],
        ]
        left.errorbar(n, rate, yerr=spread, marker="o", capsize=3, label=store)
        right.plot(n, [r["p99_ms"] for r in rows], marker="o", label=store)
    for ax, title in (
        (left, "loads/s (whole fleet; median, range of runs)"),
        (right, "p99 load latency, ms"),
    ):
        ax.set_xlabel("worker processes")
        ax.set_xticks(payload["settings"]["workers"])
        ax.set_title(title)
        ax.legend(fontsize="small")
    fig.suptitle(f"{payload['settings']['conversations']:,} conversations, 2-core machine")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "fleet.png"
    fig.savefig(path, dpi=110)
    return path.name


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(payload: dict[str, Any]) -> str:
    cfg = payload["settings"]
    lines = [
        f"## 5. Fleet ({cfg['conversations']:,} conversations, {cfg['turns']:,} turns, "
        f"{'quick, ' if payload['quick'] else ''}worker processes on this "
        f"{payload['environment']['cpus']}-core machine)",
        "",
    ]
    rows = [
        {
            **r,
            "trips": (
                f"{r['trips_per_load']:.2f} ({_fmt(r['trips_per_demoting_load'])} / "
                f"{_fmt(r['trips_per_other_load'])})"
            ),
        }
        for r in payload["rows"]
    ]
    lines.append(
        table(
            rows,
            [
                ("store", "state store", ""),
                ("workers", "workers", ""),
                ("loads_per_second", "loads/s", ",.0f"),
                ("p50_ms", "p50 load (ms)", ".2f"),
                ("p99_ms", "p99 load (ms)", ".2f"),
                ("mean_ms", "mean load (ms)", ".2f"),
                ("get_p50_ms", "p50 bare get (ms)", ".2f"),
                ("trips", "round trips / load (demoting / other)", ""),
                ("duplicates", "duplicates", ","),
                ("lost", "lost", ","),
            ],
        )
    )
    loads = sum(r["loads"] for r in payload["rows"])
    demoting = sum(r["demoting_loads"] for r in payload["rows"])
    lines += [
        "",
        f"({demoting / loads:.0%} of the loads demoted; loads/s counts each load with its "
        "append"
        + (f", median of {cfg['repeats']} interleaved runs" if cfg["repeats"] > 1 else "")
        + f"; {payload['seconds']:.0f} s)",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--redis")
    parser.add_argument("--postgres")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    print(report(run(quick=args.quick, out=args.out, redis=args.redis, postgres=args.postgres)))


if __name__ == "__main__":
    main()
