"""The cross-validation bench's rules: how a measure is read, which options ship."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # ``bench`` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench.recall_tuning import _measures, shipping  # noqa: E402
from demote.records import Recalled  # noqa: E402


class Turn:
    def __init__(self, dia_id: str) -> None:
        self.dia_id = dia_id


def hit(index: int, tokens: int) -> Recalled:
    return Recalled(role="user", text="x" * (4 * tokens), index=index, key=f"k{index}")


def test_a_budgeted_top_5_skips_a_hit_that_does_not_fit_as_search_does() -> None:
    turns = [Turn(f"D1:{i}") for i in range(10)]
    ranked = [hit(0, 100), hit(1, 200), hit(2, 100), hit(3, 10), hit(4, 10), hit(5, 10)]
    found = _measures(ranked, frozenset({"D1:5"}), turns)
    assert found["k=5"] is False  # sixth by rank
    assert found["k=5, 250 tok"] is True  # the 200-token hit is skipped, so it gets in
    assert _measures(ranked, frozenset({"D1:1", "D1:2"}), turns)["250 tok"] is False


def test_the_shipped_value_is_the_folds_mode_ties_nearest_the_old_default() -> None:
    folds = {
        "a": {"options": {"w": 0.5, "n": 0.7}},
        "b": {"options": {"w": 0.5, "n": 0.4}},
        "c": {"options": {"w": 1.0, "n": 1.0}},
        "d": {"options": {"w": 2.0, "n": 0.7}},
    }
    assert shipping(folds, {"w": 1.0, "n": 0.4}) == {"w": 0.5, "n": 0.7}
    tied = {"a": {"options": {"w": 0.5}}, "b": {"options": {"w": 2.0}}}
    assert shipping(tied, {"w": 1.5}) == {"w": 2.0}
