"""Policies: JSON round-trip, parsing, and ConfigError naming the field on bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings

from demote import Bulk, Compact, ConfigError, DemoteError, PerItem, SlidingWindow
from demote.window.tokens import TokenCache, register_counter
from tests.strategies import agent_policies, policies


def _shout(text: str) -> int:
    return len(text.split())


register_counter("test-words", _shout)


@settings(max_examples=100, deadline=None)
@given(policies(counters=("approx", "test-words")))
def test_every_policy_round_trips_through_json(policy: SlidingWindow) -> None:
    text = policy.to_json()
    again = SlidingWindow.from_json(text)
    assert again == policy
    assert again.to_json() == text
    assert SlidingWindow.model_validate(json.loads(text)) == policy


def test_bulk_parses_from_a_dict() -> None:
    p = SlidingWindow.from_json(
        '{"unit": "messages", "limit": 20, "eviction": {"kind": "bulk", "overflow": 8}}'
    )
    assert p.eviction == Bulk(overflow=8)
    assert SlidingWindow.model_validate(
        {"unit": "turns", "limit": 2, "eviction": {"kind": "bulk", "overflow": 8}}
    ).eviction == Bulk(overflow=8)


def test_defaults_and_constructors() -> None:
    p = SlidingWindow(unit="messages", limit=5)
    assert p.eviction == PerItem() and p.pin_system and p.counter == "approx"
    assert SlidingWindow.last_messages(3) == SlidingWindow(unit="messages", limit=3)
    assert SlidingWindow.last_turns(2, eviction=Compact(compact_count=1)).unit == "turns"
    assert SlidingWindow.last_tokens(100).unit == "tokens"


BAD: list[tuple[dict[str, Any], str]] = [
    ({"unit": "messages", "limit": 0}, "limit"),
    ({"unit": "messages", "limit": -3}, "limit"),
    ({"unit": "messages", "limit": "5"}, "limit"),
    ({"unit": "messages", "limit": 5.0}, "limit"),
    ({"unit": "pages", "limit": 5}, "unit"),
    ({"limit": 5}, "unit"),
    ({"unit": "messages", "limit": 5, "eviction": {"kind": "bulk", "overflow": -1}}, "overflow"),
    ({"unit": "messages", "limit": 5, "eviction": {"kind": "bulk"}}, "overflow"),
    (
        {"unit": "messages", "limit": 5, "eviction": {"kind": "compact", "compact_count": 0}},
        "compact_count",
    ),
    ({"unit": "messages", "limit": 5, "eviction": {"kind": "lru"}}, "eviction"),
    ({"unit": "tokens", "limit": 5, "counter": "no-such-counter"}, "counter"),
    ({"unit": "messages", "limit": 5, "colour": "blue"}, "colour"),
    (
        {"unit": "messages", "limit": 5, "eviction": {"kind": "per_item", "extra": 1}},
        "extra",
    ),
]


@pytest.mark.parametrize(("data", "field"), BAD, ids=[f for _, f in BAD])
def test_bad_input_is_a_config_error_naming_the_field(data: dict[str, Any], field: str) -> None:
    for parse in (SlidingWindow.model_validate, lambda d: SlidingWindow.from_json(json.dumps(d))):
        with pytest.raises(ConfigError) as info:
            parse(data)
        assert isinstance(info.value, DemoteError) and isinstance(info.value, ValueError)
        assert field in str(info.value)
    with pytest.raises(ConfigError, match=field):
        SlidingWindow(**data)


def test_bad_eviction_constructors() -> None:
    with pytest.raises(ConfigError, match="overflow"):
        Bulk(overflow=-1)
    with pytest.raises(ConfigError, match="compact_count"):
        Compact(compact_count=0)
    with pytest.raises(ConfigError, match="limit"):
        SlidingWindow.last_messages(0)


def test_not_json_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        SlidingWindow.from_json("{not json")


def test_policies_are_frozen() -> None:
    p = SlidingWindow.last_messages(3)
    with pytest.raises(Exception):  # noqa: B017 - pydantic's own frozen error
        p.limit = 4  # type: ignore[misc]


@pytest.mark.parametrize("bad", [lambda t: -1, lambda t: 1.5, lambda t: "3", lambda t: True])
def test_counter_returning_negative_or_non_int_fails_at_count_time(bad: Any) -> None:
    policy = SlidingWindow.last_tokens(100, counter=bad)  # accepted: checked when counting
    cache = TokenCache(policy.counter)
    with pytest.raises(ConfigError, match="counter"):
        cache.count("fp", "some text")


def test_unregistered_callable_counter_cannot_be_written_to_json() -> None:
    policy = SlidingWindow.last_tokens(100, counter=lambda t: len(t))
    with pytest.raises(ConfigError, match="register_counter"):
        policy.to_json()


def test_registered_callable_counter_round_trips() -> None:
    policy = SlidingWindow.last_tokens(100, counter=_shout)
    text = policy.to_json()
    assert json.loads(text)["counter"] == "test-words"
    again = SlidingWindow.from_json(text)
    assert again.counter == "test-words"
    assert again.resolved_counter() is _shout


@settings(max_examples=100, deadline=None)
@given(agent_policies())
def test_policies_with_clearing_round_trip_through_json(policy: SlidingWindow) -> None:
    again = SlidingWindow.from_json(policy.to_json())
    assert again == policy and again.clearing == policy.clearing


@pytest.mark.parametrize(
    ("clearing", "field"),
    [
        ({"trigger": -1}, "trigger"),
        ({"trigger": 10, "keep": -1}, "keep"),
        ({"trigger": 10, "max_result_tokens": 0}, "max_result_tokens"),
        ({"trigger": 10, "head_tokens": "5"}, "head_tokens"),
        ({"trigger": 10, "colour": 1}, "colour"),
    ],
)
def test_bad_clearing_is_a_config_error_naming_the_field(
    clearing: dict[str, Any], field: str
) -> None:
    data = {"unit": "tokens", "limit": 100, "clearing": {"kind": "clear_tool_results", **clearing}}
    with pytest.raises(ConfigError, match=field):
        SlidingWindow.model_validate(data)
