"""Leave-one-conversation-out tuning of recall options, the machinery of :mod:`bench.recall_cv`.

Replays and rankings cached per option set (:class:`Bench`), the measures read from one
ranking with the archive's own rule (:func:`_measures`), coordinate descent on the training
conversations (:func:`descend`), the folds (:func:`cross_validate`, :func:`summarise`) and
the defaults shipped (:func:`shipping`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.locomo_protocol import (
    CATEGORIES,
    Conversation,
    replay,
)
from demote.archive.ranking import fit
from demote.records import Recalled

#: The rankings are read this deep: the archive's default pool, so the top 5 here is exactly
#: what ``search(..., k=5)`` returns (the 1,000-token budget is read within these 50).
DEPTH = 50
WINDOW = 2000
#: ``(name, k, budget)``: how each measure is read from a ranking.
MEASURES: tuple[tuple[str, int, int | None], ...] = (
    ("k=5", 5, None),
    ("k=10", 10, None),
    ("k=5, 250 tok", 5, 250),
    ("250 tok", DEPTH, 250),
    ("500 tok", DEPTH, 500),
    ("1000 tok", DEPTH, 1000),
)
OBJECTIVE = "k=5, 250 tok"

#: The base options and the values the descent may give them; the first is the default.
BASE_GRID: dict[str, tuple[Any, ...]] = {
    "context_weight": (0.5, 0.25, 1.0, 2.0),
    "adjacent_weight": (0.8, 0.0, 0.3, 0.5, 1.2),
    "coverage": (1.0, 0.5, 2.0),
    "neighbours": (0.7, 0.4, 1.0),
    "speaker_weight": (1.0, 0.0, 0.5, 2.0),
}


def _cost(text: str) -> int:
    return math.ceil(len(text) / 4)


@dataclass(frozen=True)
class Prepared:
    """One conversation replayed into an archive file: the window and the questions."""

    conv: Conversation
    path: Path
    window: frozenset[str]


@dataclass
class Variant:
    """One setup: how the archive is built, and which options the descent tunes."""

    label: str
    #: Index-time options (a change means another replay); must be hashable by repr.
    build: Mapping[str, Any]
    #: Tuned options and their grids (the base grid, or a method's knobs on top of it).
    grid: Mapping[str, tuple[Any, ...]]
    #: Options fixed for this variant (not tuned).
    fixed: Mapping[str, Any] = field(default_factory=dict)
    #: Tune ``grid`` on top of the base options each fold chose (a method's knobs).
    on_base: bool = False
    #: Labels of earlier variants whose per-fold choices this one merges, untuned.
    combine: tuple[str, ...] = ()
    #: The measure its descent maximises: the headline, or for a method that acts only
    #: when a budget binds (packing), the budget it acts on.
    objective: str = OBJECTIVE


Scores = dict[str, list[tuple[int, dict[str, bool]]]]  # conv -> [(category, measure->hit)]


class Bench:
    """Replays and rankings, cached; :meth:`score` evaluates one option set."""

    def __init__(self, folder: Path, convs: Sequence[Conversation], make: Callable[..., Any]):
        self.folder, self.convs, self.make = folder, list(convs), make
        self._built: dict[str, dict[str, Prepared]] = {}
        self._memo: dict[str, Scores] = {}
        self.searches = 0
        self.search_seconds = 0.0

    def prepared(self, build: Mapping[str, Any]) -> dict[str, Prepared]:
        key = repr(sorted(build.items()))
        if key not in self._built:
            out: dict[str, Prepared] = {}
            for n, conv in enumerate(self.convs):
                path = self.folder / f"b{len(self._built)}-{n}.db"
                archive = self.make(path, build, {})
                try:
                    start = replay(conv, archive, WINDOW)
                finally:
                    archive.close()
                out[conv.name] = Prepared(
                    conv, path, frozenset(t.dia_id for t in conv.turns[start:])
                )
            self._built[key] = out
        return self._built[key]

    def score(self, build: Mapping[str, Any], options: Mapping[str, Any]) -> Scores:
        key = repr((sorted(build.items()), sorted(options.items())))
        if key in self._memo:
            return self._memo[key]
        result: Scores = {}
        for name, prep in self.prepared(build).items():
            archive = self.make(prep.path, build, options)
            rows: list[tuple[int, dict[str, bool]]] = []
            try:
                turns = prep.conv.turns
                for question, category, evidence in prep.conv.questions:
                    missing = evidence - prep.window
                    began = time.perf_counter()
                    ranked = archive.search(name, question, DEPTH) if missing else []
                    self.search_seconds += time.perf_counter() - began
                    self.searches += 1
                    packing = float(options.get("packing", 0.0))
                    rows.append((category, _measures(ranked, missing, turns, packing)))
            finally:
                archive.close()
            result[name] = rows
        self._memo[key] = result
        return result


def _measures(
    ranked: list[Recalled], missing: frozenset[str], turns: Sequence[Any], packing: float = 0.0
) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for name, k, budget in MEASURES:
        # search(k, budget_tokens=b): best first (or packed), a hit that does not fit is
        # skipped; the archive's own rule, read from the one ranking.
        hits = fit(ranked, budget, _cost, k=k, packing=packing)
        ids = {turns[h.index].dia_id for h in hits if h.index >= 0}
        out[name] = not (missing - ids)
    return out


def rate(scores: Scores, names: Sequence[str], measure: str, category: int | None = None) -> float:
    rows = [m for n in names for c, m in scores[n] if category is None or c == category]
    return sum(m[measure] for m in rows) / len(rows) if rows else 0.0


def hits(scores: Scores, names: Sequence[str], measure: str) -> int:
    return sum(m[measure] for n in names for _, m in scores[n])


def descend(
    bench: Bench,
    variant: Variant,
    train: Sequence[str],
    start: Mapping[str, Any],
    passes: int = 2,
) -> dict[str, Any]:
    """Coordinate descent of ``variant.grid`` on the ``train`` conversations."""
    current = {**start, **variant.fixed}
    for name, values in variant.grid.items():
        current.setdefault(name, values[0])
    for _ in range(passes):
        moved = False
        for name, values in variant.grid.items():
            best, best_hits = (
                current[name],
                hits(bench.score(variant.build, current), train, variant.objective),
            )
            for value in values:
                if value == current[name]:
                    continue
                trial = {**current, name: value}
                found = hits(bench.score(variant.build, trial), train, variant.objective)
                if found > best_hits:
                    best, best_hits = value, found
            if best != current[name]:
                current[name], moved = best, True
        if not moved:
            break
    return current


def cross_validate(
    bench: Bench,
    variant: Variant,
    base: Mapping[str, dict[str, Any]] | None = None,
    passes: int = 2,
    merged: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Leave-one-conversation-out: per fold, the chosen options and the held-out scores."""
    names = [c.name for c in bench.convs]
    folds: dict[str, Any] = {}
    for held in names:
        train = [n for n in names if n != held]
        start: dict[str, Any] = dict(base[held]) if (variant.on_base and base) else {}
        if variant.combine:  # each fold's own choices of the methods merged (no new tuning)
            for label in variant.combine:
                start.update((merged or {})[label]["folds"][held]["options"])
        chosen = descend(bench, variant, train, start, passes)
        scores = bench.score(variant.build, chosen)
        folds[held] = {
            "options": chosen,
            "train": rate(scores, train, variant.objective),
            "held_out": {
                m: {
                    "overall": rate(scores, [held], m),
                    **{CATEGORIES[c]: rate(scores, [held], m, c) for c in CATEGORIES},
                }
                for m, _, _ in MEASURES
            },
            "questions": len(scores[held]),
        }
    return {"folds": folds, "summary": summarise(folds)}


def summarise(folds: Mapping[str, Any]) -> dict[str, Any]:
    """Mean (over folds, and pooled over questions) and worst fold of every measure."""
    out: dict[str, Any] = {}
    total = sum(f["questions"] for f in folds.values())
    for m, _, _ in MEASURES:
        values = [f["held_out"][m]["overall"] for f in folds.values()]
        pooled = sum(f["held_out"][m]["overall"] * f["questions"] for f in folds.values()) / total
        per_cat = {}
        for c in CATEGORIES.values():
            per_cat[c] = statistics.fmean(f["held_out"][m][c] for f in folds.values())
        out[m] = {
            "mean": statistics.fmean(values),
            "worst": min(values),
            "pooled": pooled,
            **per_cat,
        }
    return out


def shipping(folds: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Per option, the value most folds chose (ties: nearest the previous default)."""
    chosen: dict[str, Any] = {}
    for name in next(iter(folds.values()))["options"]:
        votes: dict[Any, int] = {}
        for fold in folds.values():
            value = fold["options"][name]
            votes[value] = votes.get(value, 0) + 1
        top = max(votes.values())
        tied = [v for v, n in votes.items() if n == top]
        old = defaults.get(name)
        if isinstance(old, int | float) and all(isinstance(v, int | float) for v in tied):
            tied.sort(key=lambda v: abs(v - old))
        chosen[name] = tied[0]
    return chosen
