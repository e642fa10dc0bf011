"""Token counters, and a cache so each message is counted once in its life.

The default counter approximates like langchain-core's ``count_tokens_approximately``
(characters / 4, rounded up, plus a small per-message overhead) without importing it.
``"tiktoken"`` uses tiktoken's ``cl100k_base`` when installed. Any callable ``str -> int``
works too; :func:`register_counter` gives it a name so a policy that uses it can be written
to JSON and read back.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable

from demote.errors import ConfigError, MissingExtraError

__all__ = [
    "MESSAGE_OVERHEAD",
    "TokenCache",
    "approximate_tokens",
    "counter_name",
    "register_counter",
    "resolve_counter",
]

#: Tokens added per message for role and framing (langchain-core uses 3).
MESSAGE_OVERHEAD = 3

Counter = Callable[[str], int]


def approximate_tokens(text: str) -> int:
    """About one token per four characters, rounded up (langchain-core's heuristic)."""
    return math.ceil(len(text) / 4)


def _tiktoken_counter() -> Counter:
    try:
        import tiktoken
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("tiktoken", "tiktoken") from exc
    try:
        encoding = tiktoken.get_encoding("cl100k_base")
    except Exception as exc:  # first use downloads the encoding: offline, it cannot
        raise ConfigError(f"counter: cannot load tiktoken's cl100k_base encoding: {exc}") from exc

    def count(text: str) -> int:
        return len(encoding.encode(text, disallowed_special=()))

    return count


_REGISTRY: dict[str, Counter] = {"approx": approximate_tokens}
_LAZY: dict[str, Callable[[], Counter]] = {"tiktoken": _tiktoken_counter}
_REGISTRY_LOCK = threading.Lock()


def register_counter(name: str, counter: Counter) -> None:
    """Register ``counter`` under ``name`` so policies can refer to it in JSON."""
    if not name or not isinstance(name, str):
        raise ConfigError("counter name must be a non-empty string")
    if not callable(counter):
        raise ConfigError(f"counter {name!r} must be callable")
    with _REGISTRY_LOCK:
        _REGISTRY[name] = counter


def resolve_counter(counter: str | Counter) -> Counter:
    """The callable behind a counter name (or the callable itself)."""
    if callable(counter):
        return counter
    with _REGISTRY_LOCK:
        if counter in _REGISTRY:
            return _REGISTRY[counter]
        if counter in _LAZY:
            _REGISTRY[counter] = _LAZY[counter]()
            return _REGISTRY[counter]
    known = sorted({*_REGISTRY, *_LAZY})
    raise ConfigError(f"counter: unknown counter {counter!r}; known: {known}")


def counter_name(counter: str | Counter) -> str | None:
    """The registered name of ``counter``, or ``None`` for an unregistered callable."""
    if isinstance(counter, str):
        return counter
    with _REGISTRY_LOCK:
        for name, fn in _REGISTRY.items():
            if fn is counter:
                return name
    return None


class TokenCache:
    """Counts message text with a counter, caching by message fingerprint.

    Thread-safe and bounded (least recently used entries go first). A counter that
    returns a negative number or a non-int raises :class:`ConfigError`.
    """

    __slots__ = ("_counter", "_entries", "_lock", "_max")

    def __init__(self, counter: str | Counter = "approx", *, max_entries: int = 200_000) -> None:
        self._counter = resolve_counter(counter)
        self._entries: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_entries

    def count(self, fingerprint: str, text: str) -> int:
        """Tokens of one message: the counter's count of ``text`` plus the overhead."""
        with self._lock:
            hit = self._entries.get(fingerprint)
            if hit is not None:
                self._entries.move_to_end(fingerprint)
                return hit
        raw = self._counter(text)
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise ConfigError(f"counter: must return a non-negative int, returned {raw!r}")
        tokens = raw + MESSAGE_OVERHEAD
        with self._lock:
            self._entries[fingerprint] = tokens
            if len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return tokens

    def __len__(self) -> int:
        return len(self._entries)
