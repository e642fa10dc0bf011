"""Argument checks, one place, one wording, typed errors.

The numbers an option takes (:func:`count`, :func:`seconds`), file paths, and the messages
an adapter is given (:func:`check_message`, :func:`check_messages`: framework-neutral, the
message class is a parameter).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import TypeVar, cast

from demote.errors import ArgumentTypeError, ConfigError, MessageTypeError

__all__ = [
    "MAX_COUNT",
    "MAX_SECONDS",
    "check_message",
    "check_messages",
    "count",
    "file_path",
    "seconds",
]

M = TypeVar("M")

#: The largest count an option takes (a LIMIT, a batch, a cache size): above it, a
#: number is a mistake, and it would overflow the integers SQL engines and C code use.
MAX_COUNT = 2**31 - 1

#: The longest duration an option takes, in seconds (about 31 years).
MAX_SECONDS = 1e9


def seconds(name: str, value: object, *, optional: bool = False, zero: bool = False) -> float:
    """``value`` as seconds: a finite number > 0 (``>= 0`` with ``zero``).

    Raises:
        ConfigError: naming ``name``, for a bool, a string, ``None`` (unless ``optional``,
            which the caller handles), NaN, an infinity or a number out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        hint = " or None" if optional else ""
        raise ConfigError(f"{name}: must be a number of seconds{hint}, got {value!r:.40}")
    if isinstance(value, int) and value > MAX_SECONDS:  # float() of a huge int overflows
        raise ConfigError(f"{name}: must be at most {MAX_SECONDS:g} seconds, got {value!r:.24}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise ConfigError(f"{name}: must be a finite number {bound}, got {value!r:.40}")
    if value > MAX_SECONDS:
        raise ConfigError(f"{name}: must be at most {MAX_SECONDS:g} seconds, got {value!r:.40}")
    return float(value)


def count(name: str, value: object, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (not a bool, float or string)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: must be an int, got {value!r:.40}")
    if value < minimum:
        raise ConfigError(f"{name}: must be >= {minimum}, got {value!r:.24}")
    if value > maximum:
        raise ConfigError(f"{name}: must be <= {maximum}, got {value!r:.24}")
    return value


def file_path(name: str, value: object) -> str:
    """``value`` as a file path: a non-empty ``str`` or ``os.PathLike`` of one, no NUL.

    Raises:
        ArgumentTypeError: naming ``name``, for anything else (``None``, bytes, a number).
        ConfigError: naming ``name``, for an empty path or one with a NUL or lone surrogate.
    """
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str):
        raise ArgumentTypeError(f"{name}: must be a str or os.PathLike path, got {value!r:.40}")
    if not path or "\x00" in path:
        raise ConfigError(f"{name}: must be a non-empty path without NUL, got {path!r:.40}")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{name}: is not valid Unicode text: {path!r:.40}") from None
    return path


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
