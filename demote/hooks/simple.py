"""Small built-in hooks: discard, call a function, or fan out to several hooks.

A plain function is a hook too: ``Demoter(policy, fn)`` (and ``FanOutHook(archive, fn)``)
calls ``fn(batch)`` with each :class:`~demote.records.Demotion`, as
``CallbackHook(fn)`` does (:func:`as_hook`). It gets the batch, not each message, so the
delivery story stays the engine's: one call per batch, once within a process; a function
that raises refuses the whole batch, which is offered again later (with backoff), so no
message is handed over twice in a process because a later one failed. Across restarts
delivery is at-least-once: each message carries its dedup key (``m.key``) for a function
that stores it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from demote.errors import ConfigError
from demote.flow import run_sync
from demote.records import Demotion

__all__ = [
    "CallbackHook",
    "FanOutHook",
    "NoopHook",
    "deliver_async",
    "deliver_sync",
    "native_async",
]


class NoopHook:
    """Accepts every batch and keeps nothing (a window-only memory, like trimming)."""

    def deliver(self, batch: Demotion) -> None:
        """Discard ``batch``."""

    async def adeliver(self, batch: Demotion) -> None:
        """Discard ``batch``."""


def deliver_sync(hook: object, batch: Demotion) -> None:
    """Hand ``batch`` to ``hook`` from sync code (an async-only hook is run to completion)."""
    deliver = getattr(hook, "deliver", None)
    if deliver is not None:
        deliver(batch)
        return
    adeliver = getattr(hook, "adeliver", None)
    if adeliver is None:
        raise ConfigError(f"hook {hook!r} has neither deliver() nor adeliver()")
    run_sync(adeliver(batch))


async def deliver_async(hook: object, batch: Demotion) -> None:
    """Hand ``batch`` to ``hook`` from async code (a sync-only hook runs in a thread)."""
    adeliver = getattr(hook, "adeliver", None)
    if adeliver is not None:
        await adeliver(batch)
        return
    deliver = getattr(hook, "deliver", None)
    if deliver is None:
        raise ConfigError(f"hook {hook!r} has neither deliver() nor adeliver()")
    await asyncio.to_thread(deliver, batch)


def native_async(hook: object) -> bool:
    """Does ``hook.adeliver`` await real async I/O (not a sync call moved to a thread)?

    The engine awaits such a hook; any other runs on the engine's own threads, never the
    event loop's default executor. A hook says so with a ``native_async`` attribute; one
    without it is native if it has ``adeliver``.
    """
    if not callable(getattr(hook, "adeliver", None)):
        return False
    return bool(getattr(hook, "native_async", True))


def as_hook(hook: object) -> object:
    """``hook`` if it has ``deliver`` or ``adeliver``; a plain callable as ``CallbackHook``.

    Raises:
        ConfigError: ``hook`` is a class (not an instance), or neither a hook nor
            callable.
    """
    if isinstance(hook, type):
        raise ConfigError(
            f"hook: got the class {hook.__name__}, not an instance: pass {hook.__name__}(...)"
        )
    if callable(getattr(hook, "deliver", None)) or callable(getattr(hook, "adeliver", None)):
        return hook
    if callable(hook):
        return CallbackHook(hook)
    raise ConfigError(
        f"hook: {hook!r:.80} is neither a hook (an object with deliver() or adeliver()) nor "
        "a function of the batch"
    )


class CallbackHook:
    """Calls ``fn(batch)`` for every batch; ``fn`` may be a plain or an async function.

    What a Demoter makes of a plain function given as its hook. ``fn`` receives the
    :class:`~demote.records.Demotion` (its messages carry their dedup keys); raising
    refuses the whole batch (see the module docstring). A sync ``fn`` runs in a worker
    thread for async callers; an async ``fn`` is run to completion for sync callers.
    """

    def __init__(self, fn: Callable[[Demotion], Any] | Callable[[Demotion], Awaitable[Any]]):
        if not callable(fn):
            raise ConfigError(f"fn: {fn!r} is not callable")
        self.fn = fn
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - async callable objects too
        )

    @property
    def native_async(self) -> bool:
        """Only an async ``fn`` is awaited; a sync one runs on the engine's threads."""
        return self._is_async

    def deliver(self, batch: Demotion) -> None:
        """Call ``fn`` (to completion, if it is async)."""
        result = self.fn(batch)
        if inspect.isawaitable(result):
            run_sync(result)

    async def adeliver(self, batch: Demotion) -> None:
        """Await ``fn`` (a sync ``fn`` runs in a worker thread)."""
        if self._is_async:
            result = self.fn(batch)
            if inspect.isawaitable(result):
                await result
        else:
            await asyncio.to_thread(self.fn, batch)


class FanOutHook:
    """Delivers every batch to several hooks, in order; fails if any of them fails.

    Each hook may be a plain function too (see :func:`as_hook`). A failure stops the batch
    at that hook and is re-raised, so the watermark does not advance and the whole batch is
    offered again: the hooks before it see it twice, which is why built-in hooks are
    idempotent on the message key.
    """

    def __init__(self, *hooks: object) -> None:
        if not hooks:
            raise ConfigError("FanOutHook needs at least one hook")
        self.hooks = tuple(as_hook(hook) for hook in hooks)

    @property
    def native_async(self) -> bool:
        """Awaited only if every hook is (else the whole fan-out runs on a thread)."""
        return all(native_async(hook) for hook in self.hooks)

    def parts(self) -> tuple[object, ...]:
        """The hooks it delivers to (each is erased on its own: see :mod:`demote.erase`)."""
        return self.hooks

    def deliver(self, batch: Demotion) -> None:
        """Deliver to each hook in turn."""
        for hook in self.hooks:
            deliver_sync(hook, batch)

    async def adeliver(self, batch: Demotion) -> None:
        """Deliver to each hook in turn."""
        for hook in self.hooks:
            await deliver_async(hook, batch)

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        """Keys that every hook that can tell already holds (empty if none can tell)."""
        known: set[str] | None = None
        for hook in self.hooks:
            probe = getattr(hook, "has_keys", None)
            if probe is None:
                return set()
            held = set(probe(conversation_id, keys))
            known = held if known is None else known & held
        return known or set()
