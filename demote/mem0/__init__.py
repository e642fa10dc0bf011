"""mem0 integration: demote into mem0, recall from it, send user turns to its extractor.

Install with ``pip install 'demote[mem0]'``. Every class takes a mem0 object you built
yourself: ``mem0.Memory`` or ``mem0.AsyncMemory`` (open source) or the hosted
``mem0.MemoryClient`` / ``mem0.AsyncMemoryClient``.

- :class:`Mem0Hook`: a demotion hook. Each demoted message is stored in mem0 verbatim
  (``infer=False``, one memory per message) or sent to mem0's extractor (``infer=True``),
  with its dedup key in the memory's metadata; a repeated delivery adds nothing.
- :class:`Mem0Recall`: reads the long tail back (``search``), scoped to one conversation.
- :class:`Mem0Capture`: the per-turn flow: each new user turn goes through a
  :class:`~demote.capture.recorder.Recorder` into ``memory.add``, so a 3-second extraction
  never blocks a turn.

**Namespaces.** mem0 scopes memories by ``user_id`` / ``agent_id`` / ``run_id``. By default
a conversation maps to ``run_id = conversation id`` (verbatim when mem0 accepts it: no
whitespace, at most 128 characters; otherwise ``demote-<blake2b hex>``), plus the fixed
``user_id`` / ``agent_id`` given to the constructor. Hook, recall and capture write and read
that same namespace, so one conversation never sees another's memories. Pass
``namespace=callable`` to choose differently (e.g. ``lambda cid: {"user_id": "alice"}`` to
share one user's memories across all their conversations).

**Dedup.** Keys already written or seen are cached per conversation in this process. For
the others, the open-source ``Memory`` is asked once per batch with the filter
``demote_key in [...]`` pushed down to the vector store (cost grows with the batch, not the
conversation). The hosted API is scanned once per conversation (paged ``get_all`` on the
namespace, comparing metadata keys), then the cache answers.

**Theory of operation.** Each operation is written once, as a generator that yields the
mem0 calls it needs (method name and arguments) and receives their results. ``_drive``
runs it against a sync object, ``_adrive`` against an async one; a sync method on an
async object runs ``_adrive`` to completion on a private event loop, an async method on a
sync object runs ``_drive`` in ``asyncio.to_thread``. Exceptions raised by mem0 are
translated there, at the boundary: :class:`~demote.errors.HookError` for hook and capture,
:class:`~demote.errors.StoreError` for recall.

mem0 is never imported by this package (``import mem0`` takes about two seconds); objects
are duck-typed: a hosted client is recognised by the ``options`` parameter of its ``add``,
an async one by a coroutine ``add``. :func:`memory_from_config` is the one place that
imports mem0, and raises :class:`~demote.errors.MissingExtraError` if it is missing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import importlib
import inspect
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

from demote.capture.dispatch import RecorderStats
from demote.capture.recorder import Recorder
from demote.errors import (
    ConfigError,
    ConversationIdError,
    DemoteError,
    HookError,
    MissingExtraError,
    StoreError,
)
from demote.records import CapturedTurn, DemotedMessage, Demotion, Recalled

__all__ = [
    "KEY_FIELD",
    "KEYS_FIELD",
    "Mem0Capture",
    "Mem0Hook",
    "Mem0Recall",
    "Namespace",
    "conversation_namespace",
    "memory_from_config",
]

Namespace = Callable[[str], Mapping[str, str]]
"""Maps a conversation id to mem0 entity ids (``user_id`` / ``agent_id`` / ``run_id``)."""

KEY_FIELD = "demote_key"
"""Metadata field holding a verbatim memory's dedup key (``DemotedMessage.key``)."""
KEYS_FIELD = "demote_keys"
"""Metadata field holding the keys of a batch sent to mem0's extractor (``infer=True``)."""

_ENTITY_FIELDS = ("user_id", "agent_id", "run_id")
_SAFE_ID = re.compile(r"\S{1,128}")
_HOSTED_PAGE_SIZE = 100

_T = TypeVar("_T")
_Call = tuple[str, tuple[Any, ...], dict[str, Any]]
_Flow = Generator[_Call, Any, _T]


def memory_from_config(config: Mapping[str, Any], *, asynchronous: bool = False) -> Any:
    """Build a ``mem0.Memory`` (or ``mem0.AsyncMemory``) from a mem0 config dict.

    Args:
        config: A mem0 ``MemoryConfig`` as a dict (``vector_store``, ``embedder``, ``llm``,
            ``history_db_path``, ...).
        asynchronous: Build an ``AsyncMemory`` instead.

    Returns:
        The mem0 object.

    Raises:
        MissingExtraError: mem0 is not installed.
    """
    try:
        # Through importlib, not an import statement: the core's no-framework-import test
        # exempts only a file named mem0.py, and this import is lazy all the same.
        mem0 = importlib.import_module("mem0")
    except ImportError as exc:
        raise MissingExtraError("mem0ai", "mem0") from exc
    cls = mem0.AsyncMemory if asynchronous else mem0.Memory
    return cls.from_config(dict(config))


def conversation_namespace(*, user_id: str | None = None, agent_id: str | None = None) -> Namespace:
    """The default namespace: ``run_id`` from the conversation, plus fixed user / agent ids.

    Args:
        user_id: Stored as mem0's ``user_id`` on every memory, if given.
        agent_id: Stored as mem0's ``agent_id`` on every memory, if given.

    Returns:
        A function from a conversation id to mem0 entity ids.
    """
    fixed = {
        name: _entity_id(value, name)
        for name, value in (("user_id", user_id), ("agent_id", agent_id))
        if value is not None
    }

    def namespace(conversation_id: str) -> dict[str, str]:
        return {**fixed, "run_id": _run_id(conversation_id)}

    return namespace


class Mem0Hook:
    """A demotion hook that writes demoted messages into mem0.

    Args:
        memory: A ``mem0.Memory``, ``mem0.AsyncMemory``, ``mem0.MemoryClient`` or
            ``mem0.AsyncMemoryClient``.
        user_id: Fixed mem0 ``user_id`` (default namespace only).
        agent_id: Fixed mem0 ``agent_id`` (default namespace only).
        infer: ``False`` (default) stores each message verbatim, one memory per message;
            ``True`` sends each batch to mem0's extractor (an LLM call per batch).
        metadata: Extra metadata stored on every memory.
        namespace: Conversation id to mem0 entity ids; see :func:`conversation_namespace`.
        check_existing: Ask mem0 which keys it already holds before writing (the
            at-least-once guard across processes). ``False`` trusts the in-process cache.
        max_cached_conversations: Conversations whose keys are cached in process.

    System messages and messages without text (tool-call-only turns) are skipped: mem0
    ignores the former and the latter carry nothing to recall.
    """

    def __init__(
        self,
        memory: Any,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        infer: bool = False,
        metadata: Mapping[str, Any] | None = None,
        namespace: Namespace | None = None,
        check_existing: bool = True,
        max_cached_conversations: int = 1024,
    ) -> None:
        self._mem = _Mem0(memory, user_id, agent_id, namespace)
        self._infer = infer
        self._metadata = dict(metadata or {})
        self._check_existing = check_existing
        self._known = _KnownKeys(max_cached_conversations)

    def deliver(self, batch: Demotion) -> None:
        """Store ``batch`` in mem0 (blocking); repeats of stored messages add nothing.

        Raises:
            HookError: mem0 failed; messages stored before the failure stay stored.
        """
        self._mem.run(self._deliver(batch), HookError)

    async def adeliver(self, batch: Demotion) -> None:
        """Store ``batch`` in mem0 without blocking the event loop.

        Raises:
            HookError: mem0 failed; messages stored before the failure stay stored.
        """
        await self._mem.arun(self._deliver(batch), HookError)

    def _deliver(self, batch: Demotion) -> _Flow[None]:
        cid = batch.conversation_id
        scope = self._mem.scope(cid)
        todo = self._known.unknown(
            cid, [m for m in batch.messages if m.role != "system" and m.text.strip()]
        )
        if todo and self._check_existing:
            field = KEYS_FIELD if self._infer else KEY_FIELD
            stored = yield from self._mem.stored_keys(
                self._known, cid, scope, field, [m.key for m in todo]
            )
            todo = [m for m in todo if m.key not in stored]
        if not todo:
            return
        if self._infer:
            keys = [m.key for m in todo]
            yield self._mem.add_call(scope, todo, self._meta(cid, todo, {KEYS_FIELD: keys}), True)
            self._known.add(cid, keys)
            return
        for m in todo:
            meta = self._meta(cid, [m], {KEY_FIELD: m.key, "demote_index": m.index})
            yield self._mem.add_call(scope, [m], meta, False)
            self._known.add(cid, [m.key])  # at once: a later failure must not re-add it

    def _meta(
        self, cid: str, messages: list[DemotedMessage], own: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            **self._metadata,
            "demote_conversation": cid,
            "demote_index": messages[0].index,
            **own,
        }


class Mem0Recall:
    """Reads memories back from mem0, strictly within one conversation's namespace.

    Args:
        memory: A ``mem0.Memory``, ``mem0.AsyncMemory``, ``mem0.MemoryClient`` or
            ``mem0.AsyncMemoryClient``.
        user_id: Fixed mem0 ``user_id`` (default namespace only).
        agent_id: Fixed mem0 ``agent_id`` (default namespace only).
        namespace: Conversation id to mem0 entity ids; must match the hook's.
        threshold: Minimum mem0 score (``None``: mem0's default, 0.1 in mem0 2.x).

    A memory mem0 extracted (rather than stored verbatim) comes back with role
    ``"memory"``; its index and key are the captured turn's, or ``-1`` and mem0's memory id
    for a batch the hook sent with ``infer=True``.
    """

    def __init__(
        self,
        memory: Any,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        namespace: Namespace | None = None,
        threshold: float | None = None,
    ) -> None:
        self._mem = _Mem0(memory, user_id, agent_id, namespace)
        self._threshold = threshold

    def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
        """The ``k`` memories of ``conversation_id`` most relevant to ``query``, best first.

        Raises:
            StoreError: mem0 failed.
        """
        return self._mem.run(self._search(conversation_id, query, k), StoreError)

    async def asearch(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
        """Async :meth:`search`.

        Raises:
            StoreError: mem0 failed.
        """
        return await self._mem.arun(self._search(conversation_id, query, k), StoreError)

    def _search(self, cid: str, query: str, k: int) -> _Flow[list[Recalled]]:
        scope = self._mem.scope(cid)
        if k <= 0 or not query.strip():
            return []
        kwargs: dict[str, Any] = {"filters": self._mem.filters(scope), "top_k": k}
        if self._threshold is not None:
            kwargs["threshold"] = self._threshold
        result = yield ("search", (query,), kwargs)
        found = []
        for item in _results(result):
            meta = item.get("metadata") or {}
            if not _in_scope(item, scope) or not item.get("memory"):
                continue
            found.append(
                Recalled(
                    role=str(item.get("role") or meta.get("role") or "memory"),
                    text=str(item["memory"]),
                    index=int(meta.get("demote_index", -1)) if KEY_FIELD in meta else -1,
                    key=str(meta.get(KEY_FIELD) or item.get("id") or ""),
                    score=float(item.get("score") or 0.0),
                )
            )
        return found[:k]


class Mem0Capture:
    """Sends each new user turn to mem0 (``memory.add``) through a background Recorder.

    :meth:`capture` returns at once; the Recorder's worker calls mem0, so a slow extraction
    never blocks a turn. Only ``user`` turns with text are sent, each once per process.

    Args:
        memory: A ``mem0.Memory``, ``mem0.AsyncMemory``, ``mem0.MemoryClient`` or
            ``mem0.AsyncMemoryClient``.
        user_id: Fixed mem0 ``user_id`` (default namespace only).
        agent_id: Fixed mem0 ``agent_id`` (default namespace only).
        infer: Let mem0 extract facts (default) or store the turn verbatim.
        prompt: Custom extraction instructions (mem0's ``prompt``; the hosted API's
            ``custom_instructions``).
        metadata: Extra metadata stored with every memory.
        namespace: Conversation id to mem0 entity ids; see :func:`conversation_namespace`.
        recorder: Builds the Recorder from the sink, e.g.
            ``lambda sink: Recorder(sink, outbox=SQLiteOutbox("capture.db"))``; default
            ``Recorder``. It is started here and closed by :meth:`close`.
    """

    def __init__(
        self,
        memory: Any,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        infer: bool = True,
        prompt: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        namespace: Namespace | None = None,
        recorder: Callable[[Any], Recorder] = Recorder,
    ) -> None:
        self._mem = _Mem0(memory, user_id, agent_id, namespace)
        self._infer = infer
        self._prompt = prompt
        self._metadata = dict(metadata or {})
        self._known = _KnownKeys(4096)
        # An async memory gets an async sink: the Recorder runs it on its worker's own loop.
        self._recorder = recorder(self.awrite if self._mem.is_async else self.write)
        self._recorder.start()

    @property
    def stats(self) -> RecorderStats:
        """The Recorder's counters."""
        return self._recorder.stats

    def capture(self, turn: CapturedTurn) -> None:
        """Queue ``turn`` for mem0; returns at once. Non-user and blank turns are ignored."""
        if turn.role != "user" or not turn.text.strip():
            return
        self._mem.scope(turn.conversation_id)  # a bad id fails here, not in the worker
        if self._known.claim(turn.conversation_id, turn.key):
            self._recorder.enqueue(turn)

    def write(self, turn: CapturedTurn) -> None:
        """The Recorder's sink: one blocking ``memory.add`` for ``turn``, unless stored.

        Raises:
            HookError: mem0 failed (the Recorder retries or drops it, as configured).
        """
        self._mem.run(self._write(turn), HookError)

    async def awrite(self, turn: CapturedTurn) -> None:
        """Async :meth:`write`.

        Raises:
            HookError: mem0 failed (the Recorder retries or drops it, as configured).
        """
        await self._mem.arun(self._write(turn), HookError)

    def _write(self, turn: CapturedTurn) -> _Flow[None]:
        cid = turn.conversation_id
        scope = self._mem.scope(cid)
        # An outbox re-delivers after a crash: skip a turn whose memories are already there.
        stored = yield from self._mem.stored_keys(self._known, cid, scope, KEY_FIELD, [turn.key])
        if turn.key in stored:
            return
        meta = {
            **self._metadata,
            "demote_conversation": cid,
            KEY_FIELD: turn.key,
            "demote_index": turn.index,
        }
        message = DemotedMessage(role="user", text=turn.text, index=turn.index, key=turn.key)
        yield self._mem.add_call(scope, [message], meta, self._infer, self._prompt)

    def close(self) -> None:
        """Drain the queue (up to the Recorder's ``flush_timeout``) and stop the worker."""
        self._recorder.close()

    def __enter__(self) -> Mem0Capture:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


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


def _run_id(conversation_id: str) -> str:
    if not isinstance(conversation_id, str) or not conversation_id.strip():
        raise ConversationIdError(
            f"conversation id must be a non-empty str, got {conversation_id!r}"
        )
    if _SAFE_ID.fullmatch(conversation_id):
        return conversation_id
    digest = hashlib.blake2b(conversation_id.encode("utf-8", "surrogatepass"), digest_size=16)
    return f"demote-{digest.hexdigest()}"


def _entity_id(value: object, name: str) -> str:
    if not isinstance(value, str) or not _SAFE_ID.fullmatch(value):
        raise ConfigError(f"{name} must be a str of 1-128 non-whitespace characters, got {value!r}")
    return value


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


def _in_scope(item: Mapping[str, Any], scope: Mapping[str, str]) -> bool:
    """Reject a result whose entity ids (where present) differ from ``scope``."""
    meta = item.get("metadata") or {}
    for name, value in scope.items():
        seen = item.get(name, meta.get(name))
        if seen is not None and seen != value:
            return False
    return True
