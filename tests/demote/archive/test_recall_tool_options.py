"""demote.archive.recall_tool: the options both adapters' recall tools share, declared once."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from demote.archive.recall_tool import (
    TOOL_DESCRIPTION,
    TOOL_NAME,
    RecallOptions,
    RecallToolOptions,
    tool_setup,
)
from demote.errors import ArgumentTypeError, ConfigError
from demote.records import Recalled
from demote.window.tokens import approximate_tokens


class Archive:
    """Searches and fetches nothing: enough for a tool to be made over it."""

    def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
        return []

    def fetch(self, conversation_id: str, key: str) -> Recalled | None:
        return None


def test_an_option_not_given_takes_its_one_default() -> None:
    setup = tool_setup(Archive(), {})
    assert setup.options == RecallOptions()
    assert setup.options.counter is approximate_tokens
    assert (setup.name, setup.description) == (TOOL_NAME, TOOL_DESCRIPTION)


def test_each_option_given_is_used() -> None:
    def words(text: str) -> int:
        return len(text.split())

    given: RecallToolOptions = {
        "k": 3,
        "max_k": 9,
        "budget_tokens": 300,
        "max_budget_tokens": 3000,
        "fetch_budget_tokens": 1000,
        "counter": words,
        "snippets": False,
        "name": "lookup",
        "description": "Look it up.",
    }
    setup = tool_setup(Archive(), given)
    assert setup.options == RecallOptions(3, 9, 300, 3000, 1000, words, False)
    assert (setup.name, setup.description) == ("lookup", "Look it up.")


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"kk": 3}, ArgumentTypeError, r"^recall_tool\(\) got an unexpected keyword argument 'kk'"),
        ({"k": 10, "max_k": 5}, ConfigError, "^max_k:"),
        ({"name": ""}, ConfigError, "^name:"),
        ({"counter": "no-such-counter"}, ConfigError, "^counter:"),
    ],
)
def test_bad_options_are_refused_by_name(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        tool_setup(Archive(), options)  # type: ignore[arg-type]
    assert issubclass(ArgumentTypeError, TypeError)  # as Python's own for a bad keyword


def test_both_adapters_take_the_options_after_the_archive_and_the_conversation() -> None:
    for module in ("langchain_demote.tools", "llamaindex_demote.tools"):
        tools = pytest.importorskip(module)
        params = inspect.signature(tools.recall_tool).parameters
        kinds = [(name, p.kind) for name, p in params.items()]
        assert kinds == [
            ("archive", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            ("conversation_id", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            ("options", inspect.Parameter.VAR_KEYWORD),
        ], module
