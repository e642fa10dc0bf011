"""Section 7l: recorded runs replayed through LlamaIndex's ``FunctionAgent``.

The agent is llama-index-core's own workflow; only the model (the recorded answers, a
``MockFunctionCallingLLM``) and the tools (the recorded results) are scripted. A short
dev run at one limit: ``DemotingLLM`` keeps every call within the limit where the memory
alone does not, nothing is invalid, and the figures are the LangChain path's within a few
percent (the same engine plans both).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # ``bench`` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

pytest.importorskip("langchain")
pytest.importorskip("llama_index.core")

from langchain_core.messages import AIMessage  # noqa: E402

from bench.llamaindex_agents import (  # noqa: E402
    BASELINE,
    LANGCHAIN,
    bench,
    to_langchain,
    to_llamaindex,
)
from bench.real_traces import load, traces_dir  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::pydantic.warnings.PydanticDeprecationWarning:inspect"
)


def test_a_recorded_reply_converts_both_ways_with_its_calls() -> None:
    reply = AIMessage("look", tool_calls=[{"name": "bash", "args": {"c": "ls"}, "id": "t1"}])
    back = to_langchain(to_llamaindex(reply))
    assert isinstance(back, AIMessage) and back.text == "look"
    assert [(c["name"], c["args"], c["id"]) for c in back.tool_calls] == [
        ("bash", {"c": "ls"}, "t1")
    ]


@pytest.mark.skipif(not traces_dir().is_dir(), reason=f"no recorded agent runs in {traces_dir()}")
def test_a_short_dev_run_at_one_limit() -> None:
    traces, _ = load()
    trace = min(
        traces, key=lambda t: t.summary()["tokens"] if t.summary()["tokens"] > 6000 else 1e9
    )
    limit = 2_000
    rows = {r["setup"]: r for r in bench([trace], [limit], ["demote", "demote, memory only"])}
    base, ours, alone = rows[BASELINE], rows["demote"], rows["demote, memory only"]
    assert base["billed_anthropic"] == 1.0 and base["grounded"] == 1.0
    assert base["peak_x"] > 1.0, "the run outgrows the limit without a window"
    assert ours["invalid"] == 0
    assert alone["peak_x"] > ours["peak_x"], "the memory alone leaves the run's steps whole"
    # This run's last step writes six files through its arguments: it alone is over 2,000
    # tokens (the overhang), on both paths alike.
    lc = rows[LANGCHAIN]
    assert abs(ours["peak_x"] - lc["peak_x"]) <= 0.05 and ours["over"] <= lc["over"]
    assert abs(ours["billed_anthropic"] - lc["billed_anthropic"]) <= 0.05 * lc["billed_anthropic"]
