"""Shared pieces of the benchmark sections: data, synthetic chats, timing, tables, output."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from demote.cli.replay import ReplayResult
from demote.cli.transcript import Transcript, load_transcript

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_LOCOMO = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo"
PRICINGS = ("anthropic", "openai")

_TEXT = (
    "the of and to in is that it was for on are with as be at by this have from or had not "
    "but what all were when we there can an your which their said if do will each about how "
    "up out them then she many some so these would other into has more her two like him see "
    "time could no make than first been its who now people my made over did down only way "
    "find use may water long little very after words called just where most know garden "
    "river market letter holiday project kitchen weekend concert painting bicycle recipe"
)
_WORDS = _TEXT.split(" ")


def locomo_dir() -> Path:
    return Path(os.environ.get("DEMOTE_LOCOMO", DEFAULT_LOCOMO))


def locomo(limit: int | None = None) -> list[Transcript]:
    """The LoCoMo conversations (first ``limit`` files), read in place."""
    paths = sorted(locomo_dir().glob("conv-*.json"))
    if not paths:
        raise SystemExit(f"no LoCoMo data in {locomo_dir()} (set DEMOTE_LOCOMO)")
    return [load_transcript(p) for p in paths[:limit]]


def synthetic_chat(n: int, words: int = 50, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` alternating user/assistant messages of about ``words`` words each."""
    rng = random.Random(seed)
    return [
        ("user" if i % 2 == 0 else "assistant", f"#{i} " + " ".join(rng.choices(_WORDS, k=words)))
        for i in range(n)
    ]


def approx_tokens(text: str) -> int:
    """The core's default counter, without the per-message overhead."""
    return math.ceil(len(text) / 4)


def median_seconds(fn: Callable[[int], object], repeats: int, start: int = 0) -> float:
    """Median wall time of ``fn(start)``, ``fn(start + 1)``, ... (``repeats`` calls)."""
    times = []
    for i in range(start, start + repeats):
        began = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def aggregate(results: Sequence[ReplayResult], label: str) -> dict[str, Any]:
    """Combine per-conversation replays: costs weighted by prompt tokens, minimum guarantee."""
    calls = sum(r.calls for r in results)
    out: dict[str, Any] = {"setup": label, "conversations": len(results), "calls": calls}
    for steady in (False, True):
        for pricing in PRICINGS:
            billed = tokens = n = 0.0
            for r in results:
                if not (r.steady_costs if steady else r.costs):
                    continue
                c = r.cost(pricing, steady=steady)
                billed += c.relative_cost * c.mean_prompt_tokens * c.calls
                tokens += c.mean_prompt_tokens * c.calls
                n += c.calls
            key = f"{pricing}_steady" if steady else pricing
            out[key] = billed / tokens if tokens else None
            # What a call is billed, in full-price input tokens (compares absolute cost).
            out[f"{key}_billed"] = billed / n if n else None
    tokens = sum(r.mean_prompt_tokens * r.calls for r in results)
    out["mean_prompt_tokens"] = tokens / calls if calls else 0.0
    guaranteed = [r.guaranteed_tokens for r in results if r.guaranteed_tokens is not None]
    out["guaranteed_tokens"] = min(guaranteed) if guaranteed else None
    out["max_window_tokens"] = max(r.window_tokens[1] for r in results)
    out["demoted"] = sum(r.demoted for r in results)
    out["cuts"] = sum(r.demotions for r in results)
    out["seconds"] = sum(r.seconds for r in results)
    return out


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """A Markdown table; ``columns`` are ``(key, header, format)``."""

    def cell(row: dict[str, Any], key: str, fmt: str) -> str:
        value = row.get(key)
        if value is None:
            return "n/a"
        return format(value, fmt) if fmt else str(value)

    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"
    body = ["| " + " | ".join(cell(r, k, f) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


#: Distributions whose versions a result records (a peer's figure can move with its release).
_RECORDED = ("demote", "langchain-core", "llama-index-core", "mem0ai")


def environment() -> dict[str, Any]:
    """The machine and the versions a result was measured with."""
    versions: dict[str, str | None] = {}
    for name in _RECORDED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "versions": versions,
    }


def write_json(section: str, payload: dict[str, Any], out: Path = RESULTS) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{section}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def close_llama_memory(memory: Any) -> None:
    """Close the SQLAlchemy engine a LlamaIndex ``Memory`` opened (it has no close())."""
    engine = getattr(memory.sql_store, "_async_engine", None)
    if engine is not None:
        from llama_index.core.async_utils import asyncio_run

        asyncio_run(engine.dispose())


def agg_backend() -> None:
    """Select matplotlib's Agg backend (no display) before anything imports pyplot."""
    try:
        import matplotlib
    except ImportError:  # the plots are skipped
        return
    matplotlib.use("Agg")


def progress(items: Sequence[Any], desc: str, quiet: bool) -> Iterator[Any]:
    """Iterate with a tqdm bar on stderr when tqdm is there and the run is not quiet."""
    if quiet:
        yield from items
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield from items
        return
    yield from tqdm(items, desc=desc, leave=False, file=sys.stderr)


def section_main(
    prog: str,
    run: Callable[..., dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    argv: Sequence[str] | None = None,
) -> None:
    """``python -m bench.<section> [--quick] [--out DIR]``: run one section, print it."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results are written")
    args = parser.parse_args(argv)
    print(report(run(quick=args.quick, out=args.out)))
