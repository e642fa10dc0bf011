"""``demote._built.unchecked``: the engine's constructors of frozen results.

They must make the same objects as the classes' own constructors (equal, frozen, hashed
alike, fresh mutable defaults), only without the per-field setattr and the checks.
"""

from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass, field

import pytest

from demote._built import unchecked
from demote.engine.result import Window
from demote.records import MessageRecord
from demote.window.planner import Plan


def test_a_record_made_unchecked_equals_the_checked_one_and_stays_frozen() -> None:
    make = unchecked(MessageRecord)
    args = ("tool", "42", "fp", 7, (), "c1", "calc")
    made, checked = make(*args), MessageRecord(*args)  # type: ignore[arg-type]
    assert made == checked and hash(made) == hash(checked)
    assert type(made) is MessageRecord and made.to_data is None and made.clipped_tokens is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.text = "changed"  # type: ignore[misc]


def test_keywords_defaults_and_factories_work_as_in_the_class() -> None:
    make = unchecked(Window)
    a = make("c", [], None, ["m"], 3, 4, delivered=2)
    b = Window("c", [], None, ["m"], 3, 4, delivered=2)
    assert a == b and a.calls is True and a.placeholders == {}
    assert a.placeholders is not make("c", [], None, [], 0, 0).placeholders  # fresh each
    plan = unchecked(Plan)(0, 2, 5, 1, size=3)
    assert plan == Plan(0, 2, 5, 1, size=3) and plan.deliver == range(1, 2)


def test_the_checks_are_skipped_by_design_and_missing_arguments_still_fail() -> None:
    with pytest.raises(Exception, match="role must be one of"):
        MessageRecord("robot", "x", "fp", 1)  # type: ignore[arg-type]
    assert unchecked(MessageRecord)("robot", "x", "fp", 1).role == "robot"  # the caller checked
    with pytest.raises(TypeError):
        unchecked(MessageRecord)("user", "x")


def test_classes_it_cannot_build_are_refused() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(frozen=True, slots=True)
    class KeywordOnly:
        a: int
        b: int = field(kw_only=True, default=0)

    with pytest.raises(TypeError, match="not a slotted dataclass"):
        unchecked(NoSlots)
    with pytest.raises(TypeError, match="keyword-only"):
        unchecked(KeywordOnly)
    with pytest.raises(TypeError, match="not a slotted dataclass"):
        unchecked(int)


def test_a_traceback_through_a_constructor_shows_its_source() -> None:
    def broken() -> list[int]:
        raise RuntimeError("factory failed")

    @dataclass(frozen=True, slots=True)
    class Made:
        a: int
        b: list[int] = field(default_factory=broken)

    with pytest.raises(RuntimeError) as caught:
        unchecked(Made)(1)
    shown = "".join(traceback.format_exception(caught.value))
    assert "<demote unchecked " in shown and "if b is _FACTORY: b = _factory_b()" in shown
    again = unchecked(Made)  # made again: the same lines, found again
    with pytest.raises(RuntimeError) as second:
        again(2)
    assert "if b is _FACTORY" in "".join(traceback.format_exception(second.value))
