"""Process-wide names for the live objects a saved memory refers to.

A framework can save a memory object (LlamaIndex's ``Context.to_dict``, a pickle) but not
the engine behind it: a :class:`~demote.Demoter` holds locks, caches and open stores, and
two copies of one would each think they alone deliver a conversation. So a saved memory
names its demoter (and its recall and capture) by a name registered in the process, and a
restored memory, in this process or in a new one that registered the same names at start,
is attached to the objects registered there::

    from demote.registry import register

    demoter = register("support", Demoter(policy, archive, state=SQLiteStateStore(path)))

An object saved without a name gets one for the life of the process (:func:`name_for`:
``"auto:"`` and a random suffix, held weakly), so saving and restoring within one process
(LlamaIndex round-trips a reused workflow context through ``to_dict`` on every run) needs
no setup; restoring it in another process raises, saying to register a stable name.
Restoring a name the process has not registered raises naming it. Registering a name again replaces
the object (the newest registration wins, so re-running setup code is harmless); memories
already restored keep the object they were given. One object may have several names; it
is saved under the first it still has.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from typing import TypeVar

from demote.errors import ConfigError

__all__ = ["AUTO_PREFIX", "lookup", "name_for", "name_of", "register", "unregister"]

#: How the names :func:`name_for` makes begin (``register`` refuses them).
AUTO_PREFIX = "auto:"

T = TypeVar("T")

_lock = threading.Lock()
_by_name: dict[str, object] = {}
_by_id: dict[int, str] = {}  # id(obj) -> name; the registry holds obj, so ids stay unique
_auto: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()
_auto_by_id: dict[int, str] = {}  # emptied by a finalizer when the object goes


def register(name: str, obj: T) -> T:
    """Register ``obj`` under ``name`` in this process and return it.

    Args:
        name: A non-empty string, the same in every process that saves or restores.
        obj: The object (a Demoter, a recall such as ``SQLiteArchive``, a capture).

    Returns:
        ``obj``, so a registration can wrap the constructor call.

    Raises:
        ConfigError: ``name`` is not a non-empty string, or ``obj`` is ``None``.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name: expected a non-empty str, got {name!r}")
    if name.startswith(AUTO_PREFIX):
        raise ConfigError(f"name: {AUTO_PREFIX!r} names are made by name_for, got {name!r}")
    if obj is None:
        raise ConfigError(f"register({name!r}, None): nothing to register")
    with _lock:
        old = _by_name.get(name)
        _by_name[name] = obj
        if old is not None and old is not obj:
            _rename(old)
        if _name_of_locked(obj) is None:
            _by_id[id(obj)] = name
    return obj


def unregister(name: str) -> None:
    """Forget ``name`` (a no-op if it is not registered)."""
    with _lock:
        obj = _by_name.pop(name, None)
        if obj is not None:
            _rename(obj)


def name_of(obj: object) -> str | None:
    """The name ``obj`` is registered under in this process (its first), or ``None``."""
    with _lock:
        return _name_of_locked(obj)


def name_for(obj: object, what: str = "object") -> str:
    """``obj``'s registered name, or a name for it that holds in this process only.

    The automatic name (:data:`AUTO_PREFIX` and a random suffix) refers to ``obj`` for as
    long as ``obj`` lives, without keeping it alive.

    Args:
        obj: The object to name.
        what: What it is (``"demoter"``, ...), for the error message.

    Returns:
        The name.

    Raises:
        ConfigError: ``obj`` has no registered name and cannot be referred to weakly.
    """
    with _lock:
        name = _name_of_locked(obj) or _auto_by_id.get(id(obj))
        if name is not None and (name in _by_name or _auto.get(name) is obj):
            return name
        name = AUTO_PREFIX + uuid.uuid4().hex
        try:
            _auto[name] = obj
        except TypeError as exc:  # no weak references to it
            raise ConfigError(
                f"{what} {type(obj).__name__} cannot be saved by reference: register it "
                f"under a name: demote.registry.register('<name>', {what})"
            ) from exc
        _auto_by_id[id(obj)] = name
        weakref.finalize(obj, _auto_by_id.pop, id(obj), None)
        return name


def _name_of_locked(obj: object) -> str | None:
    name = _by_id.get(id(obj))
    return name if name is not None and _by_name.get(name) is obj else None


def _rename(obj: object) -> None:
    """``obj`` lost a name: remember another name it still has, or forget it."""
    if _name_of_locked(obj) is not None:
        return
    other = next((n for n, o in _by_name.items() if o is obj), None)
    if other is None:
        _by_id.pop(id(obj), None)
    else:
        _by_id[id(obj)] = other


def lookup(name: str, what: str = "object") -> object:
    """The object registered under ``name``.

    Args:
        name: The registered name.
        what: What the caller restores (``"demoter"``, ...), for the error message.

    Returns:
        The object.

    Raises:
        ConfigError: Nothing is registered under ``name`` in this process.
    """
    with _lock:
        obj = _by_name.get(name)
        if obj is None and name.startswith(AUTO_PREFIX):
            obj = _auto.get(name)
    if obj is None and name.startswith(AUTO_PREFIX):
        raise ConfigError(
            f"{what} {name!r} was named automatically by the process that saved it and "
            "is not in this one (another process, or the object is gone); to restore it "
            "elsewhere, register it under a stable name in every process that saves or "
            f"restores it: demote.registry.register('<name>', {what})"
        )
    if obj is None:
        raise ConfigError(
            f"{what} {name!r} is not registered in this process: call "
            f"demote.registry.register({name!r}, ...) before restoring"
        )
    return obj
