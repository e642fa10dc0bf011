"""The mem0 object behind every class: its flavour, its dedup queries, its calls.

**Theory of operation.** Each operation is written once, as a flow (:mod:`demote.flow`)
that yields the mem0 calls it needs (:class:`Mem0Call`: method name and arguments) and
receives their results. :func:`~demote.flow.drive_sync` runs it against a sync object,
:func:`~demote.flow.drive_async` against an async one; a sync method on an async object
runs the async driver to completion with :func:`~demote.flow.run_sync`, an async method on
a sync object runs the sync driver in ``asyncio.to_thread``. Exceptions raised by mem0 are
translated at the boundary (:meth:`_Mem0.run`): :class:`~demote.errors.HookError` for hook
and capture, :class:`~demote.errors.StoreError` for recall.

Objects are duck-typed: a hosted client is recognised by the ``options`` parameter of its
``add``, an async one by a coroutine ``add``. :class:`_KnownKeys` is the per-process cache
of keys known to be in mem0.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sqlite3
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from demote.errors import ConfigError, DemoteError, HookError
from demote.flow import Flow, drive_async, drive_sync, run_sync
from demote.mem0.config import (
    _ENTITY_FIELDS,
    CONVERSATION_FIELD,
    KEY_FIELD,
    KEYS_FIELD,
    Namespace,
    _entity_id,
    conversation_namespace,
)
from demote.records import DemotedMessage

_HOSTED_PAGE_SIZE = 100
_ERASE_BATCH = 1000  # memories listed per round of an erase (open source)

_T = TypeVar("_T")


class _Failed(Exception):
    """A mem0 call failed; :meth:`_Mem0.run` gives it the caller's error type."""


@dataclass(slots=True)
class Mem0Call:
    """Call ``memory.<name>(*args, **kwargs)``: a :mod:`demote.flow` operation.

    Blocking, under the object's lock (demote's calls to one sync object never overlap);
    awaited on a native async object. ``name`` ``_PURGE`` runs :func:`_purge_history`.
    """

    memory: Any
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run_sync(self) -> Any:
        """Call the sync object's method."""
        try:
            with _lock_of(self.memory):
                if self.name == _PURGE:
                    return _purge_history(self.memory, *self.args)
                return getattr(self.memory, self.name)(*self.args, **self.kwargs)
        except Exception as exc:
            raise _Failed(f"mem0 {self.name}() failed: {exc}") from exc

    async def run_async(self) -> Any:
        """Await the async object's method (the purge in a thread)."""
        try:
            if self.name == _PURGE:
                return await asyncio.to_thread(_purge_history, self.memory, *self.args)
            return await getattr(self.memory, self.name)(*self.args, **self.kwargs)
        except Exception as exc:
            raise _Failed(f"mem0 {self.name}() failed: {exc}") from exc


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
        # The default namespace is the conversation's own (its run_id): erase may delete
        # all of it. A custom one may be shared (one user's conversations): erase deletes
        # only the memories demote tagged with the conversation.
        self.own_namespace = namespace is None
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

    def call(self, name: str, *args: Any, **kwargs: Any) -> Mem0Call:
        """A call of the mem0 object's method ``name``, for a flow to yield."""
        return Mem0Call(self.memory, name, args, kwargs)

    def add_call(
        self,
        scope: dict[str, str],
        messages: Iterable[DemotedMessage],
        metadata: dict[str, Any],
        infer: bool,
        prompt: str | None = None,
    ) -> Mem0Call:
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
        return self.call("add", payload, **kwargs)

    def stored_keys(
        self, known: _KnownKeys, cid: str, scope: dict[str, str], field: str, keys: list[str]
    ) -> Flow[set[str]]:
        """Which of ``keys`` mem0 already holds (``field`` is where a key sits in metadata).

        Open source: one ``get_all`` with ``field in keys`` pushed down to the vector store.
        Hosted: a paged scan of the namespace, once per conversation; ``known`` keeps it.
        """
        found: set[str] = set()
        if not self.hosted:
            filters = {**scope, field: {"in": keys}}
            result = yield self.call("get_all", filters=filters, top_k=4 * len(keys) + 16)
            for item in _results(result):
                found |= _item_keys(item)
        elif not known.scanned(cid):
            for item in (yield from self._scan(scope)):
                found |= _item_keys(item)
            known.mark_scanned(cid)
        known.add(cid, found)
        return found

    def _scan(self, scope: dict[str, str]) -> Flow[list[dict[str, Any]]]:
        """Every memory of ``scope`` on the hosted API (paged ``get_all``)."""
        items: list[dict[str, Any]] = []
        page = 1
        while True:
            result = yield self.call(
                "get_all", filters=self.filters(scope), page=page, page_size=_HOSTED_PAGE_SIZE
            )
            found = _results(result)
            items += found
            if not found or not (isinstance(result, Mapping) and result.get("next")):
                return items
            page += 1

    def erase(self, known: _KnownKeys, cid: str) -> Flow[int]:
        """Delete the conversation's memories, and ``known``'s keys of it; how many.

        See :meth:`_Mem0Tier.erase` for which memories.

        Memories are listed (``get_all`` on the namespace, expired ones included) and
        deleted one by one (``delete``): mem0's ``delete_all`` does the same inside but
        counts nothing, and the hosted one's filter semantics are not the AND that
        ``get_all`` documents. In a custom namespace only memories whose metadata names
        the conversation are deleted.
        """
        scope = self.scope(cid)
        tag = None if self.own_namespace else cid
        # Hosted: the older memories each one superseded go too (the v3 linked chain),
        # unless the namespace is shared: they may be another conversation's.
        kwargs = {"delete_linked": True} if self.hosted and tag is None else {}
        removed = 0
        seen: set[str] = set()
        while True:  # hosted: one paged scan; open source: rounds of _ERASE_BATCH
            if self.hosted:
                items = yield from self._scan(scope)
            else:
                filters: dict[str, Any] = dict(scope)
                if tag is not None:
                    filters[CONVERSATION_FIELD] = tag
                query = {"filters": filters, "top_k": _ERASE_BATCH, "show_expired": True}
                items = _results((yield self.call("get_all", **query)))
            ids = [str(i["id"]) for i in items if "id" in i and _belongs(i, tag)]
            if seen.intersection(ids):
                raise HookError(f"mem0 still lists deleted memories of {cid!r}: {ids[:3]}")
            seen.update(ids)
            for memory_id in ids:
                yield self.call("delete", memory_id, **kwargs)
                removed += 1
            if not self.hosted and not ids:
                # mem0 logged each deleted memory's text in its history, and kept the
                # namespace's last messages: purge those rows too.
                yield self.call(_PURGE, sorted(seen), scope if tag is None else None)
            if self.hosted or not ids:
                known.forget(cid)
                return removed

    def run(self, flow: Flow[_T], error: type[DemoteError]) -> _T:
        """Run ``flow`` to completion, blocking; a mem0 failure raises ``error``."""
        try:
            if not self.is_async:
                return drive_sync(flow)
            return run_sync(drive_async(flow))
        except _Failed as failed:
            raise error(str(failed)) from failed.__cause__

    async def arun(self, flow: Flow[_T], error: type[DemoteError]) -> _T:
        """Run ``flow`` to completion without blocking the event loop (see :meth:`run`)."""
        try:
            if self.is_async:
                return await drive_async(flow)
            return await asyncio.to_thread(drive_sync, flow)
        except _Failed as failed:
            raise error(str(failed)) from failed.__cause__


_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def _lock_of(memory: Any) -> threading.Lock | contextlib.nullcontext[None]:
    """One lock per sync mem0 object: demote's calls to it never overlap.

    mem0's embedded vector stores (a local Qdrant) are not safe under concurrent calls
    (an index error, seen with a Recorder's worker writing one conversation while another
    is erased); a hook, a capture and a recall sharing one ``Memory`` take turns.
    """
    try:
        with _LOCKS_GUARD:
            lock = _LOCKS.get(memory)
            if lock is None:
                lock = _LOCKS[memory] = threading.Lock()
            return lock
    except TypeError:  # not weak-referenceable: nothing to share it with
        return contextlib.nullcontext()


_PURGE = "demote:purge_history"  # not a mem0 method: the drivers run _purge_history


def _purge_history(memory: Any, memory_ids: Sequence[str], scope: dict[str, str] | None) -> int:
    """Delete erased memories' rows from an open-source mem0's own SQLite history.

    mem0 records every memory's text in its history database (``history_db_path``), a
    deletion included, and keeps the last messages of each entity scope; its API deletes
    neither. This reaches its ``SQLiteManager`` (``memory.db``: a ``connection`` and a
    ``_lock``) and deletes the history rows of ``memory_ids`` and, with ``scope`` (the
    conversation's own namespace), that scope's saved messages, with ``secure_delete`` on so
    the text does not survive in free pages. A mem0 without that database is left alone.

    Returns:
        How many rows were deleted.
    """
    db = getattr(memory, "db", None)
    connection = getattr(db, "connection", None)
    if not isinstance(connection, sqlite3.Connection):
        return 0
    lock = getattr(db, "_lock", None)
    rows = [(memory_id,) for memory_id in memory_ids]
    session = _session_scope(scope) if scope else None
    with lock if isinstance(lock, contextlib.AbstractContextManager) else contextlib.nullcontext():
        (previous,) = connection.execute("PRAGMA secure_delete").fetchone()
        connection.execute("PRAGMA secure_delete = ON")
        try:
            with connection:
                deleted = connection.executemany(
                    "DELETE FROM history WHERE memory_id = ?", rows
                ).rowcount
                if session is not None:
                    deleted += connection.execute(
                        "DELETE FROM messages WHERE session_scope = ?", (session,)
                    ).rowcount
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            raise HookError(f"mem0's history database: {exc}") from exc
        finally:
            connection.execute(f"PRAGMA secure_delete = {int(previous)}")
    return max(deleted, 0)


def _session_scope(scope: dict[str, str]) -> str | None:
    """mem0's key for an entity scope's saved messages (its own function, when it has one)."""
    try:
        from mem0.memory.main import _build_session_scope
    except ImportError:  # another mem0 version: its saved messages are left as they are
        return None
    key = _build_session_scope(scope)
    return key if isinstance(key, str) else None


class _Mem0Tier:
    """``erase`` / ``aerase`` for a class holding ``_mem`` and ``_known`` (an erasable tier)."""

    _mem: _Mem0
    _known: _KnownKeys

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """Delete the conversation's memories from mem0 (blocking).

        With the default namespace that is every memory of its namespace (its ``run_id``
        with the ``user_id`` / ``agent_id`` given here), whoever wrote it: demote, mem0's
        extractor, or the application. With a custom ``namespace``, which may be shared
        by several conversations, only the memories demote wrote for this one (metadata
        ``demote_conversation``). Expired memories too.

        mem0 keeps a change log of its own (the SQLite file at ``history_db_path``) that
        records every memory's text, its deletion included, and the last messages of each
        namespace; its API deletes neither, so an open-source mem0's rows for the deleted
        memories (and, in the conversation's own namespace, its saved messages) are
        deleted from that file directly, with ``secure_delete`` on. The hosted platform's
        history is the platform's.

        Args:
            conversation_id: The conversation.
            fence: Unused: mem0 cannot refuse a late write by token.
            keys: Unused: memories are found by namespace.

        Returns:
            How many memories were deleted (hosted: not counting the superseded versions
            ``delete_linked`` removes with them).

        Raises:
            HookError: mem0 failed; memories deleted before the failure stay deleted.
        """
        return self._mem.run(self._mem.erase(self._known, conversation_id), HookError)

    async def aerase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """:meth:`erase` without blocking the event loop.

        Raises:
            HookError: mem0 failed; memories deleted before the failure stay deleted.
        """
        return await self._mem.arun(self._mem.erase(self._known, conversation_id), HookError)


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

    def forget(self, cid: str) -> None:
        """Drop the conversation (it was erased: its keys are no longer in mem0)."""
        with self._lock:
            self._keys.pop(cid, None)
            self._scanned.discard(cid)

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


def _belongs(item: Mapping[str, Any], conversation: str | None) -> bool:
    """Is ``item`` the conversation's (``None``: every memory of the namespace is)?"""
    if conversation is None:
        return True
    meta = item.get("metadata") or {}
    return isinstance(meta, Mapping) and meta.get(CONVERSATION_FIELD) == conversation


def _item_keys(item: Mapping[str, Any]) -> set[str]:
    meta = item.get("metadata") or {}
    keys = {meta[KEY_FIELD]} if isinstance(meta.get(KEY_FIELD), str) else set()
    batch = meta.get(KEYS_FIELD)
    if isinstance(batch, list):
        keys.update(k for k in batch if isinstance(k, str))
    return keys
