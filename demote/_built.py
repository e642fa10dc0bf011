"""Constructors of frozen dataclasses for values the engine has already checked.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` and runs
``__post_init__``'s checks: on the hot path of every load (one :class:`~demote.Window`, one
:class:`~demote.window.planner.Plan`, one record per new message) that is a large share
of the work, for values the engine made itself. :func:`unchecked` makes a constructor with
the same signature that sets the slots directly and skips ``__post_init__``. The objects
are the same (equal, hashed, frozen as any other): only their making is cheaper. Public
constructors keep their checks: a user who builds a record gets ``__post_init__``.

The generated source is registered in :mod:`linecache` under a file name of its own (as
attrs does), so a traceback through a constructor shows its lines.
"""

from __future__ import annotations

import dataclasses
import linecache
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["unchecked"]

T = TypeVar("T")

_FACTORY = object()  # a field with a default factory was not passed


def unchecked(cls: type[T]) -> Callable[..., T]:
    """A constructor of the slotted dataclass ``cls`` that skips its checks.

    It takes the arguments ``cls`` does (defaults and default factories included) and
    sets each slot with its descriptor, without ``object.__setattr__`` per field or
    ``__post_init__``.

    Raises:
        TypeError: ``cls`` is not a dataclass with ``__slots__``, or has init-only or
            keyword-only fields (neither is supported here).
    """
    if not dataclasses.is_dataclass(cls) or "__slots__" not in vars(cls):
        raise TypeError(f"{cls!r} is not a slotted dataclass")
    fields = dataclasses.fields(cls)
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_FACTORY": _FACTORY}
    params: list[str] = []
    body: list[str] = ["    self = _new(_cls)"]
    for f in fields:
        if not f.init or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: init-only or keyword-only field")
        name = f.name
        env[f"_set_{name}"] = vars(cls)[name].__set__
        if f.default is not dataclasses.MISSING:
            env[f"_default_{name}"] = f.default
            params.append(f"{name}=_default_{name}")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_factory_{name}"] = f.default_factory
            params.append(f"{name}=_FACTORY")
            body.append(f"    if {name} is _FACTORY: {name} = _factory_{name}()")
        else:
            params.append(name)
        body.append(f"    _set_{name}(self, {name})")
    body.append("    return self")
    source = f"def make({', '.join(params)}):\n" + "\n".join(body) + "\n"
    exec(_compiled(source, cls), env)  # the source is made above from the field names alone
    make: Callable[..., T] = env["make"]
    make.__qualname__ = make.__name__ = f"unchecked_{cls.__name__}"
    make.__doc__ = f"{cls.__name__}(...) without its per-field setattr and checks."
    return make


def _compiled(source: str, cls: type) -> Any:
    """``source`` compiled under a file name of its own, its lines kept in ``linecache``."""
    base = f"<demote unchecked {cls.__module__}.{cls.__qualname__}"
    filename, n = base + ">", 1
    while True:  # another source under a name taken already gets the next free name
        entry = (len(source), None, source.splitlines(True), filename)
        if linecache.cache.setdefault(filename, entry) == entry:
            break
        filename, n = f"{base}-{n}>", n + 1
    return compile(source, filename, "exec")
