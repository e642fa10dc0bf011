"""``python -m bench``: run the benchmark sections, print their tables, write results.

Usage::

    python -m bench                      # every section (what ``make bench`` runs)
    python -m bench --quick              # a tiny run of every section (the smoke test)
    python -m bench --sections 2 3       # some sections, by number or name
    python -m bench --out /tmp/results   # write the JSON and PNG files elsewhere

Each section writes ``<out>/<section>.json`` and ``<out>/<section>.png``. Section 5 (the
fleet) runs on Redis and Postgres too when ``DEMOTE_BENCH_REDIS_URL`` /
``DEMOTE_BENCH_POSTGRES_URL`` (or the ``DEMOTE_TEST_*`` ones) are set, else on SQLite only;
section 8 (outages) needs them too (``python -m bench --sections outage``). Section 7 reads
the recorded agent runs from ``../shared/data/agent_traces`` (or ``DEMOTE_AGENT_TRACES``)
and is skipped, saying why, without them; 7l replays them through LlamaIndex's
``FunctionAgent`` (same figures, the LangChain path's demote row beside), 7s is the same
bench on generated stress traces.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

for _name, _value in (
    ("LANGSMITH_TRACING", "false"),
    ("LANGCHAIN_TRACING_V2", "false"),
    ("ANONYMIZED_TELEMETRY", "False"),
    ("MEM0_TELEMETRY", "False"),
):
    os.environ.setdefault(_name, _value)

from bench import (  # noqa: E402
    agent_recall,
    agents,
    agents_real,
    cache_cost,
    capture_scale,
    fleet,
    llamaindex_agents,
    outage,
    pg_archive,
    recall_cache,
    recall_cv,
    recall_locomo,
    step_cost,
    turn_cost,
)
from bench.common import RESULTS  # noqa: E402

SECTIONS = {
    "1": "turn_cost",
    "2": "cache_cost",
    "2r": "recall_cache",  # injected recall in a cached chat: bill and recall hits
    "3": "recall",
    "3b": "recall_cv",  # the same protocol, leave-one-conversation-out
    "3c": "agent_recall",  # the recall tool's first search, on agent traces
    "4": "capture",
    "5": "fleet",
    "6": "pg_archive",  # skipped, and says why, without PostgreSQL
    "7": "agents_real",  # recorded agent runs, replayed through create_agent
    "7l": "llamaindex_agents",  # the same runs through LlamaIndex's FunctionAgent
    "7s": "agents",  # generated stress traces
    "7b": "step_cost",  # one load as one agent turn grows to 1,000 steps
    "8": "outage",  # each store skipped, and says why, without its service
}


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
        elif name == "recall_cache":
            print(recall_cache.report(recall_cache.run(quick=args.quick, out=args.out)))
        elif name == "capture":
            print(
                capture_scale.report(
                    capture_scale.run(quick=args.quick, out=args.out, quiet=args.quiet)
                )
            )
        elif name == "fleet":
            print(fleet.report(fleet.run(quick=args.quick, out=args.out, quiet=args.quiet)))
        elif name == "agents_real":
            from bench.real_traces import traces_dir

            if traces_dir().is_dir():
                payload = agents_real.run(quick=args.quick, out=args.out, quiet=args.quiet)
                print(agents_real.report(payload))
            else:  # skipped, saying why
                print(f"## 7. Agents on recorded runs: skipped, no traces in {traces_dir()}")
        elif name == "llamaindex_agents":
            from bench.real_traces import traces_dir

            if traces_dir().is_dir():
                payload = llamaindex_agents.run(quick=args.quick, out=args.out, quiet=args.quiet)
                print(llamaindex_agents.report(payload))
            else:  # skipped, saying why
                print(f"## 7l. LlamaIndex agents: skipped, no traces in {traces_dir()}")
        elif name == "agents":
            print(agents.report(agents.run(quick=args.quick, out=args.out, quiet=args.quiet)))
        elif name == "agent_recall":
            print(
                agent_recall.report(
                    agent_recall.section(quick=args.quick, out=args.out, quiet=args.quiet)
                )
            )
        elif name == "step_cost":
            print(step_cost.report(step_cost.run(quick=args.quick, out=args.out, quiet=args.quiet)))
        elif name == "outage":
            print(outage.report(outage.run(quick=args.quick, out=args.out, quiet=args.quiet)))
        elif name == "recall_cv":
            print(recall_cv.report(recall_cv.run(quick=args.quick, out=args.out, quiet=args.quiet)))
        elif name == "pg_archive":
            payload = pg_archive.run(quick=args.quick, out=args.out, quiet=args.quiet)
            print(pg_archive.report(payload))
        else:
            print(
                recall_locomo.report(
                    recall_locomo.run(quick=args.quick, out=args.out, quiet=args.quiet)
                )
            )
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
