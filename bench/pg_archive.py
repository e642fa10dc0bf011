"""Section 6: the PostgreSQL archive for a fleet, beside the SQLite archive.

Three measurements, each side by side with :class:`~demote.archive.sqlite.SQLiteArchive`
in the same run:

1. **Search latency** (``search(conversation, question, k=5)``, speaker and date as
   context, p50 / p99 over LoCoMo questions): one conversation of 2,000 and of 20,000
   messages (LoCoMo turns, cycled; a second conversation of a tenth of the size shares the
   table), and a table of 1,000 conversations (200 messages each, plus one of 2,000).
2. **Deliveries per second from 4 worker processes** (what fills the 1,000-conversation
   table): each process opens its own archive and delivers batches of 10 messages to its
   own conversations, as four Demoters behind a load balancer would; throughput is
   messages stored per wall-clock second, from a barrier to the last commit.
3. **LoCoMo recall** with ``bench.recall_locomo``'s protocol (the five conversations
   replayed through a 2,000-token window, evidence kept at top k and within a budget of
   recalled tokens), for the SQLite archive and the PostgreSQL one with the same options.

PostgreSQL is read from ``--dsn``, ``$DEMOTE_BENCH_POSTGRES_URL`` or
``$DEMOTE_TEST_POSTGRES_URL``; without one (or if it cannot be reached) the section says
so and is skipped. Every table it makes is dropped at the end. LoCoMo is read in place
(``$DEMOTE_LOCOMO``), never copied.

Run ``python -m bench.pg_archive`` (about 5 minutes here); ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.archive_search import corpus, fill, speaker_mapping
from bench.common import RESULTS, environment, table, write_json
from demote.archive.sqlite import SQLiteArchive
from demote.records import DemotedMessage, Demotion, fingerprint, make_key

QUERIES = 500
BATCH = 10


def postgres_url(explicit: str | None = None) -> tuple[str | None, str]:
    """The server to use and why not, if none: ``(url, reason)``."""
    url = (
        explicit
        or os.environ.get("DEMOTE_BENCH_POSTGRES_URL")
        or os.environ.get("DEMOTE_TEST_POSTGRES_URL")
    )
    if not url:
        return None, "no PostgreSQL: set DEMOTE_BENCH_POSTGRES_URL (or pass --dsn)"
    try:
        import psycopg

        psycopg.connect(url, connect_timeout=3).close()
    except Exception as exc:
        return None, f"PostgreSQL at {url} is unreachable: {' '.join(str(exc).split())}"
    return url, ""


def drop(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for suffix in ("_vectors", "_terms", "_speakers", "", "_conversations", "_erased"):
            conn.execute(f"DROP TABLE IF EXISTS {name}{suffix} CASCADE")
        for suffix in ("_settings", "_meta"):
            conn.execute(f"DROP TABLE IF EXISTS {name}{suffix}")
        conn.execute(f"DROP TEXT SEARCH CONFIGURATION IF EXISTS {name}_fts")
        conn.execute(f"DROP TEXT SEARCH DICTIONARY IF EXISTS {name}_porter")


def percentiles(took: Sequence[float]) -> dict[str, float]:
    ordered = sorted(took)
    return {
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "mean": statistics.fmean(ordered),
    }


def timed_searches(
    archive: Any, conversations: Sequence[str], queries: Sequence[str]
) -> dict[str, float]:
    """Milliseconds per search, ``queries`` spread over ``conversations`` (after a warm-up)."""
    for query in queries[:20]:
        archive.search(conversations[0], query, 5)
    took = []
    for n, query in enumerate(queries):
        began = time.perf_counter()
        archive.search(conversations[n % len(conversations)], query, 5)
        took.append((time.perf_counter() - began) * 1000)
    return percentiles(took)


# -- 2. deliveries from worker processes -----------------------------------------------------


def _batches(conversation: str, texts: Sequence[str], n: int, offset: int) -> list[Demotion]:
    out = []
    for start in range(0, n, BATCH):
        messages = []
        for i in range(start, min(n, start + BATCH)):
            role = "user" if i % 2 == 0 else "assistant"
            text = texts[(offset + i) % len(texts)]
            messages.append(
                DemotedMessage(
                    role=role,  # type: ignore[arg-type]
                    text=text,
                    index=i,
                    key=make_key(conversation, i, fingerprint(role, text)),
                    raw={"speaker": "Caroline" if i % 2 == 0 else "Melanie", "date": "8 May"},
                )
            )
        out.append(Demotion(conversation, tuple(messages)))
    return out


def _open(kind: str, where: tuple[str, str]) -> Any:
    """An archive of ``kind`` on ``where``: ``(dsn, table)`` or ``(path, "")``."""
    if kind == "postgres":
        from demote.archive.postgres import PostgresArchive

        return PostgresArchive(where[0], table=where[1], context=speaker_mapping)
    return SQLiteArchive(where[0], context=speaker_mapping, timeout=60)


def _worker(
    kind: str,
    where: tuple[str, str],
    worker: int,
    workers: int,
    plan: tuple[int, int],
    barrier: Any,
    results: Any,
) -> None:
    _, texts, _ = corpus(False)
    conversations, size = plan
    archive = _open(kind, where)
    mine = [c for c in range(conversations) if c % workers == worker]
    work = [b for c in mine for b in _batches(f"conv-{c}", texts, size, c * 37)]
    took = []
    barrier.wait()
    began = time.perf_counter()
    for b in work:
        start = time.perf_counter()
        archive.deliver(b)
        took.append(time.perf_counter() - start)
    results.put((began, time.perf_counter(), len(work), sum(len(b) for b in work), took))
    archive.close()


def deliveries(
    kind: str, where: tuple[str, str], workers: int, conversations: int, size: int
) -> dict[str, Any]:
    """Deliver ``conversations`` x ``size`` messages from ``workers`` processes."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(kind, where, w, workers, (conversations, size), barrier, results),
        )
        for w in range(workers)
    ]
    for proc in procs:
        proc.start()
    got = [results.get(timeout=3600) for _ in procs]
    for proc in procs:
        proc.join(60)
    began = min(g[0] for g in got)
    ended = max(g[1] for g in got)
    batches = sum(g[2] for g in got)
    messages = sum(g[3] for g in got)
    took = [t * 1000 for g in got for t in g[4]]
    wall = ended - began
    return {
        "workers": workers,
        "batches": batches,
        "messages": messages,
        "seconds": wall,
        "messages_per_second": messages / wall,
        "batches_per_second": batches / wall,
        "batch_ms": percentiles(took),
    }


# -- 1. search latency ----------------------------------------------------------------------


def latency(
    url: str, texts: Sequence[str], queries: Sequence[str], sizes: Sequence[int], tmp: Path
) -> list[dict[str, Any]]:
    """Search latency in one conversation of each size, both archives."""
    from demote.archive.postgres import PostgresArchive

    rows = []
    for n in sizes:
        name = f"bench_{uuid.uuid4().hex[:10]}"
        try:
            archives: dict[str, Callable[[], Any]] = {
                "SQLiteArchive": lambda n=n: SQLiteArchive(
                    tmp / f"latency-{n}.db", context=speaker_mapping
                ),
                "PostgresArchive": lambda name=name: PostgresArchive(
                    url, table=name, context=speaker_mapping
                ),
            }
            for label, make in archives.items():
                with make() as archive:
                    fill(archive, "other", texts[::-1], max(200, n // 10))
                    fill(archive, "bench", texts, n)
                    _analyze(url, name)
                    row = timed_searches(archive, ["bench"], queries)
                rows.append({"setup": label, "messages": n, "conversations": 2, **row})
        finally:
            drop(url, name)
    return rows


def _analyze(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass(%s)", (name,)).fetchone() != (None,):
            conn.execute(f"ANALYZE {name}")


def fleet(
    url: str,
    texts: Sequence[str],
    queries: Sequence[str],
    conversations: int,
    size: int,
    tmp: Path,
    workers: int = 4,
) -> dict[str, Any]:
    """``workers`` processes fill a table of ``conversations``; then search it (both archives).

    Besides the ``conversations`` of ``size`` messages the table gets one of ten times
    that size; searches go to it, and spread over every seventh small conversation.
    """
    name = f"bench_{uuid.uuid4().hex[:10]}"
    out: dict[str, Any] = {"conversations": conversations, "size": size, "deliveries": {}}
    kinds = {
        "SQLiteArchive": ("sqlite", (str(tmp / "fleet.db"), "")),
        "PostgresArchive": ("postgres", (url, name)),
    }
    try:
        for label, (kind, where) in kinds.items():
            _open(kind, where).close()  # the schema, before the workers race for it
            out["deliveries"][label] = deliveries(kind, where, workers, conversations, size)
            with _open(kind, where) as archive:
                fill(archive, "bench", texts, 10 * size)
                _analyze(url, name)
                out[f"{label}@{10 * size}"] = timed_searches(archive, ["bench"], queries)
                spread = [f"conv-{c}" for c in range(0, conversations, 7)]
                out[f"{label}@{size}"] = timed_searches(archive, spread, queries)
    finally:
        drop(url, name)
    return out


# -- 3. LoCoMo recall --------------------------------------------------------------------------


def recall(url: str) -> dict[str, Any]:
    """Evidence retained on LoCoMo, SQLite and PostgreSQL archives with the same options."""
    from bench.locomo_protocol import HELD_OUT, evaluate, rates, speaker_context
    from demote.archive.postgres import PostgresArchive

    setups: dict[str, dict[str, Any]] = {
        "plain BM25": {"coverage": 0, "neighbours": 0, "adjacent_weight": 0},
        "defaults, no context": {},
        "defaults + speaker/date context": {"context": speaker_context},
    }
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, options in setups.items():
            for kind in ("SQLiteArchive", "PostgresArchive"):
                name = f"bench_{uuid.uuid4().hex[:10]}"
                if kind == "SQLiteArchive":
                    path = Path(tmp) / f"{name}.db"
                    result = evaluate(lambda p=path, o=options: SQLiteArchive(p, **o))
                else:
                    try:
                        result = evaluate(
                            lambda n=name, o=options: PostgresArchive(url, table=n, **o)
                        )
                    finally:
                        drop(url, name)
                names = result["conversations"].keys()
                out[f"{label} / {kind}"] = {
                    "seconds": result["seconds"],
                    "all": rates(result),
                    "tuned": rates(result, [n for n in names if n not in HELD_OUT]),
                    "held_out": rates(result, [n for n in names if n in HELD_OUT]),
                }
    return out


# -- the section --------------------------------------------------------------------------------


def run(*, quick: bool, out: Path, quiet: bool, dsn: str | None = None) -> dict[str, Any]:
    """Section 6 of ``python -m bench``; skipped (and says why) without PostgreSQL."""
    began = time.perf_counter()
    url, reason = postgres_url(dsn)
    payload: dict[str, Any] = {"section": "pg_archive", "quick": quick}
    if url is None:
        payload["skipped"] = reason
        return payload
    source, texts, queries = corpus(False)
    queries = queries[: 30 if quick else QUERIES]
    payload["source"] = source
    with tempfile.TemporaryDirectory() as tmp:
        sizes = [200] if quick else [2000, 20000]
        payload["latency"] = latency(url, texts, queries, sizes, Path(tmp))
        if not quiet:
            print(f"  latency: {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
        conversations, size = (8, 20) if quick else (1000, 200)
        payload["fleet"] = fleet(url, texts, queries, conversations, size, Path(tmp))
        if not quiet:
            print(f"  fleet: {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    if not quick and source == "LoCoMo":
        payload["recall"] = recall(url)
    payload["seconds"] = time.perf_counter() - began
    payload["environment"] = environment()
    write_json("pg_archive", payload, out)
    return payload


def report(payload: dict[str, Any]) -> str:
    """The section's Markdown tables."""
    lines = ["## 6. PostgreSQL archive", ""]
    if "skipped" in payload:
        return "\n".join([*lines, f"skipped: {payload['skipped']}"])
    rows = [dict(r, where=f"{r['messages']:,} messages") for r in payload["latency"]]
    fleet_ = payload["fleet"]
    big, size = 10 * fleet_["size"], fleet_["size"]
    for label in ("SQLiteArchive", "PostgresArchive"):
        for n in (big, size):
            where = f"{fleet_['conversations']:,} conversations, one of {n:,}"
            if n == size:
                where = f"{fleet_['conversations']:,} conversations of {n:,} (spread)"
            rows.append({"setup": label, "where": where, **fleet_[f"{label}@{n}"]})
    lines += [
        f"search(k=5) latency, ms, {payload['source']} questions, speaker/date context",
        "",
        table(
            rows,
            [("setup", "archive", ""), ("where", "table", ""), ("p50", "p50", ".2f"),
             ("p99", "p99", ".2f"), ("mean", "mean", ".2f")],
        ),
        "",
    ]  # fmt: skip
    drows = [{"setup": k, **v, **{f"batch_{q}": v["batch_ms"][q] for q in ("p50", "p99")}}
             for k, v in fleet_["deliveries"].items()]  # fmt: skip
    lines += [
        f"deliveries from {drows[0]['workers']} processes, batches of {BATCH} messages",
        "",
        table(
            drows,
            [("setup", "archive", ""), ("messages", "messages", ","),
             ("messages_per_second", "messages/s", ",.0f"),
             ("batches_per_second", "batches/s", ",.0f"),
             ("batch_p50", "batch p50 ms", ".1f"), ("batch_p99", "batch p99 ms", ".1f")],
        ),
    ]  # fmt: skip
    if "recall" in payload:
        rrows = []
        for label, r in payload["recall"].items():
            a = r["all"]
            rrows.append(
                {"setup": label, **{m: a[m]["overall"] * 100 for m in ("k=5", "k=10")},
                 **{m: a[m]["overall"] * 100 for m in ("250 tok", "500 tok", "1000 tok")},
                 "tokens": a["k=5"]["tokens"]}
            )  # fmt: skip
        lines += [
            "",
            "LoCoMo evidence retained (window + recall), %, all five conversations",
            "",
            table(
                rrows,
                [("setup", "setup / archive", ""), ("k=5", "k=5", ".1f"),
                 ("tokens", "k=5 tokens", ".0f"), ("k=10", "k=10", ".1f"),
                 ("250 tok", "250 tok", ".1f"), ("500 tok", "500 tok", ".1f"),
                 ("1000 tok", "1,000 tok", ".1f")],
            ),
        ]  # fmt: skip
    lines += ["", f"{payload['seconds']:.0f} s"]
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_archive")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dsn", help="PostgreSQL URL (default: $DEMOTE_BENCH_POSTGRES_URL)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(list(argv))
    print(report(run(quick=args.quick, out=args.out, quiet=False, dsn=args.dsn)))


if __name__ == "__main__":
    main(sys.argv[1:])
