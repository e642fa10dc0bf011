"""Section 7: agents on recorded runs. What each memory setup sends, costs and keeps.

The development set of recorded agent runs (:mod:`bench.real_traces`, 31 runs from 5
public repositories, 29 of which ``create_agent`` can replay) is replayed call by call
through LangChain's own ``create_agent`` (:func:`bench.agent_run.replay`): the model
answers with the recorded assistant messages, the tools with the recorded results, and
every setup's middleware runs its own code on the agent's real requests. A second table
replays the same runs chained into long sessions (:func:`bench.real_traces.chain`).

Setups (:data:`SETUPS`, a dict of factories in :mod:`bench.agents_real_setups`: add one
line to add a setup), at each limit ``L``:

- ``demote``: ``DemotingMiddleware(Demoter(SlidingWindow.last_tokens(L), SQLiteArchive))``,
  every other option at its default (whatever the default eviction is);
- ``demote PerItem``: the same with ``eviction=PerItem()``;
- ``demote Bulk L/2+L/2``: ``last_tokens(L // 2, eviction=Bulk(overflow=L // 2))``, the
  same peak;
- ``demote clearing (README)``: the README's agent policy scaled to ``L``
  (``ClearToolResults(trigger=L // 2, keep=3, clear_at_least=L // 8)``);
- ``SummarizationMiddleware``: ``trigger=("tokens", L)``, ``keep=("tokens", L // 2)``, its
  summary calls (a scripted model, 200-token summaries) billed too;
- ``ContextEditingMiddleware``: ``ClearToolUsesEdit(trigger=L, keep=3)``;
- ``trim_messages``: ``strategy="last"``, ``count_tokens_approximately``, ``max_tokens=L``
  on every model call;
- ``no memory``: ``create_agent`` alone (the reference of billed and grounded).

Figures per setup (:mod:`bench.agent_metrics` has the definitions): mean peak / limit
over runs, p95 of all calls, calls over the limit, invalid requests, billed relative to no
memory in both price shapes (the mean of per-run ratios is the headline, the ratio of
totals beside it) and grounded (pooled over all pieces: the headline; mean of per-run
shares beside it). ``python -m bench.agents_real --limit 4000 --setup demote`` runs one
setup in a few seconds; ``python -m bench --sections 7`` runs the section.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import agent_metrics as metrics
from bench.agent_run import AgentRun
from bench.agents_real_setups import BASELINE, SETUPS, run_one
from bench.common import RESULTS, environment, progress, table, write_json
from bench.real_traces import (
    RealTrace,
    chain,
    held_out,
    load,
    sessions_dir,
    shown,
    traces_dir,
)

SECTION = "agents_real"
LIMITS = (4_000, 8_000)
#: The long sessions' limits (issue 36).
SESSION_LIMITS = (4_000, 8_000, 16_000, 32_000)
#: The setups run on the long sessions (trim_messages is left out: it sends invalid
#: requests, section 7's short runs show it).
SESSION_SETUPS = (
    "demote",
    "demote PerItem",
    "demote Bulk L/2+L/2",
    "demote clearing (README)",
    "SummarizationMiddleware",
    "ContextEditingMiddleware",
)


def measure(
    trace: RealTrace,
    run: AgentRun,
    summaries: Sequence[Any],
    limit: int,
    checker: metrics.Checker,
) -> dict[str, Any]:
    """The figures of one replayed run (absolute; ratios are taken against no memory)."""
    count = checker.count
    sizes = metrics.call_tokens(run.requests, run.tools, count)
    ground = metrics.grounded(trace.messages, trace.replies, run.requests)
    return {
        **metrics.size_stats(sizes, limit),
        "sizes": sizes,
        "invalid": checker.invalid(run.requests),
        "billed": metrics.run_billed(run.requests, summaries, tools=run.tools, count=count),
        "summary_calls": len(summaries),
        "found": ground.found,
        "in_context": ground.in_context,
        "pieces": ground.pieces,
        "worst_over": max((s - limit for s in sizes if s > limit), default=0),
    }


def aggregate(label: str, limit: int, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One setup's figures over runs (``rows`` carry ``base_billed``, no memory's bill)."""
    sizes = sorted(s for r in rows for s in r["sizes"])
    calls = len(sizes)
    out: dict[str, Any] = {
        "setup": label,
        "limit": limit,
        "runs": len(rows),
        "calls": calls,
        "peak_x": statistics.fmean(r["peak_x"] for r in rows),
        "max_peak_x": max(r["peak_x"] for r in rows),
        "p95": metrics.size_stats(sizes, limit)["p95"],
        "over": sum(r["over"] for r in rows),
        "over_share": sum(r["over"] for r in rows) / calls if calls else 0.0,
        "invalid": sum(r["invalid"] for r in rows),
        "worst_over": max(r.get("worst_over", 0) for r in rows),
        "overhang_events": sum(r.get("overhang_events", 0) for r in rows),
        "summary_calls": sum(r["summary_calls"] for r in rows),
        "seconds": sum(r["seconds"] for r in rows),
    }
    out["p95_x"] = out["p95"] / limit
    for shape in metrics.PRICINGS:
        ratios = [r["billed"][shape] / r["base_billed"][shape] for r in rows]
        out[f"billed_{shape}"] = statistics.fmean(ratios)
        out[f"billed_{shape}_total"] = sum(r["billed"][shape] for r in rows) / sum(
            r["base_billed"][shape] for r in rows
        )
    pieces = sum(r["pieces"] for r in rows)
    out["grounded"] = sum(r["found"] for r in rows) / pieces if pieces else None
    out["grounded_context"] = sum(r["in_context"] for r in rows) / pieces if pieces else None
    shares = [r["found"] / r["pieces"] for r in rows if r["pieces"]]
    out["grounded_run_mean"] = statistics.fmean(shares) if shares else None
    out["pieces"] = pieces
    return out


def runs(
    traces: Sequence[RealTrace],
    limits: Sequence[int],
    setups: Sequence[str],
    *,
    quiet: bool = False,
    desc: str = "",
) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """Every setup at every limit over ``traces``: each run's figures, by (limit, setup)."""
    wanted = [s for s in SETUPS if s in setups or s == BASELINE]
    per: dict[tuple[int, str], list[dict[str, Any]]] = {}
    log = logging.getLogger("demote")
    level = log.level
    log.setLevel(logging.ERROR)  # a window over its bound warns at each call; counted here
    try:
        for trace in progress(list(traces), desc or "traces", quiet):
            checker = metrics.Checker()  # per trace: setups repeat each other's requests
            base: dict[str, float] | None = None
            for label in sorted(wanted, key=lambda s: s != BASELINE):  # the baseline first
                for limit in limits:
                    if label == BASELINE and base is not None:
                        row = dict(per[(limits[0], BASELINE)][-1])
                        row.update(metrics.size_stats(row["sizes"], limit), limit=limit)
                        row["worst_over"] = max(
                            (s - limit for s in row["sizes"] if s > limit), default=0
                        )
                    else:
                        overhangs: list[int] = []
                        run, summaries, seconds = run_one(trace, SETUPS[label], limit, overhangs)
                        row = measure(trace, run, summaries, limit, checker)
                        row.update(trace=trace.name, limit=limit, seconds=seconds)
                        row["overhang_events"] = len(overhangs)
                    row["held_out"] = held_out(trace)
                    if label == BASELINE:
                        base = row["billed"]
                    row["base_billed"] = base
                    per.setdefault((limit, label), []).append(row)
    finally:
        log.setLevel(level)
    return per


def bench(
    traces: Sequence[RealTrace],
    limits: Sequence[int],
    setups: Sequence[str],
    *,
    quiet: bool = False,
    desc: str = "",
) -> list[dict[str, Any]]:
    """Every setup at every limit over ``traces``; one aggregated row per (limit, setup)."""
    per = runs(traces, limits, setups, quiet=quiet, desc=desc)
    return [aggregate(label, limit, rows) for (limit, label), rows in _ordered(per)]


def _ordered(
    per: dict[tuple[int, str], list[dict[str, Any]]],
) -> list[tuple[tuple[int, str], list[dict[str, Any]]]]:
    """``per``'s items by limit, then in :data:`SETUPS` order."""
    order = {label: i for i, label in enumerate(SETUPS)}
    return sorted(per.items(), key=lambda kv: (kv[0][0], order[kv[0][1]]))


def split(per: dict[tuple[int, str], list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Aggregated rows over all runs, the tuned ones and the held-out ones (issue 36)."""
    out: dict[str, list[dict[str, Any]]] = {"all": [], "tuned": [], "held out": []}
    for (limit, label), rows in _ordered(per):
        out["all"].append(aggregate(label, limit, rows))
        for part, held in (("tuned", False), ("held out", True)):
            some = [r for r in rows if r["held_out"] is held]
            if some:
                out[part].append(aggregate(label, limit, some))
    return out


def run(
    *,
    quick: bool = False,
    out: Path = RESULTS,
    quiet: bool = False,
    limits: Sequence[int] | None = None,
    setups: Sequence[str] | None = None,
    directory: Path | None = None,
    long_runs: bool = True,
    sessions: Path | None = None,
) -> dict[str, Any]:
    """Run the section (dev set, long runs, long sessions); returns (and writes) it."""
    began = time.perf_counter()
    traces, skipped = load(directory, limit=2 if quick else None)
    limits = tuple(limits or ((4_000,) if quick else LIMITS))
    setups = list(setups or SETUPS)
    payload: dict[str, Any] = {
        "section": SECTION,
        "data": shown(directory or traces_dir()),
        "limits": list(limits),
        "quick": quick,
        "skipped": skipped,
        "traces": [t.summary() for t in traces],
        "rows": bench(traces, limits, setups, quiet=quiet, desc="dev runs"),
    }
    if long_runs and not quick:
        chained = chain(traces)
        payload["long_traces"] = [t.summary() for t in chained]
        payload["long_rows"] = bench(chained, limits, setups, quiet=quiet, desc="long runs")
    folder = sessions or sessions_dir()
    if folder.is_dir():
        payload.update(
            long_sessions(folder, quick=quick, quiet=quiet, setups=setups if sessions else None)
        )
    payload["seconds"] = time.perf_counter() - began
    payload["environment"] = environment()
    write_json(SECTION, payload, out)
    plot(payload, out)
    return payload


def long_sessions(
    folder: Path,
    *,
    quick: bool = False,
    quiet: bool = False,
    limits: Sequence[int] | None = None,
    setups: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The long sessions (issue 36): every session setup at every session limit.

    Rows over all sessions, the tuned ones and the held-out ones (:func:`split`). Quick: one
    session, at 4,000 tokens, the default and no memory.
    """
    began = time.perf_counter()
    traces, skipped = load(folder, limit=1 if quick else None)
    limits = tuple(limits or ((4_000,) if quick else SESSION_LIMITS))
    chosen = list(setups or (("demote",) if quick else SESSION_SETUPS))
    per = runs(traces, limits, chosen, quiet=quiet, desc="long sessions")
    parts = split(per)
    return {
        "sessions_data": shown(folder),
        "session_limits": list(limits),
        "sessions_skipped": skipped,
        "sessions": [{**t.summary(), "held_out": held_out(t)} for t in traces],
        "session_rows": parts["all"],
        "session_rows_tuned": parts["tuned"],
        "session_rows_held_out": parts["held out"],
        "sessions_seconds": time.perf_counter() - began,
    }


def plot(payload: dict[str, Any], out: Path = RESULTS) -> Path | None:
    """Billed (Anthropic) against grounded in context, per setup and limit (issue 36).

    One panel per set (the short development runs, the chained long runs, the long
    sessions); None without matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    tables = [("short development runs", payload["rows"])]
    if payload.get("long_rows"):
        tables.append(("long runs (chained)", payload["long_rows"]))
    if payload.get("session_rows"):
        tables.append(("long sessions", payload["session_rows"]))
    fig, axes = plt.subplots(1, len(tables), figsize=(6.5 * len(tables), 5), squeeze=False)
    limits = sorted({r["limit"] for _, rows in tables for r in rows})
    markers = {limit: m for limit, m in zip(limits, "os^D", strict=False)}
    # One color per setup across the panels (the legend is the last panel's).
    colors = {s: plt.get_cmap("tab10")(i) for i, s in enumerate(SETUPS)}
    for ax, (title, rows) in zip(axes[0], tables, strict=True):
        for r in rows:
            if r.get("grounded_context") is None:
                continue
            ax.scatter(
                100 * r["grounded_context"],
                r["billed_anthropic"],
                color=colors[r["setup"]],
                marker=markers[r["limit"]],
                s=60,
                label=f"{r['setup']} @ {r['limit']:,}",
            )
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("grounded in context (% of copied pieces sent beside their words)")
        ax.set_ylabel("billed vs no memory (Anthropic caching)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{SECTION}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


COLUMNS = [
    ("setup", "setup", ""),
    ("peak_x", "peak/limit", ".2f"),
    ("p95", "p95", ",.0f"),
    ("over", "over limit", ","),
    ("over_pct", "(%)", ".1f"),
    ("worst_over", "worst excess", ","),
    ("invalid", "invalid", ","),
    ("billed_anthropic", "billed Anthropic", ".2f"),
    ("billed_anthropic_total", "(total)", ".2f"),
    ("billed_openai", "billed OpenAI", ".2f"),
    ("billed_openai_total", "(total)", ".2f"),
    ("grounded_pct", "grounded", ".1f"),
    ("grounded_run_pct", "(run mean)", ".1f"),
    ("context_pct", "in context", ".1f"),
]


def _tables(rows: Sequence[dict[str, Any]], limits: Sequence[int]) -> list[str]:
    lines: list[str] = []
    for limit in limits:
        shown = [
            {
                **r,
                "grounded_pct": None if r["grounded"] is None else 100 * r["grounded"],
                "grounded_run_pct": (
                    None if r["grounded_run_mean"] is None else 100 * r["grounded_run_mean"]
                ),
                "over_pct": 100 * r["over_share"],
                "context_pct": (
                    None if r.get("grounded_context") is None else 100 * r["grounded_context"]
                ),
            }
            for r in rows
            if r["limit"] == limit
        ]
        calls = shown[0]["calls"] if shown else 0
        lines += ["", f"limit {limit:,} tokens ({calls:,} model calls of no memory)", ""]
        lines.append(table(shown, COLUMNS))
    return lines


def report(payload: dict[str, Any]) -> str:
    """The section's tables as Markdown."""
    n = len(payload["traces"])
    skipped = "; ".join(f"{k}: {v}" for k, v in payload["skipped"].items()) or "none"
    lines = [
        f"## 7. Agents on recorded runs ({n} runs replayed; not replayable: {skipped})",
        *_tables(payload["rows"], payload["limits"]),
    ]
    if payload.get("long_rows"):
        sizes = ", ".join(
            f"{t['tool_calls']} calls/{t['tokens'] // 1000}k" for t in payload["long_traces"]
        )
        lines += ["", f"### Long runs (dev runs chained: {sizes})"]
        lines += _tables(payload["long_rows"], payload["limits"])
    if payload.get("session_rows"):
        held = sum(t["held_out"] for t in payload["sessions"])
        n = len(payload["sessions"])
        for key, title in (
            ("session_rows", f"all {n}"),
            ("session_rows_tuned", f"the {n - held} tuned on"),
            ("session_rows_held_out", f"the {held} held out of tuning"),
        ):
            if payload.get(key):
                lines += ["", f"### Long sessions ({title})"]
                lines += _tables(payload[key], payload["session_limits"])
        lines.append(f"(long sessions: {payload['sessions_seconds']:.0f} s)")
    lines.append(f"({payload['seconds']:.0f} s)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.agents_real [--limit L ...] [--setup NAME ...] [--long]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.agents_real")
    parser.add_argument("--limit", type=int, nargs="+", default=list(LIMITS))
    parser.add_argument(
        "--setup", nargs="+", default=None, help=f"setups to run (default all): {list(SETUPS)}"
    )
    parser.add_argument("--long", action="store_true", help="the chained long runs too")
    parser.add_argument(
        "--sessions", action="store_true", help="the long sessions (issue 36) instead of the runs"
    )
    parser.add_argument("--session-limit", type=int, nargs="+", default=list(SESSION_LIMITS))
    parser.add_argument("--runs", type=int, default=None, help="only the first N runs")
    parser.add_argument("--data", type=Path, default=None, help="the traces' directory")
    parser.add_argument("--out", type=Path, default=None, help="write JSON and PNG here")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    unknown = set(args.setup or ()) - set(SETUPS)
    if unknown:
        parser.error(f"unknown setups {sorted(unknown)}; choose from {list(SETUPS)}")
    began = time.perf_counter()
    if args.sessions:
        payload = long_sessions(
            args.data or sessions_dir(),
            quiet=args.quiet,
            limits=args.session_limit,
            setups=args.setup,
        )
        payload.update(limits=[], skipped={}, traces=[], rows=[])
        payload["seconds"] = time.perf_counter() - began
        if args.out is not None:
            write_json(SECTION, payload, args.out)
            plot(payload, args.out)
        print(report(payload))
        return
    traces, skipped = load(args.data, limit=args.runs)
    setups = args.setup or list(SETUPS)
    payload: dict[str, Any] = {
        "limits": args.limit,
        "skipped": skipped,
        "traces": [t.summary() for t in traces],
        "rows": bench(traces, args.limit, setups, quiet=args.quiet, desc="dev runs"),
    }
    if args.long:
        chained = chain(traces)
        payload["long_traces"] = [t.summary() for t in chained]
        payload["long_rows"] = bench(chained, args.limit, setups, quiet=args.quiet)
    payload["seconds"] = time.perf_counter() - began
    if args.out is not None:
        write_json(SECTION, payload, args.out)
        plot(payload, args.out)
    print(report(payload))


if __name__ == "__main__":
    main()
