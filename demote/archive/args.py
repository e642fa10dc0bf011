"""The checks every archive and recall source applies to its arguments, written once.

The SQLite and PostgreSQL archives, the adapters' stores and retrievers and the mem0
recall take the same arguments (a query, ``k``, a token budget, keys, a fence, ranking
weights); each is checked here, so a bad value gets the same typed error, naming the
argument, wherever it is given. Public: a hook or recall source of your own (and the
adapters, see :mod:`demote.kit`) checks its arguments with these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from demote._validate import count
from demote.errors import ArgumentTypeError, ConfigError
from demote.records import storable_text
from demote.window.tokens import Counter, resolve_counter

__all__ = ["budget", "counter", "fence", "keys", "query", "top_k", "weight", "words"]


def weight(name: str, value: object, *, high: float = math.inf) -> float:
    """``value`` as a finite number in ``[0, high]`` (not a bool or a string).

    Raises:
        ConfigError: naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name}: must be a number, got {value!r:.40}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        raise ConfigError(f"{name}: must be a finite number, got {value!r:.24}") from None
    if not math.isfinite(number) or not 0 <= number <= high:
        bound = f"in [0, {high:g}]" if math.isfinite(high) else ">= 0"
        raise ConfigError(f"{name}: must be a finite number {bound}, got {value!r:.40}")
    return number


def query(value: object) -> str:
    """A search's query as text a store can hold (lone surrogates become U+FFFD).

    Raises:
        ArgumentTypeError: ``value`` is not a ``str`` (``None``, bytes, a number).
    """
    if not isinstance(value, str):
        raise ArgumentTypeError(f"query: must be a str, got {type(value).__name__}")
    return storable_text(value)


def top_k(value: object) -> int:
    """A search's ``k``: an int in ``[0, MAX_COUNT]`` (``0`` finds nothing)."""
    return count("k", value, minimum=0)


def budget(value: object) -> int | None:
    """A search's ``budget_tokens``: ``None`` or an int in ``[0, MAX_COUNT]``."""
    return None if value is None else count("budget_tokens", value, minimum=0)


def fence(value: object) -> int | None:
    """An erase's or a batch's fencing token: ``None`` or an int >= 0 that fits 64 bits."""
    return None if value is None else count("fence", value, minimum=0, maximum=2**63 - 1)


def keys(value: object) -> list[str]:
    """Message keys: an iterable of ``str`` (not a string itself), without duplicates.

    Raises:
        ArgumentTypeError: naming ``keys``.
    """
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ArgumentTypeError(f"keys: must be an iterable of str, got {value!r:.40}")
    found = list(dict.fromkeys(value))
    for key in found:
        if not isinstance(key, str):
            raise ArgumentTypeError(f"keys: must hold str keys only, got {key!r:.40}")
    return [storable_text(key) for key in found]


def words(name: str, value: object) -> frozenset[str]:
    """A collection of words (``stop_words``): lowercased; not a string itself."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ArgumentTypeError(f"{name}: must be an iterable of str, got {value!r:.40}")
    found = list(value)
    for word in found:
        if not isinstance(word, str):
            raise ArgumentTypeError(f"{name}: must hold str words only, got {word!r:.40}")
    return frozenset(w.lower() for w in found)


def counter(value: object) -> Counter:
    """A token counter: a registered name or a ``str -> int`` callable."""
    if not (callable(value) or isinstance(value, str)):
        raise ArgumentTypeError(f"counter: must be a name or a callable, got {value!r:.40}")
    return resolve_counter(value)
