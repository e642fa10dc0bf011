"""Recall tuned honestly: leave-one-conversation-out cross-validation on LoCoMo.

Every tuned option of the archive's recall is chosen on four of the five conversations and
scored on the fifth, once per held-out conversation (a *fold*); the figures reported are
the mean and the worst held-out fold, never a score on a conversation that chose the
options it was measured with.

Protocol (the same as :mod:`bench.recall_locomo`): each conversation is replayed through a
2,000-token window; a question (categories 1-4; 1 is multi-hop: its questions name 2.3 to
3.6 evidence turns on average, the others about one) counts as retained when each of its
evidence turns is in the window or among the recalled messages. A question's ranking is
asked for once per option set (``k=100``, no budget) and every measure is read from it
with the archive's own rule (:func:`demote.archive.ranking.fit`): top 5 and top 10, the top 5
cut to 250 recalled tokens (the headline: ``search(..., k=5, budget_tokens=250)``), and
whatever fits in 250, 500 or 1,000 tokens.

Tuning is coordinate descent from the shipped defaults: each option in turn takes the
value of its grid that scores best on the fold's training conversations (ties keep the
current value), two passes. The objective is the headline measure, summed over the
training questions. A method's own knobs (:data:`METHODS`) are tuned the same way on top
of the base options each fold chose. The defaults shipped are, per option, the value most
folds chose (ties: the one nearest the previous default); :func:`shipping` computes them.

Beside the hand-made context (the replay's speaker and session date, passed as
``context=``), the same protocol runs with no ``context=`` at all: on text-only messages
(what the archive indexed by default before it read metadata), and on LoCoMo turns fed as
LangChain or LlamaIndex messages that carry their speaker and date in their metadata, in
each spelling of :data:`bench.locomo_messages.SPELLINGS` (the archive's default context
reads them). Each of these rows tunes the base options on its own training folds.

Caching: each conversation is replayed once into one archive file per index-time setup
(the ``context=`` callable, the entity index); every option set after that is only
searches. Rankings are memoised per option set across folds, so a fold costs only the
option sets no earlier fold asked for. A full run takes a few minutes on 2 cores.

Run ``python -m bench.recall_cv`` (``--quick``: the two shortest conversations, two values
an option, one pass: a smoke test, not a figure).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.locomo_messages import SPELLINGS, Framed
from bench.locomo_protocol import (
    CATEGORIES,
    Conversation,
    conversations,
    speaker_context,
)
from bench.recall_tuning import (
    BASE_GRID,
    MEASURES,
    OBJECTIVE,
    Bench,
    Variant,
    cross_validate,
    shipping,
)
from demote.records import DemotedMessage

# -- the archive under test ------------------------------------------------------------


def make_archive(path: Path, build: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
    """The archive of one setup: ``build["context"]`` names its ``context=`` (``"default"``:
    none passed), ``build["spelling"]`` feeds it framework messages (:class:`Framed`)."""
    from demote.archive.sqlite import SQLiteArchive

    merged = {**dict(build.get("options", {})), **options}
    name = build.get("context", "speaker/date")
    if name != "default":
        merged["context"] = _CONTEXTS[name]
    archive = SQLiteArchive(path, **merged)
    spelling = build.get("spelling")
    return archive if spelling is None else Framed(archive, spelling)


def _captioned(message: DemotedMessage) -> dict[str, str] | None:
    found = speaker_context(message)
    raw = message.raw
    if found is not None and isinstance(raw, dict) and raw.get("caption"):
        found["caption"] = str(raw["caption"])
    return found


_CONTEXTS: dict[str, Callable[[DemotedMessage], Any]] = {
    "none": lambda m: None,
    "speaker/date": speaker_context,
    "speaker/date/caption": _captioned,
}


def variants() -> list[Variant]:
    """Every setup measured: the base options, then each method on top of them."""
    entities = {"options": {"entities": True}}
    plain = {"coverage": 0.0, "neighbours": 0.0, "adjacent_weight": 0.0, "speaker_weight": 0.0}
    metadata = [
        Variant(
            f"defaults, metadata in the messages ({label}; base options tuned)",
            {"context": "default", "spelling": key},
            BASE_GRID,
        )
        for key, (label, _) in SPELLINGS.items()
    ]
    return [
        Variant("defaults + speaker/date context (base options tuned)", {}, BASE_GRID),
        Variant(
            "defaults, no context (text-only messages; base options tuned)",
            {"context": "default"},
            BASE_GRID,
        ),
        *metadata,
        Variant("plain FTS5 BM25 + speaker/date context (nothing tuned)", {}, {}, plain),
        Variant("+ entity index", entities, {"entity_weight": (1.0, 0.5, 2.0, 4.0)}, on_base=True),
        Variant("+ time awareness", {}, {"time_weight": (1.0, 0.5, 2.0, 4.0)}, on_base=True),
        Variant("+ query decomposition", {}, {"decompose": (0.8, 0.5, 1.0)}, on_base=True),
        Variant(
            "+ budget packing (tuned at 500 tok, where a budget binds)",
            {},
            {"packing": (0.2, 0.1, 0.3, 0.5)},
            on_base=True,
            objective="500 tok",
        ),
        Variant(
            "+ entities, time, decomposition (each as its row chose)",
            entities,
            {},
            combine=("+ entity index", "+ time awareness", "+ query decomposition"),
        ),
        Variant(
            "+ entities, time, decomposition, packing (each as its row chose)",
            entities,
            {},
            combine=(
                "+ entity index",
                "+ time awareness",
                "+ query decomposition",
                "+ budget packing (tuned at 500 tok, where a budget binds)",
            ),
        ),
        Variant(
            "+ photo captions as keys (a captioning model's key expansion)",
            {"context": "speaker/date/caption"},
            {},
            on_base=True,
        ),
    ]


# -- latency ------------------------------------------------------------------------------

SIZES = (2000, 20000)


def fill(archive: Any, convs: Sequence[Conversation], size: int) -> list[tuple[str, str]]:
    """Deliver ``size`` messages: the conversations replayed whole under distinct ids.

    Returns ``(conversation id, question)`` pairs to time, each asked of its own copy.
    """
    from demote.records import Demotion, fingerprint, make_key

    delivered, copy, asked = 0, 0, []
    while delivered < size:
        for conv in convs:
            cid = f"{conv.name}#{copy}"
            turns = conv.turns[: size - delivered]
            for start in range(0, len(turns), 50):
                batch = tuple(
                    DemotedMessage(
                        role=t.role,  # type: ignore[arg-type]
                        text=t.text,
                        index=j,
                        key=make_key(cid, j, fingerprint(t.role, t.text)),
                        raw={"speaker": t.speaker, "date": t.date, "caption": t.caption},
                    )
                    for j, t in enumerate(turns[start : start + 50], start=start)
                )
                archive.deliver(Demotion(cid, batch))
            delivered += len(turns)
            if len(turns) == len(conv.turns):
                asked.extend((cid, q) for q, _, _ in conv.questions)
            if delivered >= size:
                break
        copy += 1
    return asked


def latency(
    folder: Path,
    convs: Sequence[Conversation],
    setups: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]],
    sizes: Sequence[int] = SIZES,
    queries: int = 300,
) -> dict[str, dict[str, dict[str, float]]]:
    """p50 and p99 milliseconds of ``search(cid, question, k=5, budget_tokens=250)``.

    ``setups`` maps a label to its ``(build, options)``; setups of one build share the
    archive file of each size.
    """
    import random

    files: dict[tuple[str, int], tuple[Path, list[tuple[str, str]]]] = {}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label, (build, options) in setups.items():
        out[label] = {}
        for size in sizes:
            key = (repr(sorted(build.items())), size)
            if key not in files:
                path = folder / f"latency-{len(files)}.db"
                archive = make_archive(path, build, {})
                try:
                    asked = fill(archive, convs, size)
                finally:
                    archive.close()
                random.Random(7).shuffle(asked)
                files[key] = (path, asked[:queries])
            path, asked = files[key]
            archive = make_archive(path, build, options)
            took: list[float] = []
            try:
                for cid, question in asked[:20]:  # warm the page cache
                    archive.search(cid, question, 5, budget_tokens=250)
                for cid, question in asked:
                    began = time.perf_counter()
                    archive.search(cid, question, 5, budget_tokens=250)
                    took.append((time.perf_counter() - began) * 1000)
            finally:
                archive.close()
            took.sort()
            out[label][str(size)] = {
                "p50": statistics.median(took),
                "p99": took[min(len(took) - 1, int(0.99 * len(took)))],
            }
    return out


def run(*, quick: bool, out: Path, quiet: bool) -> dict[str, Any]:
    from bench.common import environment, write_json

    began = time.perf_counter()
    convs = list(conversations())
    chosen_variants = variants()
    if quick:  # the smoke test: two folds of the two shortest, two values an option
        convs = sorted(convs, key=lambda c: len(c.turns))[:2]
        base_grid = {name: values[:2] for name, values in BASE_GRID.items()}
        metadata = next(v for v in chosen_variants if v.build.get("spelling"))
        chosen_variants = [
            Variant(chosen_variants[0].label, {}, base_grid),
            Variant(metadata.label, metadata.build, base_grid),
            *(v for v in chosen_variants if v.label == "+ time awareness"),
        ]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), convs, make_archive)
        base_variant, *methods = chosen_variants
        passes = 1 if quick else 2
        base = cross_validate(bench, base_variant, passes=passes)
        results[base_variant.label] = base
        chosen = {held: f["options"] for held, f in base["folds"].items()}
        if not quiet:
            print(f"  {base_variant.label}: {time.perf_counter() - began:.0f} s", file=sys.stderr)
        for variant in methods:
            results[variant.label] = cross_validate(bench, variant, chosen, passes, results)
            if not quiet:
                print(f"  {variant.label}: {time.perf_counter() - began:.0f} s", file=sys.stderr)
        searches, seconds = bench.searches, bench.search_seconds
        shipped = shipping(base["folds"], {name: values[0] for name, values in BASE_GRID.items()})
        timed = {}
        for variant in [base_variant, *methods]:
            folds = results[variant.label]["folds"]
            extra = shipping(folds, {}) if variant.grid else {}
            timed[variant.label] = (variant.build, {**shipped, **extra, **variant.fixed})
        lat = latency(Path(tmp), convs, timed, (500,) if quick else SIZES, 30 if quick else 300)
    defaults = {name: values[0] for name, values in BASE_GRID.items()}
    payload = {
        "section": "recall_cv",
        "quick": quick,
        "objective": OBJECTIVE,
        "variants": results,
        "shipped": shipping(base["folds"], defaults),
        "latency_ms": lat,
        "searches": searches,
        "search_seconds": seconds,
        "seconds": time.perf_counter() - began,
        "environment": environment(),
    }
    write_json("recall_cv", payload, out)
    return payload


def report(payload: dict[str, Any]) -> str:
    """The cross-validated tables (Markdown)."""
    variants_ = payload["variants"]
    folds = len(next(iter(variants_.values()))["folds"])
    lines = [
        "## 3b. LoCoMo recall, leave-one-conversation-out (held-out folds only)",
        "",
        f"% of questions whose evidence is kept, mean / worst of the {folds} held-out folds; "
        f"tuned on the other four for: {payload['objective']}",
        "",
        "| setup | k=5 | k=10 | k=5 ≤250 tok | 250 tok | 500 tok | 1,000 tok |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, result in variants_.items():
        s = result["summary"]
        cells = [f"{s[m]['mean']:.1%} / {s[m]['worst']:.1%}" for m, _, _ in MEASURES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for measure in (OBJECTIVE, "500 tok"):
        lines += [
            "",
            f"| setup, {measure} (mean of folds) | " + " | ".join(CATEGORIES.values()) + " |",
        ]
        lines.append("|---|" + "---:|" * len(CATEGORIES))
        for label, result in variants_.items():
            row = result["summary"][measure]
            lines.append(
                f"| {label} | " + " | ".join(f"{row[c]:.1%}" for c in CATEGORIES.values()) + " |"
            )
    lat = payload.get("latency_ms", {})
    if lat:
        sizes = list(next(iter(lat.values())))
        lines += [
            "",
            "| setup, search k=5 ≤250 tok, ms | "
            + " | ".join(f"p50 / p99 at {int(n):,}" for n in sizes)
            + " |",
            "|---|" + "---:|" * len(sizes),
        ]
        for label, row in lat.items():
            lines.append(
                f"| {label} | "
                + " | ".join(f"{row[n]['p50']:.1f} / {row[n]['p99']:.1f}" for n in sizes)
                + " |"
            )
    lines += ["", "options chosen per fold (held-out conversation: options):"]
    for label, result in variants_.items():
        lines.append(f"- {label}:")
        for held, fold in result["folds"].items():
            lines.append(f"  - {held}: {json.dumps(fold['options'], sort_keys=True)}")
    lines.append(f"\nshipped (mode of the folds): {json.dumps(payload['shipped'], sort_keys=True)}")
    load = payload["environment"]["load_average"]
    lines.append(
        f"{payload['searches']} searches in {payload['search_seconds']:.0f} s; "
        f"{payload['seconds']:.0f} s in all (load average {load:.1f})"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> None:
    from bench.common import RESULTS

    parser = argparse.ArgumentParser(prog="python -m bench.recall_cv")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(list(argv))
    print(report(run(quick=args.quick, out=args.out, quiet=False)))


if __name__ == "__main__":
    main(sys.argv[1:])
