"""Checks for the numbers an option takes: one place, one wording, typed errors."""

from __future__ import annotations

import math

from demote.errors import ConfigError

__all__ = ["count", "seconds"]


def seconds(name: str, value: object, *, optional: bool = False, zero: bool = False) -> float:
    """``value`` as seconds: a finite number > 0 (``>= 0`` with ``zero``).

    Raises:
        ConfigError: naming ``name``, for a bool, a string, ``None`` (unless ``optional``,
            which the caller handles), NaN, an infinity or a number out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        hint = " or None" if optional else ""
        raise ConfigError(f"{name}: must be a number of seconds{hint}, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise ConfigError(f"{name}: must be a finite number {bound}, got {value!r}")
    return float(value)


def count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum`` (not a bool, float or string)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: must be an int, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name}: must be >= {minimum}, got {value}")
    return value
