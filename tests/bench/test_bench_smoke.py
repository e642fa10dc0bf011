"""Smoke test: ``python -m bench --quick`` runs every section and writes its results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # ``bench`` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench.__main__ import main  # noqa: E402
from bench.common import locomo_dir  # noqa: E402

pytestmark = pytest.mark.slow

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")


@pytest.mark.skipif(not any(locomo_dir().glob("conv-*.json")), reason="no LoCoMo data")
def test_quick_bench_writes_every_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["--quick", "--quiet", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "## 1. Per-turn overhead" in printed
    assert "## 2. Prompt-cache cost" in printed
    assert "## 4. Capture and scale" in printed
    assert "## 5. Fleet" in printed
    assert "## 8. Outage" in printed  # each store skipped, saying why, without its service
    assert "Timing:" in printed

    turn = json.loads((tmp_path / "turn_cost.json").read_text())
    assert turn["quick"] is True
    floor = next(r for r in turn["rows"] if r["setup"].startswith("floor"))
    assert all(floor[f"x_{n}"] == 1.0 for n in turn["sizes"])
    names = {r["setup"] for r in turn["rows"]}
    assert {"trim_messages", "demote core (Demoter.load)"} <= names

    cost = json.loads((tmp_path / "cache_cost.json").read_text())
    rows = {r["setup"]: r for r in cost["rows"]}
    per_item, bulk = rows["demote PerItem"], rows["demote Bulk +50%"]
    assert bulk["anthropic_steady_billed"] < per_item["anthropic_steady_billed"]
    assert per_item["guaranteed_tokens"] <= cost["limit_tokens"]
    assert "LangChain trim_messages" in rows
    assert any(label.startswith("LlamaIndex Memory") for label in rows)

    capture = json.loads((tmp_path / "capture.json").read_text())
    rows = {r["setup"]: r for r in capture["latency"]["rows"]}
    assert {"no capture", "Recorder(sink)", "Recorder(sink, outbox=SQLiteOutbox)"} <= set(rows)
    durable = rows["Recorder(sink, outbox=SQLiteOutbox)"]
    assert durable["left_in_outbox"] >= 1  # closed while the sink was busy
    assert capture["memory"]["store_bytes_per_conversation"] > 0
    assert capture["sqlite"]["loads_per_second"]["1"] > 0

    assert "## 7s. Agents on generated stress traces" in printed
    assert "## 7. Agents on recorded runs" in printed  # run, or skipped saying why
    assert "## 3c. Agent recall" in printed
    recall = json.loads((tmp_path / "agent_recall.json").read_text())
    assert recall["quick"] is True and recall["min_distance_steps"] >= 50
    assert {r["query"] for r in recall["rows"]} == {"exact", "paraphrase", "tool", "all"}
    assert "## 7b. Agents: one load inside one growing turn" in printed
    steps = json.loads((tmp_path / "step_cost.json").read_text())
    for setup in steps["setups"].values():  # every measured load cut the window
        assert setup["first_cut_step"] <= steps["setups"]["engine (NoopHook)"]["rows"][0]["steps"]
        assert setup["peak_window_tokens"] <= steps["limit"]
    agents = json.loads((tmp_path / "agents.json").read_text())
    rows = {(r["trace"], r["setup"]): r for r in agents["rows"]}
    bare = rows[("long_request", "no memory")]
    assert bare["calls"] == agents["traces"][0]["model_calls"]
    assert bare["invalid"] == 0 and bare["peak"] > agents["limits"][0]
    assert rows[("long_request", "SummarizationMiddleware")]["summary_calls"] > 0
    if (tmp_path / "agents_real.json").exists():
        real = json.loads((tmp_path / "agents_real.json").read_text())
        assert real["quick"] is True and len(real["traces"]) == 2
        base = next(r for r in real["rows"] if r["setup"] == "no memory")
        assert base["billed_anthropic"] == 1.0

    for section in ("turn_cost", "cache_cost", "capture", "fleet"):
        assert (tmp_path / f"{section}.png").read_bytes()[:4] == b"\x89PNG"
    if (tmp_path / "recall.json").exists():
        recall = json.loads((tmp_path / "recall.json").read_text())
        assert recall["setups"]
    # Section 6 runs on PostgreSQL when a URL is set, and says it skipped otherwise.
    assert "## 6. PostgreSQL archive" in printed
    if (tmp_path / "pg_archive.json").exists():
        pg = json.loads((tmp_path / "pg_archive.json").read_text())
        rates = pg["fleet"]["deliveries"]
        assert rates["PostgresArchive"]["messages"] == rates["SQLiteArchive"]["messages"] > 0
        assert {r["setup"] for r in pg["latency"]} == {"SQLiteArchive", "PostgresArchive"}
    else:
        assert "skipped: " in printed


def test_quick_fleet_section_counts_round_trips_and_finds_no_duplicates_or_losses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Needs no LoCoMo data; runs on Redis and Postgres too when their test URLs are set.
    main(["--quick", "--quiet", "--sections", "5", "--out", str(tmp_path)])
    assert "## 5. Fleet" in capsys.readouterr().out
    fleet = json.loads((tmp_path / "fleet.json").read_text())
    rows = {r["store"]: r for r in fleet["rows"]}
    assert "sqlite" in rows
    for row in rows.values():
        assert row["loads"] == fleet["settings"]["turns"] and row["loads_per_second"] > 0
        assert row["demoting_loads"] > 0 and row["delivered"] > 0
        assert (row["duplicates"], row["lost"]) == (0, 0)
        # read, lease with state, fenced commit; a load slow enough (a loaded machine) also
        # sees the keeper renew its lease, and a contended one tries the lease again: each
        # trip past the three is one of those, counted among the trips
        extra = (row["trips_per_demoting_load"] - 3.0) * row["demoting_loads"]
        retried = row["trips"].get("acquire", 0) - row["demoting_loads"]
        assert -1e-9 < extra <= row["trips"].get("renew", 0) + max(retried, 0) + 1e-9, row
        assert 1.0 <= row["trips_per_other_load"] < 2.0  # a read (and a lease if contended)
    assert (tmp_path / "fleet.png").read_bytes()[:4] == b"\x89PNG"


def test_unknown_section_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--sections", "nine"])
    assert "unknown section" in capsys.readouterr().err
