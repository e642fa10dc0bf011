"""Mem0Recall under a token budget, against a real offline mem0 ``Memory``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from demote.errors import ConfigError
from demote.mem0 import Mem0Hook, Mem0Recall
from demote.records import DemotedMessage, Demotion, fingerprint, make_key
from tests.demote.mem0.test_mem0 import make_memory, mem0_module, network_attempts

__all__ = ["make_memory", "mem0_module", "network_attempts"]  # fixtures, used by name

TEXTS = [
    "my locker code is 4512 " + "and I keep forgetting the locker code " * 8,
    "the locker room is on the second floor",
    "locker code again: 4512",
    "we had pasta for dinner",
]


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def test_results_fit_the_budget_and_shorter_memories_fill_it(
    make_memory: Callable[..., Any],
) -> None:
    memory = make_memory()
    messages = tuple(
        DemotedMessage("user", t, i, make_key("c", i, fingerprint("user", t)))
        for i, t in enumerate(TEXTS)
    )
    Mem0Hook(memory).deliver(Demotion("c", messages))
    recall = Mem0Recall(memory, threshold=0.0)
    ranked = recall.search("c", "what is my locker code", k=4)
    assert ranked[0].text == TEXTS[0]
    budget = tokens(TEXTS[1]) + tokens(TEXTS[2])
    fitted = recall.search("c", "what is my locker code", k=4, budget_tokens=budget)
    assert TEXTS[0] not in [h.text for h in fitted]
    assert sum(tokens(h.text) for h in fitted) <= budget
    assert {h.text for h in fitted} >= {TEXTS[2]}
    assert recall.search("c", "locker", k=4, budget_tokens=0) == []
    with pytest.raises(ConfigError, match="budget_tokens"):
        recall.search("c", "locker", budget_tokens=-5)
