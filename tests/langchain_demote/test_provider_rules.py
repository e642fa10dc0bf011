"""The provider checker names the extra to install when a provider package is missing."""

from __future__ import annotations

import sys

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from demote.errors import MissingExtraError
from langchain_demote.provider_rules import (
    anthropic_violations,
    openai_violations,
    violations,
)

CALL = AIMessage("", tool_calls=[{"name": "read", "args": {"path": "a.py"}, "id": "c1"}])


def test_a_valid_request_has_no_violation() -> None:
    request = [HumanMessage("go"), CALL, ToolMessage("text", tool_call_id="c1")]
    assert violations(request) == []


def test_a_call_without_its_result_is_found_by_both_converters() -> None:
    request = [HumanMessage("go"), CALL, HumanMessage("next")]
    assert anthropic_violations(request)
    assert openai_violations(request)


@pytest.mark.parametrize(
    ("module", "check"),
    [
        ("langchain_anthropic.chat_models", anthropic_violations),
        ("langchain_openai.chat_models.base", openai_violations),
    ],
)
def test_a_missing_provider_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, check: object
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import of it raises ImportError
    with pytest.raises(MissingExtraError, match="providers") as info:
        check([HumanMessage("go")])  # type: ignore[operator]
    assert info.value.extra == "providers"
