"""Calls the conversation moved on from without their results (demote.window.pairing)."""

from __future__ import annotations

from demote.window.pairing import unanswered


def test_nothing_dangles_in_a_plain_or_paired_history() -> None:
    assert unanswered([(), (), ()], [None, None, None]) == []
    assert unanswered([(), ("a", "b"), (), (), ()], [None, None, "b", "a", None]) == []


def test_a_call_the_conversation_moved_on_from_is_answered_after_its_results() -> None:
    # user, call(a, b), result(a), user: b's stand-in goes right after a's result
    assert unanswered([(), ("a", "b"), (), ()], [None, None, "a", None]) == [(3, ["b"])]
    # no result at all: right after the call
    assert unanswered([(), ("a",), ()], [None, None, None]) == [(2, ["a"])]


def test_a_call_at_the_end_is_about_to_run() -> None:
    assert unanswered([(), ("a", "b")], [None, None]) == []
    assert unanswered([(), ("a", "b"), ()], [None, None, "a"]) == [], "its results still come"


def test_every_gap_in_order_with_ids_once_in_call_order() -> None:
    opens = [(), ("x", "y", "x"), (), ("z",), ()]
    answers = [None, None, None, None, None]
    assert unanswered(opens, answers) == [(2, ["x", "y"]), (4, ["z"])]
