"""Argument checks the adapters share (framework-neutral: the message class is a parameter)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar, cast

from demote.errors import MessageTypeError

__all__ = ["check_message", "check_messages"]

M = TypeVar("M")


def check_message(value: object, kind: type[M], argument: str) -> M:
    """``value`` if it is a ``kind``, else :class:`MessageTypeError` naming ``argument``."""
    if not isinstance(value, kind):
        raise MessageTypeError(
            f"{argument}: expected a {kind.__name__}, got {type(value).__name__} {value!r:.80}"
        )
    return value


def check_messages(value: object, kind: type[M], argument: str) -> list[M]:
    """``value`` as a new list if it is a sequence of ``kind`` (not a string), else raise.

    Checks every item before the caller writes anything, so a bad item stores nothing.

    Raises:
        MessageTypeError: ``value`` is a string, bytes, a mapping, a single message, not
            iterable, or holds an item that is not a ``kind`` (``argument[i]`` names it).
    """
    # A list or tuple (the common case) skips the slower abstract-class checks.
    if type(value) not in (list, tuple) and (
        isinstance(value, (str, bytes, Mapping, kind)) or not isinstance(value, Iterable)
    ):
        raise MessageTypeError(
            f"{argument}: expected a list of {kind.__name__}, got {type(value).__name__} "
            f"{value!r:.80}"
        )
    items: list[M] = list(cast("Iterable[M]", value))
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            check_message(item, kind, f"{argument}[{i}]")
    return items
