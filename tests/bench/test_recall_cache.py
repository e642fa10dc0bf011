"""Section 2r's quick run: injected recall in a cached chat, its bill beside recall off."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # ``bench`` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import recall_cache  # noqa: E402
from bench.common import locomo_dir  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not any(locomo_dir().glob("conv-*.json")), reason="no LoCoMo data")
def test_quick_recall_cache_compares_every_setup_to_recall_off(tmp_path: Path) -> None:
    payload = recall_cache.run(quick=True, out=tmp_path, quiet=True)
    rows = {r["setup"]: r for r in payload["rows"]}
    off, on = rows["recall off"], rows["recall on (defaults)"]
    assert off["billed_vs_off"] == 1.0 and off["recall_calls"] == 0
    assert on["recall_calls"] > 0 and on["recall_tokens"] > 0
    # More budget: more recall tokens a call, and never a cheaper bill.
    budgets = [r for name, r in rows.items() if "budget" in name]
    assert [r["recall_tokens"] for r in budgets] == sorted(r["recall_tokens"] for r in budgets)
    assert all(r["billed_vs_off"] >= on["billed_vs_off"] for r in budgets)
    assert (tmp_path / "recall_cache.json").exists()
    assert "## 2r. Injected recall" in recall_cache.report(payload)
