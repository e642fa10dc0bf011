"""Section 7: chat-turn latency while the state store is down, and how fast it recovers.

A steady chat runs on ``threads`` threads (one conversation each; a turn appends a user
message and a reply and loads the window, a window of the newest 8 messages cut back to
8 once 4 more came, so a third of the turns demote), about 20 turns a second per thread.
After ``before`` seconds the state store is taken away for ``outage`` seconds through a TCP
proxy on 127.0.0.1, then given back, and the chat goes on for ``after`` seconds. Two ways
of taking it away:

- **cut**: every connection is closed and new ones are refused (a stopped server);
- **black hole**: nothing is closed, nothing is answered, new connections are accepted
  and never served (a stalled load balancer, a frozen server).

The Demoter and the store run with their default settings (the store's timeouts, the
breaker's probe intervals, ``on_store_error="degrade"``). Reported for each phase (before,
during, after): p50, p99 and max of the ``Demoter.load`` call, the turns that raised
(*failed*, goal 0) and the turns served degraded; then the time from the store's return to
the first load that committed a demotion again (*resume*, goal < 1 s) and to every
conversation being caught up (nothing pending, *caught up*). At the end every conversation
is loaded once more and the sink is checked: no key delivered twice, none below the final
watermark missing.

Redis and PostgreSQL come from ``DEMOTE_BENCH_REDIS_URL`` / ``DEMOTE_BENCH_POSTGRES_URL``
(else ``DEMOTE_TEST_*_URL``); a store without one is skipped, and says so. Keys go under a
fresh prefix, tables are fresh; both are removed afterwards.

The same four runs are made with the store taken away before it is made (*at boot*: a
worker that starts while its store is down): the chat starts in the outage, the store's
tables are made by the first call that reaches it, and *before* is empty.

Other scenarios (a slow sink) plug in through :data:`SCENARIOS`: a function of
``(quick, quiet)`` returning rows with the same keys.

Run alone with ``python -m bench.outage [--quick]``.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.common import RESULTS, environment, section_main, table, write_json
from demote import Bulk, Demoter, SlidingWindow
from demote.records import Demotion, MessageRecord
from tests.support.tcp_proxy import TcpProxy

SECTION = "outage"
POLICY = SlidingWindow.last_messages(8, eviction=Bulk(overflow=4))
PHASES = ("before", "during", "after")


def _settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"threads": 4, "before": 1.0, "outage": 2.0, "after": 2.0, "pause": 0.05}
    return {"threads": 8, "before": 5.0, "outage": 10.0, "after": 10.0, "pause": 0.05}


class Sink:
    """A hook that records every key it is handed (duplicates counted)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: dict[str, int] = {}

    def deliver(self, batch: Demotion) -> None:
        with self.lock:
            for m in batch.messages:
                self.keys[m.key] = self.keys.get(m.key, 0) + 1

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        with self.lock:
            return {k for k in keys if k in self.keys}

    def duplicates(self) -> int:
        with self.lock:
            return sum(n - 1 for n in self.keys.values() if n > 1)


@dataclass
class Turn:
    at: float  # seconds since the start, when the load began
    took: float
    failed: bool
    degraded: bool
    committed: bool  # the load moved the committed window or the watermark
    pending: int


@dataclass
class Chat:
    """One conversation's history and the turns it took."""

    cid: str
    history: list[tuple[str, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)


def _url(kind: str) -> str | None:
    upper = kind.upper()
    return os.environ.get(f"DEMOTE_BENCH_{upper}_URL") or os.environ.get(f"DEMOTE_TEST_{upper}_URL")


def _open(kind: str, url: str, proxy: TcpProxy) -> tuple[Any, Callable[[], None]]:
    """A store of ``kind`` through ``proxy``, default settings, and how to clean it up."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = f"{netloc[0]}@" if len(netloc) == 2 else ""
    via = f"{parts.scheme}://{auth}127.0.0.1:{proxy.port}{parts.path}"
    if kind == "redis":
        from demote.state import RedisStateStore

        prefix = f"bench-outage-{uuid.uuid4().hex[:8]}:"
        store = RedisStateStore(via, prefix=prefix)

        def cleanup() -> None:
            import redis

            client = redis.Redis.from_url(url)
            keys = list(client.scan_iter(f"{prefix}*"))
            if keys:
                client.delete(*keys)
            client.close()

        return store, cleanup
    from demote.state import PostgresStateStore

    table_name = f"bench_outage_{uuid.uuid4().hex[:10]}"
    store = PostgresStateStore(via, table=table_name)

    def drop() -> None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            for suffix in ("", "_lease", "_meta"):
                conn.execute(f"DROP TABLE IF EXISTS {table_name}{suffix}")
            conn.execute(f"DROP SEQUENCE IF EXISTS {table_name}_fence")

    return store, drop


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _describe(demoter: Demoter) -> Callable[[tuple[str, str]], MessageRecord]:
    return lambda m: demoter.describe(m[0], m[1])


def _scenario(kind: str, how: str, quick: bool, quiet: bool, boot: bool = False) -> dict[str, Any]:
    """One steady chat through one outage: the row of the table.

    With ``boot``, the store is taken away before it is made (a worker that starts while
    its store is down): the chat starts in the outage, and "before" is empty.
    """
    url = _url(kind)
    label = f"{kind} state, {how}" + (" at boot" if boot else "")
    if url is None:
        return {"setup": label, "skipped": f"DEMOTE_BENCH_{kind.upper()}_URL not set"}
    s = _settings(quick)
    port = urlsplit(url).port or (6379 if kind == "redis" else 5432)
    proxy = TcpProxy(port).start()
    if boot:
        proxy.down() if how == "cut" else proxy.blackhole()
    store, cleanup = _open(kind, url, proxy)
    sink = Sink()
    demoter = Demoter(POLICY, sink, state=store)
    describe = _describe(demoter)
    chats = [Chat(f"c{i}") for i in range(s["threads"])]
    stop = threading.Event()
    began = time.monotonic()
    marks: dict[str, float] = {}

    def chat(c: Chat) -> None:
        n = 0
        while not stop.is_set():
            c.history.append(("user", f"question {n} of {c.cid}"))
            c.history.append(("assistant", f"answer {n} of {c.cid}"))
            n += 1
            at = time.monotonic()
            try:
                w = demoter.load(c.cid, list(c.history), describe)
            except Exception:
                c.turns.append(Turn(at - began, time.monotonic() - at, True, False, False, 0))
            else:
                took = time.monotonic() - at
                moved = any(e.kind in ("demoted", "delivered") for e in w.events)
                c.turns.append(Turn(at - began, took, False, w.degraded, moved, w.pending))
            stop.wait(s["pause"])

    threads = [threading.Thread(target=chat, args=(c,), daemon=True) for c in chats]
    try:
        for t in threads:
            t.start()
        marks["down"] = 0.0  # at boot, the chat starts in the outage
        if not boot:
            time.sleep(s["before"])
            proxy.down() if how == "cut" else proxy.blackhole()
            marks["down"] = time.monotonic() - began
        time.sleep(s["outage"])
        marks["up"] = time.monotonic() - began
        proxy.restore()
        time.sleep(s["after"])
        stop.set()
        for t in threads:
            t.join(30)
        # The final load of each conversation, alone: everything pending is delivered.
        final = {c.cid: demoter.load(c.cid, list(c.history), describe) for c in chats}
    finally:
        stop.set()
        demoter.close()
        store.close()
        proxy.close()
        cleanup()
    row: dict[str, Any] = {"setup": label, "threads": s["threads"], "outage_s": s["outage"]}
    turns = [t for c in chats for t in c.turns]
    for phase in PHASES:
        lo, hi = {
            "before": (0.0, marks["down"]),
            "during": (marks["down"], marks["up"]),
            "after": (marks["up"], float("inf")),
        }[phase]
        mine = [t for t in turns if lo <= t.at < hi]
        took = [t.took * 1000 for t in mine if not t.failed]
        row[f"{phase}_turns"] = len(mine)
        row[f"{phase}_p50_ms"] = statistics.median(took) if took else None
        row[f"{phase}_p99_ms"] = _pct(took, 0.99)
        row[f"{phase}_max_ms"] = max(took) if took else None
        row[f"{phase}_failed"] = sum(t.failed for t in mine)
        row[f"{phase}_degraded"] = sum(t.degraded for t in mine)
    up = marks["up"]
    resumed = [t.at + t.took for t in turns if t.at >= up and t.committed and not t.degraded]
    row["resume_s"] = min(resumed) - up if resumed else None
    caught = []
    for c in chats:
        # The first turn after the outage from which on the conversation stays caught up.
        later = [t for t in c.turns if t.at >= up]
        ok = None
        for t in reversed(later):
            if t.degraded or t.failed or t.pending:
                break
            ok = t.at + t.took
        caught.append(ok)
    row["caught_up_s"] = max(caught) - up if all(x is not None for x in caught) else None
    row["failed"] = sum(t.failed for t in turns)
    row["duplicates"] = sink.duplicates()
    row["lost"] = sum(
        not _held(sink, c.cid, i, c.history[i], demoter)
        for c in chats
        for i in range(final[c.cid].start)
    )
    row["final_pending"] = sum(w.pending for w in final.values())
    if not quiet:
        print(f"  {label}: done", flush=True)
    return row


def _held(sink: Sink, cid: str, index: int, message: tuple[str, str], demoter: Demoter) -> bool:
    from demote.records import make_key

    key = make_key(cid, index, demoter.describe(*message).fingerprint)
    with sink.lock:
        return key in sink.keys


def _state_outages(quick: bool, quiet: bool) -> list[dict[str, Any]]:
    return [
        _scenario(kind, how, quick, quiet)
        for kind in ("redis", "postgres")
        for how in ("cut", "black hole")
    ]


def _boot_outages(quick: bool, quiet: bool) -> list[dict[str, Any]]:
    return [
        _scenario(kind, how, quick, quiet, boot=True)
        for kind in ("redis", "postgres")
        for how in ("cut", "black hole")
    ]


#: The scenarios of this section, in order: each returns rows with the keys above.
#: A slow-sink scenario registers itself here (``SCENARIOS["slow sink"] = fn``).
SCENARIOS: dict[str, Callable[[bool, bool], list[dict[str, Any]]]] = {
    "state store": _state_outages,
    "state store down at boot": _boot_outages,
}


def run(*, quick: bool = False, out: Path = RESULTS, quiet: bool = False) -> dict[str, Any]:
    """Run every scenario; write ``outage.json``."""
    # psycopg_pool logs every refused reconnection; the table says what happened.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    rows: list[dict[str, Any]] = []
    for fn in SCENARIOS.values():
        rows.extend(fn(quick, quiet))
    payload = {
        "section": SECTION,
        "quick": quick,
        "settings": _settings(quick),
        "rows": rows,
        "environment": environment(),
    }
    write_json(SECTION, payload, out)
    return payload


def report(payload: dict[str, Any]) -> str:
    """The section's Markdown: latency per phase, failures, recovery."""
    s = payload["settings"]
    rows = [r for r in payload["rows"] if "skipped" not in r]
    skipped = [r for r in payload["rows"] if "skipped" in r]
    lines = [
        "## 8. Outage: turn latency while the state store is down",
        "",
        f"{s['threads']} threads, one conversation each, a turn every ~{s['pause'] * 1000:.0f} "
        f"ms; the store is taken away for {s['outage']:g} s after {s['before']:g} s, then "
        f"given back for {s['after']:g} s. Load latency in ms (p50 / p99 / max); "
        "default settings.",
        "",
    ]
    for r in rows:
        for phase in PHASES:
            r[f"{phase}_ms"] = "{} / {} / {}".format(
                *(
                    "n/a" if r.get(f"{phase}_{q}_ms") is None else f"{r[f'{phase}_{q}_ms']:.1f}"
                    for q in ("p50", "p99", "max")
                )
            )
    lines.append(
        table(
            rows,
            [
                ("setup", "setup", ""),
                ("before_ms", "before", ""),
                ("during_ms", "during", ""),
                ("after_ms", "after", ""),
                ("failed", "failed turns", "d"),
                ("during_degraded", "degraded turns", "d"),
                ("resume_s", "resume (s)", ".2f"),
                ("caught_up_s", "caught up (s)", ".2f"),
                ("duplicates", "delivered twice", "d"),
                ("lost", "lost", "d"),
            ],
        )
    )
    for r in skipped:
        lines.append(f"\n{r['setup']}: skipped ({r['skipped']}).")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    section_main("python -m bench.outage", run, report, argv)


if __name__ == "__main__":
    main()
