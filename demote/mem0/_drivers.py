"""The mem0 object behind every class: its flavour, its dedup queries, the two drivers.

**Theory of operation.** Each operation is written once, as a generator that yields the
mem0 calls it needs (method name and arguments) and receives their results. ``_drive``
runs it against a sync object, ``_adrive`` against an async one; a sync method on an
async object runs ``_adrive`` to completion on a private event loop, an async method on a
sync object runs ``_drive`` in ``asyncio.to_thread``. Exceptions raised by mem0 are
translated there, at the boundary: :class:`~demote.errors.HookError` for hook and capture,
:class:`~demote.errors.StoreError` for recall.

Objects are duck-typed: a hosted client is recognised by the ``options`` parameter of its
``add``, an async one by a coroutine ``add``. :class:`_KnownKeys` is the per-process cache
of keys known to be in mem0.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections import OrderedDict
from collections.abc import Coroutine, Generator, Iterable, Mapping
from typing import Any, TypeVar

from demote.errors import ConfigError, DemoteError
from demote.mem0.config import (
    _ENTITY_FIELDS,
    KEY_FIELD,
    KEYS_FIELD,
    Namespace,
    _entity_id,
    conversation_namespace,
)
from demote.records import DemotedMessage

_HOSTED_PAGE_SIZE = 100

_T = TypeVar("_T")
_Call = tuple[str, tuple[Any, ...], dict[str, Any]]
_Flow = Generator[_Call, Any, _T]


class _Mem0:
    """One mem0 object: its flavour (sync/async, open source/hosted) and its drivers."""

    def __init__(
        self, memory: Any, user_id: str | None, agent_id: str | None, namespace: Namespace | None
    ) -> None:
        add = getattr(memory, "add", None)
        if not callable(add):
            raise ConfigError(f"memory must be a mem0 Memory or MemoryClient, got {memory!r}")
        if namespace is not None and (user_id is not None or agent_id is not None):
            raise ConfigError("pass either namespace or user_id/agent_id, not both")
        self.memory = memory
        self.hosted = "options" in inspect.signature(add).parameters
        self.is_async = inspect.iscoroutinefunction(add)
        self.namespace = namespace or conversation_namespace(user_id=user_id, agent_id=agent_id)

    def scope(self, conversation_id: str) -> dict[str, str]:
        """The mem0 entity ids of ``conversation_id``, validated."""
        scope = {k: v for k, v in self.namespace(conversation_id).items() if v is not None}
        if not scope or set(scope) - set(_ENTITY_FIELDS):
            raise ConfigError(
                f"namespace({conversation_id!r}) must map to some of {_ENTITY_FIELDS}, got {scope}"
            )
        return {name: _entity_id(value, name) for name, value in scope.items()}

    def filters(self, scope: dict[str, str]) -> dict[str, Any]:
        """``search`` / ``get_all`` filters for ``scope`` in this flavour's dialect."""
        if self.hosted:
            return {"AND": [{name: value} for name, value in scope.items()]}
        return dict(scope)

    def add_call(
        self,
        scope: dict[str, str],
        messages: Iterable[DemotedMessage],
        metadata: dict[str, Any],
        infer: bool,
        prompt: str | None = None,
    ) -> _Call:
        """An ``add`` call: OSS takes entity ids as keywords, the hosted v3 API in filters."""
        payload = [{"role": m.role, "content": m.text} for m in messages]
        kwargs: dict[str, Any] = {"metadata": metadata, "infer": infer}
        if self.hosted:
            kwargs["filters"] = dict(scope)
            if prompt is not None:
                kwargs["custom_instructions"] = prompt
        else:
            kwargs.update(scope)
            if prompt is not None:
                kwargs["prompt"] = prompt
        return ("add", (payload,), kwargs)

    def stored_keys(
        self, known: _KnownKeys, cid: str, scope: dict[str, str], field: str, keys: list[str]
    ) -> _Flow[set[str]]:
        """Which of ``keys`` mem0 already holds (``field`` is where a key sits in metadata).

        Open source: one ``get_all`` with ``field in keys`` pushed down to the vector store.
        Hosted: a paged scan of the namespace, once per conversation; ``known`` keeps it.
        """
        found: set[str] = set()
        if not self.hosted:
            filters = {**scope, field: {"in": keys}}
            result = yield ("get_all", (), {"filters": filters, "top_k": 4 * len(keys) + 16})
            for item in _results(result):
                found |= _item_keys(item)
        elif not known.scanned(cid):
            page = 1
            while True:
                result = yield (
                    "get_all",
                    (),
                    {"filters": self.filters(scope), "page": page, "page_size": _HOSTED_PAGE_SIZE},
                )
                items = _results(result)
                for item in items:
                    found |= _item_keys(item)
                if not items or not (isinstance(result, Mapping) and result.get("next")):
                    break
                page += 1
            known.mark_scanned(cid)
        known.add(cid, found)
        return found

    def run(self, flow: _Flow[_T], error: type[DemoteError]) -> _T:
        """Run ``flow`` to completion, blocking."""
        if not self.is_async:
            return _drive(self.memory, flow, error)
        return _run_coroutine(_adrive(self.memory, flow, error))

    async def arun(self, flow: _Flow[_T], error: type[DemoteError]) -> _T:
        """Run ``flow`` to completion without blocking the event loop."""
        if self.is_async:
            return await _adrive(self.memory, flow, error)
        return await asyncio.to_thread(_drive, self.memory, flow, error)


def _drive(memory: Any, flow: _Flow[_T], error: type[DemoteError]) -> _T:
    try:
        call = next(flow)
        while True:
            name, args, kwargs = call
            try:
                result = getattr(memory, name)(*args, **kwargs)
            except Exception as exc:
                raise error(f"mem0 {name}() failed: {exc}") from exc
            call = flow.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        flow.close()


async def _adrive(memory: Any, flow: _Flow[_T], error: type[DemoteError]) -> _T:
    try:
        call = next(flow)
        while True:
            name, args, kwargs = call
            try:
                result = await getattr(memory, name)(*args, **kwargs)
            except Exception as exc:
                raise error(f"mem0 {name}() failed: {exc}") from exc
            call = flow.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        flow.close()


def _run_coroutine(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion from sync code, even on a thread that runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called from inside a running loop: that loop cannot be re-entered, so run a private
    # one in a worker thread and wait for it (this blocks the caller, as a sync call does).
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="demote-mem0") as pool:
        return pool.submit(asyncio.run, coro).result()


class _KnownKeys:
    """Keys known to be in mem0, per conversation, with LRU eviction (thread-safe)."""

    def __init__(self, max_conversations: int) -> None:
        if max_conversations < 1:
            raise ConfigError(f"max_cached_conversations must be >= 1, got {max_conversations}")
        self._max = max_conversations
        self._keys: OrderedDict[str, set[str]] = OrderedDict()
        self._scanned: set[str] = set()
        self._lock = threading.Lock()

    def _get(self, cid: str) -> set[str]:
        keys = self._keys.get(cid)
        if keys is None:
            keys = self._keys[cid] = set()
            while len(self._keys) > self._max:
                old, _ = self._keys.popitem(last=False)
                self._scanned.discard(old)
        self._keys.move_to_end(cid)
        return keys

    def unknown(self, cid: str, messages: list[DemotedMessage]) -> list[DemotedMessage]:
        """``messages`` whose keys are not known, each key once."""
        fresh: dict[str, DemotedMessage] = {}
        with self._lock:
            known = self._get(cid)
            for m in messages:
                if m.key not in known:
                    fresh.setdefault(m.key, m)
        return list(fresh.values())

    def add(self, cid: str, keys: Iterable[str]) -> None:
        with self._lock:
            self._get(cid).update(keys)

    def claim(self, cid: str, key: str) -> bool:
        """Add ``key``; ``False`` if it was already known."""
        with self._lock:
            keys = self._get(cid)
            if key in keys:
                return False
            keys.add(key)
            return True

    def scanned(self, cid: str) -> bool:
        with self._lock:
            return cid in self._scanned and cid in self._keys

    def mark_scanned(self, cid: str) -> None:
        with self._lock:
            self._get(cid)
            self._scanned.add(cid)


def _results(result: Any) -> list[dict[str, Any]]:
    """The list of memory dicts in a mem0 answer (``{"results": [...]}`` or a bare list)."""
    items = result.get("results", []) if isinstance(result, Mapping) else result
    if not isinstance(items, list):
        return []
    return [item for item in items if isinstance(item, dict)]


def _item_keys(item: Mapping[str, Any]) -> set[str]:
    meta = item.get("metadata") or {}
    keys = {meta[KEY_FIELD]} if isinstance(meta.get(KEY_FIELD), str) else set()
    batch = meta.get(KEYS_FIELD)
    if isinstance(batch, list):
        keys.update(k for k in batch if isinstance(k, str))
    return keys
