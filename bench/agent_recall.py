"""Agent retrieval check: does the recall tool's *first* search bring back an old tool result?

An agent's context is bounded: a tool result it read 50+ steps ago has been cleared or
demoted into the archive. When the agent needs a fact from it, it calls the recall tool
with a query of its own words. This measures how often that first search returns the
result that holds the fact, on deterministic traces generated offline:

- each trace is one agent conversation of ``requests`` user requests of ``steps`` tool
  steps each (read_file of settings files, run_tests, query_db, read_logs, search_docs),
  with results of ~150 to ~2,500 tokens that share most of their vocabulary (every
  settings file has the same keys, every log the same line shapes), so that a query must
  find *the* result, not *a* result;
- the trace goes through a :class:`~demote.Demoter` with a small token window, which
  archives what leaves the window (a cleared result is archived the same way: its content
  reaches the archive once, before its placeholder replaces it), into a real SQLite file
  that holds every trace (so every search is also scoped among many conversations);
- questions target results at least ``min_distance`` steps before the end of the trace.
  Each question has the query an agent would write: ``exact`` (the identifiers it
  remembers: "max_connections billing settings"), ``paraphrase`` (its own words: "how
  many connections may the billing service open"), ``tool`` (the call it made:
  "read_file services/billing/settings.toml").

Per question it records: whether the target is among the first search's hits (``hit@1``,
``hit@k``), whether it is in the answer the model reads (:func:`demote.archive.recall_tool.answer`,
the tools' own flow, within the default 500-token budget), and whether the fact's value
itself is visible in that answer (no fetch needed).

Run ``python -m bench.agent_recall`` (``--traces 40 --questions 8`` are the defaults;
``--quick`` for a smoke run), or ``python -m bench --sections 3c`` (section 3c of ``make
bench``, the defaults); it prints the table and writes ``bench/results/agent_recall.json``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS, environment, table, write_json
from demote import Demoter, SlidingWindow
from demote.archive.recall_tool import RecallOptions, answer
from demote.archive.render import CUT_MARK
from demote.archive.sqlite import SQLiteArchive
from demote.flow import drive_sync

SERVICES = ("api", "billing", "search", "auth", "worker", "gateway", "ledger", "notify")
KEYS = (
    ("max_connections", "how many connections may the {svc} service open"),
    ("pool_timeout", "how long does the {svc} pool wait before it gives up"),
    ("retry_limit", "how many times does {svc} retry a failed call"),
    ("cache_ttl", "how long does {svc} keep entries in its cache"),
    ("batch_size", "how big are the batches {svc} processes"),
    ("worker_threads", "how many threads does the {svc} service run"),
    ("queue_depth", "how deep may the {svc} queue grow"),
    ("request_deadline", "what deadline does {svc} give each request"),
)
FILLER_KEYS = tuple(
    f"{a}_{b}"
    for a in ("log", "metrics", "tls", "http", "grpc", "db", "trace", "shard")
    for b in ("level", "port", "path", "mode", "limit", "interval", "prefix")
)
MODULES = ("invoices", "payments", "accounts", "sessions", "exports", "reports", "search", "mail")
CARRIERS = ("DHL", "UPS", "FedEx", "GLS", "DPD", "Royal Mail", "PostNL", "Chronopost")
STATUSES = ("shipped", "pending", "returned", "delayed", "cancelled", "delivered")
ERRORS = (
    ("upstream timeout", "timed out after {n}s waiting for upstream {peer}"),
    ("connection refused", "connection refused by {peer} on port {n}"),
    ("certificate expired", "TLS certificate of {peer} expired {n} days ago"),
    ("disk full", "disk full on volume {peer}, {n} MB left"),
)
PEERS = ("stripe-eu", "pg-primary", "redis-cache", "s3-archive", "kafka-3", "smtp-relay")
CUSTOMERS = ("ACME", "GLOBEX", "INITECH", "UMBRELLA")
TOPICS = ("rate limits", "webhooks", "pagination", "idempotency", "retries", "batch export")


@dataclass(frozen=True)
class Message:
    """One message of a trace, in the core's terms."""

    role: str
    text: str
    opens: tuple[str, ...] = ()
    answers: str | None = None
    #: The tool a result is of, or the tool an assistant message calls.
    tool: str | None = None
    #: The call's arguments (an assistant message that calls ``tool``).
    args: dict[str, Any] | None = None


def to_data(message: Message) -> dict[str, Any]:
    """The neutral form an adapter would deliver: a call carries its name and arguments."""
    data: dict[str, Any] = {"role": message.role, "text": message.text}
    if message.args is not None:
        data["tool_calls"] = [{"id": message.opens[0], "name": message.tool, "args": message.args}]
    if message.answers is not None:
        data["tool_call_id"] = message.answers
        data["tool"] = message.tool
    return data


@dataclass(frozen=True)
class Question:
    """A fact in one tool result, and the queries an agent would search it with."""

    step: int
    index: int  # the result's position in the conversation
    value: str
    queries: dict[str, str]


def _settings(rng: random.Random, svc: str) -> tuple[str, str, str, dict[str, str]]:
    lines = [f"# settings of the {svc} service"]
    values: dict[str, str] = {}
    keys = [k for k, _ in KEYS] + rng.sample(FILLER_KEYS, rng.randint(20, 50))
    rng.shuffle(keys)
    for key in keys:
        value = str(rng.randint(2, 9000))
        values[key] = value
        lines.append(f"{key} = {value}")
        if rng.random() < 0.3:
            lines.append(f"# {key} was tuned during the {rng.choice(SERVICES)} load test")
    key, template = rng.choice(KEYS)
    queries = {
        "exact": f"{key} {svc} settings",
        "paraphrase": template.format(svc=svc),
        "tool": f"read_file services/{svc}/settings.toml {key}",
    }
    return "\n".join(lines), key, values[key], queries


def _tests(rng: random.Random, module: str) -> tuple[str, str, dict[str, str]]:
    names = [f"test_{module}_{w}" for w in rng.sample(_WORDS, 40)]
    failing = rng.choice(names)
    expected, got = f"{rng.randint(1, 999)}.{rng.randint(0, 99):02d}", f"{rng.randint(1, 999)}.00"
    lines = [f"collected {len(names)} items from tests/{module}"]
    for name in names:
        if name == failing:
            lines.append(f"{name} FAILED: assert total == {expected}, got {got}")
        else:
            lines.append(f"{name} PASSED ({rng.randint(1, 900) / 1000:.3f}s)")
    lines.append(f"1 failed, {len(names) - 1} passed")
    subject = failing.removeprefix(f"test_{module}_").replace("_", " ")
    queries = {
        "exact": f"{failing} failed assert",
        "paraphrase": f"which value did the failing {module} test about {subject} expect",
        "tool": f"run_tests {module} failed",
    }
    return "\n".join(lines), expected, queries


def _orders(rng: random.Random) -> tuple[str, str, dict[str, str]]:
    rows = []
    for _ in range(rng.randint(15, 60)):
        rows.append(
            (
                str(rng.randint(10000, 99999)),
                f"{rng.choice(CUSTOMERS)}-{rng.randint(1000, 9999)}",
                rng.choice(STATUSES),
                rng.choice(CARRIERS),
                f"{rng.randint(1000, 9999)}-{rng.randint(1000, 9999)}",
            )
        )
    order, customer, _, _, tracking = rng.choice(rows)
    lines = ["order | customer | status | carrier | tracking"]
    lines += [" | ".join(r) for r in rows]
    queries = {
        "exact": f"order {order} tracking",
        "paraphrase": f"what tracking number did the shipment of order {order} get",
        "tool": f"query_db orders customer {customer}",
    }
    return "\n".join(lines), tracking, queries


def _logs(rng: random.Random, svc: str) -> tuple[str, str, dict[str, str]]:
    kind, template = rng.choice(ERRORS)
    peer, n = rng.choice(PEERS), str(rng.randint(3, 600))
    lines = []
    error_at = rng.randint(10, 80)
    for i in range(rng.randint(40, 120)):
        stamp = (
            f"2026-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
        )
        if i == error_at:
            lines.append(f"{stamp} ERROR {svc} {template.format(n=n, peer=peer)}")
        else:
            lines.append(
                f"{stamp} INFO {svc} handled {rng.choice(('GET', 'POST'))} "
                f"/{rng.choice(_WORDS)} in {rng.randint(1, 900)}ms"
            )
    queries = {
        "exact": f"{svc} ERROR {kind} {peer}",
        "paraphrase": f"what went wrong with {peer} in the {svc} logs",
        "tool": f"read_logs {svc} error",
    }
    return "\n".join(lines), f"{template.format(n=n, peer=peer)}", queries


_WORDS = str.split(
    "rounding totals refunds currency tax discount export import retry timeout cache "
    "session token login logout profile upload download parse render notify schedule "
    "cancel archive restore merge split lock unlock audit report summary filter sort "
    "paginate webhook signature checksum locale timezone invoice ledger balance"
)


def _docs(rng: random.Random) -> tuple[str, str]:
    topic = rng.choice(TOPICS)
    body = "\n".join(
        f"result {i}: the {topic} guide says {' '.join(rng.sample(_WORDS, 14))}"
        for i in range(rng.randint(5, 25))
    )
    return body, topic


def make_trace(seed: int, requests: int, steps: int) -> tuple[list[Message], list[Question]]:
    """One agent conversation and a question per step whose result holds a fact."""
    rng = random.Random(seed)
    messages: list[Message] = []
    facts: list[Question] = []
    step = 0
    for r in range(requests):
        messages.append(Message("user", f"request {r}: continue the release checklist"))
        for _ in range(steps):
            call = f"s{seed}-{step}"
            kind = rng.choice(("settings", "tests", "orders", "logs", "docs"))
            svc = rng.choice(SERVICES)
            value, queries = "", {}
            # The call as an agent makes it: the tool's name and its arguments.
            tool: str
            args: dict[str, Any]
            if kind == "settings":
                body, _, value, queries = _settings(rng, svc)
                tool, args = "read_file", {"path": f"services/{svc}/settings.toml"}
            elif kind == "tests":
                module = rng.choice(MODULES)
                body, value, queries = _tests(rng, module)
                tool, args = "run_tests", {"path": f"tests/{module}", "verbose": True}
            elif kind == "orders":
                body, value, queries = _orders(rng)
                tool, args = "query_db", {"sql": "SELECT * FROM orders WHERE updated > :since"}
            elif kind == "logs":
                body, value, queries = _logs(rng, svc)
                tool, args = "read_logs", {"service": svc, "since": "24h"}
            else:
                body, topic = _docs(rng)
                tool, args = "search_docs", {"query": topic}
            messages.append(Message("assistant", "", opens=(call,), tool=tool, args=args))
            messages.append(Message("tool", body, answers=call, tool=tool))
            if queries:
                facts.append(Question(step, len(messages) - 1, value, queries))
            step += 1
        messages.append(Message("assistant", f"request {r} done"))
    return messages, facts


@dataclass
class Outcome:
    kind: str
    distance: int
    hit1: bool
    hitk: bool
    shown: bool
    value_shown: bool
    tokens: int
    seconds: float


def archive_traces(
    archive: SQLiteArchive, traces: int, requests: int, steps: int
) -> list[tuple[str, list[Question]]]:
    """Run every trace through a Demoter with a small window into ``archive``."""
    demoter = Demoter(SlidingWindow.last_tokens(4000), archive, on_hook_error="raise")
    built = []
    for t in range(traces):
        cid = f"agent-{t}"
        messages, facts = make_trace(t, requests, steps)
        demoter.load(
            cid,
            messages,
            lambda m: demoter.describe(
                m.role,
                m.text,
                opens=m.opens,
                answers=m.answers,
                tool=m.tool,
                calls=[{"id": m.opens[0], "name": m.tool, "args": m.args}] if m.args else (),
                to_data=to_data,
            ),
        )
        built.append((cid, facts))
    return built


def ask(
    archive: SQLiteArchive,
    cid: str,
    fact: Question,
    target: str,
    distance: int,
    options: RecallOptions,
) -> list[Outcome]:
    """Each of the fact's queries, as the recall tool's first search."""
    k = options.k
    outcomes = []
    for kind, query in fact.queries.items():
        ranked = [h.key for h in archive.search(cid, query, k)]
        [whole] = [r.text for r in archive.messages(cid) if r.key == target]
        began = time.perf_counter()
        text = drive_sync(answer(archive, cid, options, query=query))
        seconds = time.perf_counter() - began
        shown = CUT_MARK.format(key=target) in text or whole in text
        outcomes.append(
            Outcome(
                kind,
                distance,
                ranked[:1] == [target],
                target in ranked,
                shown,
                shown and fact.value in text,
                options.counter(text),
                seconds,
            )
        )
    return outcomes


def run(
    traces: int,
    questions: int,
    requests: int,
    steps: int,
    min_distance: int,
    k: int,
    snippets: bool = True,
) -> dict[str, Any]:
    """Build the traces, ask the questions, summarize."""
    outcomes: list[Outcome] = []
    archived = 0
    total_steps = requests * steps
    with (
        tempfile.TemporaryDirectory(prefix="demote-agent-recall-") as folder,
        SQLiteArchive(Path(folder) / "archive.db") as archive,
    ):
        for cid, facts in archive_traces(archive, traces, requests, steps):
            keys = {r.index: r.key for r in archive.messages(cid)}
            archived += len(keys)
            eligible = [
                f for f in facts if total_steps - f.step >= min_distance and f.index in keys
            ]
            rng = random.Random(cid)
            for fact in rng.sample(eligible, min(questions, len(eligible))):
                distance = total_steps - fact.step
                options = RecallOptions(k=k, snippets=snippets)
                outcomes += ask(archive, cid, fact, keys[fact.index], distance, options)
    return {**summarize(outcomes, traces, archived, k), "snippets": snippets}


def _rate(items: Sequence[Outcome], field: str) -> float:
    return round(100 * sum(getattr(o, field) for o in items) / len(items), 1) if items else 0.0


def summarize(outcomes: list[Outcome], traces: int, archived: int, k: int) -> dict[str, Any]:
    rows = []
    for kind in ("exact", "paraphrase", "tool", "all"):
        items = [o for o in outcomes if kind in ("all", o.kind)]
        rows.append(
            {
                "query": kind,
                "questions": len(items),
                "hit@1": _rate(items, "hit1"),
                f"hit@{k}": _rate(items, "hitk"),
                "in answer": _rate(items, "shown"),
                "value shown": _rate(items, "value_shown"),
                "tokens p50": int(statistics.median(o.tokens for o in items)) if items else 0,
                "ms p50": round(1000 * statistics.median(o.seconds for o in items), 2)
                if items
                else 0.0,
            }
        )
    distances = [o.distance for o in outcomes]
    return {
        "traces": traces,
        "archived_messages": archived,
        "min_distance_steps": min(distances) if distances else 0,
        "median_distance_steps": statistics.median(distances) if distances else 0,
        "k": k,
        "rows": rows,
    }


def report(result: dict[str, Any]) -> str:
    """The table (Markdown), with what was measured in its heading."""
    columns = [(name, name, "") for name in result["rows"][0]]
    head = (
        f"## 3c. Agent recall: the recall tool's first search, {result['traces']} traces, "
        f"{result['archived_messages']} archived messages, distance >= "
        f"{result['min_distance_steps']} steps (median {result['median_distance_steps']}), "
        f"k={result['k']}, {'snippets' if result['snippets'] else 'heads'}"
    )
    return f"{head}\n{table(result['rows'], columns)}"


def section(*, quick: bool = False, out: Path = RESULTS, quiet: bool = False) -> dict[str, Any]:
    """Section 3c of ``make bench``: the defaults (``quick``: 3 traces of 3 questions)."""
    traces, questions = (3, 3) if quick else (40, 8)
    result = run(traces, questions, 10, 12, 50, 5)
    write_json("agent_recall", {**result, "quick": quick, "environment": environment()}, out)
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_recall", description=__doc__)
    parser.add_argument("--traces", type=int, default=40)
    parser.add_argument("--questions", type=int, default=8, help="facts asked per trace")
    parser.add_argument("--requests", type=int, default=10, help="user requests per trace")
    parser.add_argument("--steps", type=int, default=12, help="tool steps per request")
    parser.add_argument("--min-distance", type=int, default=50, help="steps before the end")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument(
        "--head", action="store_true", help="show long hits by their head, not snippets"
    )
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.traces, args.questions = 3, 3
    result = run(
        args.traces,
        args.questions,
        args.requests,
        args.steps,
        args.min_distance,
        args.k,
        snippets=not args.head,
    )
    print(report(result))
    name = "agent_recall" if result["snippets"] else "agent_recall_heads"
    write_json(name, {**result, "quick": args.quick, "environment": environment()}, args.out)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
