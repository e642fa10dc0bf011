"""Checks for the numbers an option takes: one place, one wording, typed errors."""

from __future__ import annotations

import math

from demote.errors import ConfigError

__all__ = ["MAX_COUNT", "MAX_SECONDS", "count", "seconds"]

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
