"""The project's LlamaIndex agent conformance tests, run again with ``DemotingLLM`` in place.

``tests/conformance/test_llamaindex_agents.py`` runs llama-index-core's ``FunctionAgent``,
``ReActAgent`` and ``AgentWorkflow`` as LlamaIndex documents them, over ``DemotingMemory``
and over LlamaIndex's own ``ChatMemoryBuffer``. Here every mock LLM those tests build is
wrapped in ``DemotingLLM`` (the one-line drop-in) and the same tests run unchanged: a
window that never demotes is still invisible (the requests are handed on as they are,
with a ``ChatMemoryBuffer`` too, whose reads the wrapper does not know), tool calls stay
with their results, and a reused context keeps its memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import tests.conformance.test_llamaindex_agents as conformance
from llamaindex_demote import DemotingLLM

pytestmark = pytest.mark.filterwarnings(
    "ignore::pydantic.warnings.PydanticDeprecationWarning:inspect"
)


@pytest.fixture(autouse=True)
def wrapped(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[DemotingLLM]]:
    made: list[DemotingLLM] = []

    def wrap(build: Any) -> Any:
        def built(*args: Any) -> DemotingLLM:
            llm = DemotingLLM(build(*args))
            made.append(llm)
            return llm

        return built

    monkeypatch.setattr(conformance, "parallel_llm", wrap(conformance.parallel_llm))
    monkeypatch.setattr(conformance, "react_llm", wrap(conformance.react_llm))
    yield made
    assert made, "the conformance test built its LLM through the wrapped factory"


@pytest.mark.parametrize("kind", ["function", "react"])
def test_never_demoting_window_is_invisible(kind: str) -> None:
    conformance.test_never_demoting_window_is_invisible(kind)


def test_parallel_tool_calls_stay_with_their_results() -> None:
    conformance.test_parallel_tool_calls_stay_with_their_results()


def test_reused_context_keeps_the_memory_between_runs() -> None:
    conformance.test_reused_context_keeps_the_memory_between_runs()
