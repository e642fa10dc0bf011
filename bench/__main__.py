"""``python -m bench``: run the benchmark sections, print their tables, write results.

Usage::

    python -m bench                      # every section (what ``make bench`` runs)
    python -m bench --quick              # a tiny run of every section (the smoke test)
    python -m bench --sections 2 3       # some sections, by number or name
    python -m bench --out /tmp/results   # write the JSON and PNG files elsewhere

Each section writes ``<out>/<section>.json`` and ``<out>/<section>.png``. Section 5 (the
fleet) runs on Redis and Postgres too when ``DEMOTE_BENCH_REDIS_URL`` /
``DEMOTE_BENCH_POSTGRES_URL`` (or the ``DEMOTE_TEST_*`` ones) are set, else on SQLite only.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

for _name, _value in (
    ("LANGSMITH_TRACING", "false"),
    ("LANGCHAIN_TRACING_V2", "false"),
    ("ANONYMIZED_TELEMETRY", "False"),
    ("MEM0_TELEMETRY", "False"),
):
    os.environ.setdefault(_name, _value)

from bench import cache_cost, capture_scale, fleet, turn_cost  # noqa: E402
from bench.common import RESULTS, agg_backend, environment, locomo_dir, write_json  # noqa: E402

SECTIONS = {"1": "turn_cost", "2": "cache_cost", "3": "recall", "4": "capture", "5": "fleet"}


def recall_section(*, quick: bool, out: Path, quiet: bool) -> dict[str, Any] | None:
    """Section 3, from :mod:`bench.recall_locomo` (another module's ``evaluate``)."""
    try:
        from bench.recall_locomo import evaluate, speaker_and_date
        from demote.hooks.archive import SQLiteArchive
    except ImportError as exc:
        print(f"## 3. LoCoMo recall: skipped ({exc})")
        return None
    began = time.perf_counter()
    setups: dict[str, dict[str, Any]] = {
        "SQLiteArchive defaults": {},
        "defaults + speaker/date context": {"context": speaker_and_date},
    }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = None
        if quick:  # one conversation, linked (not copied) into a scratch directory
            directory = Path(tmp) / "data"
            directory.mkdir()
            first = min(locomo_dir().glob("conv-*.json"), key=lambda p: p.stat().st_size)
            (directory / first.name).symlink_to(first)
        for n, (label, options) in enumerate(setups.items()):
            path = Path(tmp) / f"archive-{n}.db"
            results[label] = evaluate(
                lambda p=path, o=options: SQLiteArchive(p, **o), directory=directory
            )
    payload = {
        "section": "recall",
        "quick": quick,
        "setups": results,
        "seconds": time.perf_counter() - began,
        "environment": environment(),
    }
    payload["plot"] = _recall_plot(results, out)
    write_json("recall", payload, out)
    return payload


def _recall_plot(results: dict[str, Any], out: Path) -> str | None:
    agg_backend()
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax: Any = fig.add_subplot()
    labels: list[str] = []
    values: list[float] = []
    for label, result in results.items():
        for setup, rates in result["rates"].items():
            if setup == "window" and "window" in labels:
                continue
            labels.append("window" if setup == "window" else f"{label}, {setup}")
            values.append(rates["overall"] * 100)
    ax.barh(labels, values)
    ax.set_xlabel("evidence retained, % of questions")
    ax.set_title("LoCoMo: window alone vs window + archive recall")
    ax.invert_yaxis()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recall.png"
    fig.savefig(path, dpi=110)
    return path.name


def recall_report(payload: dict[str, Any]) -> str:
    lines = ["## 3. LoCoMo evidence retained (window vs window + archive recall)", ""]
    first = next(iter(payload["setups"].values()))
    columns = [*first["rates"]["window"].keys()]
    lines.append("| setup | " + " | ".join(columns) + " |")
    lines.append("|---|" + "---:|" * len(columns))
    seen_window = False
    for label, result in payload["setups"].items():
        for setup, rates in result["rates"].items():
            if setup == "window":
                if seen_window:
                    continue
                seen_window = True
                name = "window only"
            else:
                name = f"{label}, {setup}"
            lines.append(f"| {name} | " + " | ".join(f"{rates[c]:.1%}" for c in columns) + " |")
    lines.append("")
    lines.append(
        f"({first['questions']} questions, {first['skipped']} skipped; {payload['seconds']:.1f} s)"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument(
        "--sections",
        nargs="+",
        default=list(SECTIONS),
        help="sections to run, by number or name (default: all)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results are written")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    wanted = []
    for s in args.sections:
        name = SECTIONS.get(s, s)
        if name not in SECTIONS.values():
            parser.error(f"unknown section {s!r}; choose from {sorted(SECTIONS.items())}")
        wanted.append(name)
    warnings.filterwarnings("ignore", message=".*InMemoryChatMessageHistory.*deprecated")
    began = time.perf_counter()
    timings: dict[str, float] = {}
    for name in wanted:
        started = time.perf_counter()
        if name == "turn_cost":
            print(turn_cost.report(turn_cost.run(quick=args.quick, out=args.out, quiet=args.quiet)))
        elif name == "cache_cost":
            print(
                cache_cost.report(cache_cost.run(quick=args.quick, out=args.out, quiet=args.quiet))
            )
        elif name == "capture":
            print(
                capture_scale.report(
                    capture_scale.run(quick=args.quick, out=args.out, quiet=args.quiet)
                )
            )
        elif name == "fleet":
            print(fleet.report(fleet.run(quick=args.quick, out=args.out, quiet=args.quiet)))
        else:
            payload = recall_section(quick=args.quick, out=args.out, quiet=args.quiet)
            if payload is not None:
                print(recall_report(payload))
        timings[name] = time.perf_counter() - started
        print(flush=True)
    total = time.perf_counter() - began
    print(
        "Timing: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
        + f"; total {total:.0f} s"
    )


if __name__ == "__main__":
    main()
