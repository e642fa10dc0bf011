"""The engine's own I/O operations: the hook, a key lookup, a summary, a store call.

The engine's logic lives in generators run by the drivers of :mod:`demote.flow`
(sans-I/O, like httpx's ``auth_flow``): they yield an operation when they need I/O and
receive its result, or its exception, back. Cancelling an async driver closes the flow,
so its ``finally`` blocks run (the in-flight gate is always released; a lease is handed to
the engine's keeper thread).

Every I/O of a load is an operation: the state store's reads, leases and commits (a
:class:`~demote.flow.Call` of the store, made by :func:`store_call`), the hook
(:class:`Deliver`), a key lookup (:class:`HasKeys`), a summary. So the async path awaits
the stores' async twins and never blocks the loop.

:class:`Deliver` waits for the hook at most ``hook_wait``; a call that outlives it comes
back as a :class:`Running` call, which a background flow
(:class:`~demote.flow.Spawn`) follows to its end with :class:`Outcome`: a runner
thread's future from a thread, a task on its loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from demote.engine._runner import HookRunner
from demote.errors import HookBusy, HookTimeout, SummarizerError
from demote.flow import Call, run_sync
from demote.hooks.simple import deliver_sync, native_async
from demote.records import Demotion, MessageRecord, storable_text


def store_call(store: object, name: str, *args: Any, **kwargs: Any) -> Call:
    """A :class:`Call` of a store method (keyword arguments included)."""
    return Call(store, name, args, kwargs)


@dataclass(slots=True)
class HasKeys:
    """Which of ``keys`` the hook already holds (``ahas_keys`` on the async path)."""

    hook: object
    conversation_id: str
    keys: list[str]

    def run_sync(self) -> set[str]:
        return set(self.hook.has_keys(self.conversation_id, self.keys))  # type: ignore[attr-defined]

    async def run_async(self) -> set[str]:
        twin = getattr(self.hook, "ahas_keys", None)
        if twin is not None:
            return set(await twin(self.conversation_id, self.keys))
        probe = self.hook.has_keys  # type: ignore[attr-defined]
        return set(await asyncio.to_thread(probe, self.conversation_id, self.keys))


@dataclass(frozen=True, slots=True)
class Running:
    """A hook call still going on after its load stopped waiting for it.

    ``call`` is a runner thread's future (a sync hook) or a task on the load's event loop
    (a native async hook, which carries ``hook_timeout`` inside it). ``deadline`` is when
    ``hook_timeout`` runs out for a sync call (``time.monotonic()``; ``None``: unbounded,
    or bounded inside the task); ``timed_out`` says it ran out already, within the wait.
    """

    call: Future[None] | asyncio.Task[None]
    deadline: float | None
    timed_out: bool


@dataclass(slots=True)
class Deliver:
    """Hand a batch to the hook; wait for it at most ``wait`` (and ``timeout``) seconds.

    The result is ``None`` when the hook accepted the batch within the wait (its error is
    raised), or a :class:`Running` call that goes on in the background: the engine keeps
    the conversation busy (gate and lease) until it ends, then commits its outcome. When
    ``timeout`` (``hook_timeout``) is no longer than ``wait``, the load waits for it, as
    it did before there was a wait: a native async hook is then cancelled and raises
    :class:`~demote.errors.HookTimeout`, a sync call (which cannot be stopped) comes back
    as ``Running`` with ``timed_out`` set. A sync hook runs on the engine's own
    :class:`~demote.engine._runner.HookRunner` whenever there is a bound or a loop to keep free.
    ``orphan`` is handed a call the load was interrupted (cancelled) while waiting for.
    """

    hook: object
    batch: Demotion
    wait: float | None
    timeout: float | None
    runner: HookRunner
    orphan: Callable[[Running], None]

    def _bound(self) -> tuple[float | None, bool]:
        """How long to wait here, and whether that bound is ``hook_timeout`` itself."""
        if self.wait is None or (self.timeout is not None and self.timeout <= self.wait):
            return self.timeout, True
        return self.wait, False

    def _running(self, future: Future[None], began: float, final: bool) -> Running:
        deadline = None if self.timeout is None else began + self.timeout
        return Running(future, deadline, final)

    def _unstarted(self, future: Future[None], final: bool) -> None:
        """At ``hook_timeout``, take back a call still queued for a hook thread."""
        if final and self.runner.withdraw(future):
            raise HookBusy(not_started(self.timeout, self.runner))

    def run_sync(self) -> Running | None:
        bound, final = self._bound()
        if bound is None:
            deliver_sync(self.hook, self.batch)
            return None
        began = time.monotonic()
        future = self.runner.submit(deliver_sync, self.hook, self.batch)
        try:
            future.result(bound)
        except TimeoutError:
            if future.done():  # it ended as the wait ran out: its own outcome counts
                future.result()
                return None
            self._unstarted(future, final)
            return self._running(future, began, final)
        except Exception:
            raise
        except BaseException:  # interrupted: the thread runs on, the conversation stays busy
            if not future.done():
                self.orphan(self._running(future, began, final))
            raise
        return None

    async def run_async(self) -> Running | None:
        bound, final = self._bound()
        began = time.monotonic()
        if native_async(self.hook):
            coro = _within(self.hook.adeliver(self.batch), self.timeout)  # type: ignore[attr-defined]
            if final:  # cancelled with the load, or by hook_timeout
                await coro
                return None
            call = asyncio.ensure_future(coro)
            try:
                await asyncio.wait_for(asyncio.shield(call), bound)
            except TimeoutError:
                if call.done():  # it ended as the wait ran out: its own outcome counts
                    call.result()
                    return None
                return Running(call, None, False)
            except BaseException:
                call.cancel()  # the load was cancelled: so is its hook call
                raise
            return None
        future = self.runner.submit(deliver_sync, self.hook, self.batch)
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), bound)
        except TimeoutError:
            if future.done():
                future.result()  # its own outcome counts
                return None
            self._unstarted(future, final)
            return self._running(future, began, final)
        except Exception:
            raise
        except BaseException:  # cancelled: the thread runs on, the conversation stays busy
            if not future.done():
                self.orphan(self._running(future, began, final))
            raise
        return None


def not_started(timeout: float | None, runner: HookRunner | None) -> str:
    """Why a queued call was withdrawn (the :class:`~demote.errors.HookBusy` message)."""
    within = "" if timeout is None else f" within {timeout} s"
    threads = "every hook thread" if runner is None else f"all {runner.size} hook threads"
    return (
        f"the hook call did not start{within}: {threads} stayed busy with earlier calls "
        "(a hung sink?); it was withdrawn, its messages stay pending"
    )


async def _within(call: Awaitable[None], timeout: float | None) -> None:
    """Await a native async hook call for at most ``timeout`` seconds."""
    try:
        await asyncio.wait_for(call, timeout)
    except TimeoutError as exc:
        raise HookTimeout(f"hook did not finish within {timeout} s") from exc


@dataclass(slots=True)
class Outcome:
    """Wait for a :class:`Running` call to end, until its deadline (``None``: no bound).

    The result is ``True`` when the call ended well, ``False`` when the deadline passed
    with the call still running; the call's own error is raised, and a sync call still
    queued for a hook thread at the deadline is withdrawn: :class:`~demote.errors.HookBusy`.
    """

    running: Running
    deadline: float | None

    def _left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def run_sync(self) -> bool:
        call = self.running.call
        if isinstance(call, asyncio.Future):  # pragma: no cover - tasks live on async paths
            raise TypeError("a task is awaited on its own loop")
        try:
            call.result(self._left())
        except TimeoutError:
            if call.done():  # it ended as the deadline passed: its own outcome counts
                call.result()
                return True
            if self.deadline is not None and call.cancel():  # never started: withdrawn
                raise HookBusy(not_started(None, None)) from None
            return False
        return True

    async def run_async(self) -> bool:
        call = self.running.call
        waited = call if isinstance(call, asyncio.Future) else asyncio.wrap_future(call)
        try:
            await asyncio.wait_for(asyncio.shield(waited), self._left())
        except TimeoutError:
            if waited.done():  # it ended as the deadline passed: its own outcome counts
                waited.result()
                return True
            sync = not isinstance(call, asyncio.Future)
            if self.deadline is not None and sync and call.cancel():  # never started
                raise HookBusy(not_started(None, None)) from None
            return False
        return True


@dataclass(slots=True)
class Summarize:
    """Fold messages into the running summary; the result is the new summary text."""

    summarizer: object
    previous: str | None
    messages: Sequence[MessageRecord]

    def run_sync(self) -> str:
        fn = getattr(self.summarizer, "summarize", None)
        if fn is not None:
            return _text(fn(self.previous, self.messages))
        return _text(run_sync(self.summarizer.asummarize(self.previous, self.messages)))  # type: ignore[attr-defined]

    async def run_async(self) -> str:
        fn = getattr(self.summarizer, "asummarize", None)
        if fn is not None:
            return _text(await fn(self.previous, self.messages))
        summarize = self.summarizer.summarize  # type: ignore[attr-defined]
        return _text(await asyncio.to_thread(summarize, self.previous, self.messages))


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise SummarizerError(f"summarizer returned {type(value).__name__}, not str")
    return storable_text(value)  # the summary goes into the state store
