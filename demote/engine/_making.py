"""How a Demoter is made: its arguments checked, its parts made and wired to each other.

:class:`Making` is a base of :class:`~demote.engine.Demoter`. The Demoter's ``__init__``
keeps its signature (documented in the Demoter's docstring) and hands every argument to
:meth:`Making._make`, which checks them, sets the Demoter's settings and makes the parts
the Demoter holds, each an object with its own state (see :mod:`demote.engine`).
"""

from __future__ import annotations

import warnings
from typing import Literal

from demote._validate import count, seconds
from demote.engine._compaction import Compactor
from demote.engine._degraded import Degradation
from demote.engine._delivery import Delivery
from demote.engine._erasing import Eraser
from demote.engine._loading import Loader
from demote.engine._pending import Retries
from demote.engine._planning import Planning
from demote.engine._views import ViewCache
from demote.engine._work import Tally
from demote.engine.retry import Backoff, RetryTracker
from demote.errors import ConfigError, DemoteWarning
from demote.events import Observers
from demote.hooks.simple import NoopHook, as_hook
from demote.state.base import StateStore
from demote.state.memory import InMemoryStateStore
from demote.summarize import check_summarizer
from demote.window.policy import Compact, SlidingWindow
from demote.window.tokens import TokenCache

__all__ = ["Making"]


class Making:
    """The base of a Demoter that checks its arguments and makes its parts."""

    def _make(
        self,
        policy: SlidingWindow,
        hook: object | None,
        *,
        state: StateStore | None,
        on_hook_error: Literal["log", "raise"],
        hook_timeout: float | None,
        hook_wait: float | None,
        summarizer: object | None,
        lease_ttl: float,
        cached_conversations: int,
        retry: Backoff | None,
        max_batch: int,
        hook_threads: int,
        hook_queue: int,
        on_store_error: Literal["degrade", "raise"],
    ) -> None:
        """Check the Demoter's arguments (see :class:`~demote.engine.Demoter`), make its parts.

        Raises:
            ConfigError: An argument the Demoter does not take.
        """
        if not isinstance(policy, SlidingWindow):
            raise ConfigError(f"policy: expected a SlidingWindow, got {type(policy).__name__}")
        if on_hook_error not in ("log", "raise"):
            raise ConfigError(f"on_hook_error: must be 'log' or 'raise', got {on_hook_error!r}")
        if on_store_error not in ("degrade", "raise"):
            raise ConfigError(
                f"on_store_error: must be 'degrade' or 'raise', got {on_store_error!r:.40}"
            )
        self.hook_timeout = (
            None if hook_timeout is None else seconds("hook_timeout", hook_timeout, optional=True)
        )
        self.hook_wait = None if hook_wait is None else seconds("hook_wait", hook_wait)
        self.lease_ttl = seconds("lease_ttl", lease_ttl)
        if retry is not None and not isinstance(retry, Backoff):
            raise ConfigError(f"retry: expected a Backoff, got {type(retry).__name__}")
        self.max_batch = count("max_batch", max_batch)
        self.policy = policy
        self.hook: object = NoopHook() if hook is None else as_hook(hook)
        store = InMemoryStateStore() if state is None else state
        for method in ("get", "compare_and_set"):
            if not callable(getattr(store, method, None)):
                raise ConfigError(f"state: {type(store).__name__} has no {method}() method")
        self.state: StateStore = store
        self._on_hook_error: Literal["log", "raise"] = on_hook_error
        self._on_store_error: Literal["degrade", "raise"] = on_store_error
        if summarizer is not None:
            check_summarizer(summarizer)
        elif isinstance(policy.eviction, Compact):
            warnings.warn(
                "a Compact policy without a summarizer behaves as bulk eviction at "
                "limit + 2 x compact_count; pass summarizer= to keep the gist in the prompt",
                DemoteWarning,
                stacklevel=3,
            )
        self.summarizer = summarizer
        self.tokens = TokenCache(policy.counter)
        self._noop = type(self.hook) is NoopHook
        attach = getattr(store, "attach", None)
        if callable(attach):
            attach()
        self._views = ViewCache(count("cached_conversations", cached_conversations))
        self._retry = RetryTracker(retry or Backoff())
        self._observers = Observers()
        self._tally = Tally()
        # Its parts, each with its own state: delivery (gates, leases, the store's
        # breaker, hook threads, background flows), degraded mode, summaries, erase,
        # planning, and the load that drives them.
        self._delivery = Delivery(
            store,
            self.hook,
            hook_timeout=self.hook_timeout,
            hook_wait=self.hook_wait,
            lease_ttl=self.lease_ttl,
            max_batch=self.max_batch,
            hook_threads=count("hook_threads", hook_threads),
            hook_queue=count("hook_queue", hook_queue, minimum=0),
            views=self._views,
            retry=self._retry,
            observers=self._observers,
            tally=self._tally,
        )
        self._degradation = Degradation(self._delivery.breaker, self._observers, self._tally)
        parts = (self._delivery, self._observers, self._tally)
        self._compactor = None if summarizer is None else Compactor(summarizer, *parts)
        self._planning = Planning(
            policy, self._views, self.tokens, self._tally, noop=self._noop, summarizer=summarizer
        )
        self._loader = Loader(
            self._planning,
            self._delivery,
            self._degradation,
            self._compactor,
            self._views,
            self._observers,
            self._tally,
            on_store_error=on_store_error,
            on_hook_error=on_hook_error,
            noop=self._noop,
        )
        # Conversations whose last load left messages pending, loaded again in the
        # background (bounded like the views), so they need no next load of their own.
        self._retries = Retries(
            self._loader, self._delivery, self._retry, self._tally, self._views.size
        )
        self._eraser = Eraser(
            self._delivery, self._compactor, self._views, self._retry, self._tally, self._retries
        )
