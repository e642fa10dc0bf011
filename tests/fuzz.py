"""``make fuzz``: the planner, engine and adapter property tests in random mode.

CI draws the same examples every run (the ``ci`` profile, derandomized). This runs the
property tests that compare the planner's incremental index with a fresh plan, the
planner's rules, the engine's state machines and the adapters' provider checks with the
``fuzz`` profile instead (random draws, ``DEMOTE_FUZZ_EXAMPLES`` examples per planner
test, a share of it for the costlier ones: see :func:`tests.strategies.examples`), once
per seed. It prints each failure with its minimal example and how to replay it, or "no
failures", and exits non-zero on a find.

Usage: ``python -m tests.fuzz [pytest paths...] [--examples 500] [--seeds 1 2 3 4]`` (the
paths first: ``--seeds`` takes every number after it).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

#: The property tests it runs (paths under the repository root).
TESTS = (
    "tests/demote/window/test_planner_incremental.py",
    "tests/demote/window/test_planner.py",
    "tests/demote/engine/test_engine_stateful.py",
    "tests/demote/engine/test_compaction.py",
    "tests/conformance/test_provider_validity.py",
)

ROOT = Path(__file__).resolve().parents[1]
_SECTION = re.compile(r"^_{3,} (\S+) _{3,}$", re.MULTILINE)


def _failures(output: str) -> list[tuple[str, str]]:
    """(test id, what pytest printed for it: its falsifying example) of each failure."""
    heads = list(_SECTION.finditer(output))
    out = []
    for n, head in enumerate(heads):
        end = heads[n + 1].start() if n + 1 < len(heads) else output.find("= short test summary")
        body = output[head.end() : end if end > 0 else len(output)]
        keep = [
            line
            for line in body.splitlines()
            if line.startswith("E ")
            or "Falsifying example" in line
            or "reproduce_failure" in line
            or line.startswith(("tests/", "demote/"))
        ]
        out.append((head.group(1), "\n".join(keep[-80:])))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every seed; print what was found; 1 on a find, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=500, help="examples per test and seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("tests", nargs="*", default=list(TESTS))
    args = parser.parse_args(argv)
    env = {
        **os.environ,
        "DEMOTE_HYPOTHESIS_PROFILE": "fuzz",
        "DEMOTE_FUZZ_EXAMPLES": str(args.examples),
        "MEM0_TELEMETRY": "False",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
    }
    env.pop("CI", None)  # CI's profile is derandomized; this one is not
    found: list[tuple[int, str, str]] = []
    began = time.monotonic()
    for seed in args.seeds:
        t0 = time.monotonic()
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        command += [f"--hypothesis-seed={seed}", *args.tests]
        run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        output = run.stdout + run.stderr
        failures = _failures(output) if run.returncode else []
        if run.returncode and not failures:  # collection error, crash: show it all
            failures = [("(pytest)", output[-4000:])]
        tail = output.strip().splitlines()[-1] if output.strip() else ""
        print(f"seed {seed}: {tail} ({time.monotonic() - t0:.0f} s)", flush=True)
        found += [(seed, test, text) for test, text in failures]
    print(
        f"\nfuzz: {len(args.seeds)} seeds x {args.examples} examples per test, "
        f"{time.monotonic() - began:.0f} s"
    )
    if not found:
        print("fuzz: no failures")
        return 0
    for seed, test, text in found:
        print(f"\n--- {test}, seed {seed} ---\n{text}")
        print(
            f"replay: DEMOTE_HYPOTHESIS_PROFILE=fuzz DEMOTE_FUZZ_EXAMPLES={args.examples} "
            f"python -m pytest {' '.join(args.tests)} -k {test.split('.')[0]} "
            f"--hypothesis-seed={seed}"
        )
    print(f"\nfuzz: {len(found)} failure(s)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
