"""Erase: forget a conversation everywhere demote put it.

``clear`` is what the frameworks mean by it: the history is emptied and demotion starts
over, but what the long tail already holds stays there (it is the point of a long tail).
``erase`` is for a user who asks to be forgotten, or an operator deleting a tenant:
:meth:`demote.Demoter.erase` removes the conversation's demotion state (watermarks,
summary, anchors, lease) and asks every *tier* behind the hook to delete what it holds.

A tier is a hook that stores something. It can erase if it has
``erase(conversation_id, *, fence=None, keys=None) -> int | None`` (and optionally an
async ``aerase``): it deletes everything of that conversation and returns how many items
it removed (``None`` if it cannot count). ``keys`` are the dedup keys the engine can derive
from the conversation's current history (the adapters pass it), for stores that can only
delete by id. ``fence`` is the fencing token the erase holds: a tier that remembers it can
refuse a delivery from a worker whose lease is older (one that was still in flight when the
erase ran). A hook that holds others says so with ``parts()`` (``FanOutHook``, a
``Recorder`` and its sink): each part is a tier too. A tier without ``erase`` is reported
as ``unsupported``: it may still hold the conversation.

An erase that races a delivery in flight waits for it first: it takes the conversation's
gate and lease like a load does (up to ``wait`` seconds; the holder renews its lease while
its hook runs). If the holder does not finish in time the erase takes over: it revokes the
lease (the late commit is refused) and erases with a newer fencing token, which fencing
tiers use to refuse the late write; the report says so (``took_over``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from demote._delivery import DeliveryMixin, Hold
from demote._flow import Call, Flow, Sleep
from demote.errors import ConfigError
from demote.records import MessageRecord, make_key
from demote.state.base import validate_conversation_id

__all__ = ["Erasable", "EraseReport", "TierReport", "tiers"]

T = TypeVar("T")

_POLL_SECONDS = 0.05


@runtime_checkable
class Erasable(Protocol):
    """A tier that can delete everything it holds of one conversation."""

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int | None:
        """Delete the conversation's items; how many were removed (``None``: unknown)."""


@dataclass(frozen=True, slots=True)
class TierReport:
    """What one tier did.

    Attributes:
        tier: The tier's class name (and its place, for parts: ``FanOutHook[1]``).
        status: ``erased``, ``unsupported`` (it cannot erase: it may still hold the
            conversation) or ``failed`` (it raised; see ``error``).
        removed: Items it removed, if it could count them.
        error: The failure, as ``repr(exception)``.
    """

    tier: str
    status: Literal["erased", "unsupported", "failed"]
    removed: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class EraseReport:
    """What :meth:`demote.Demoter.erase` did.

    Attributes:
        conversation_id: The conversation.
        tiers: One report per tier, in the order the hook holds them.
        state: The demotion state (watermarks, summary, lease) was deleted.
        took_over: A delivery in flight did not end within ``wait``: its lease was revoked
            and the erase ran with a newer fencing token. Tiers that check tokens refuse
            its late write; others may receive it (erase again once it has ended).
        inner: Messages the adapter removed from its inner store (``None``: not asked).
    """

    conversation_id: str
    tiers: tuple[TierReport, ...]
    state: bool = True
    took_over: bool = False
    inner: int | None = None

    @property
    def complete(self) -> bool:
        """Did every tier erase, with no delivery left in flight?"""
        return not self.took_over and all(t.status == "erased" for t in self.tiers)


def tiers(hook: object, name: str | None = None) -> Iterator[tuple[str, object]]:
    """Every tier behind ``hook``, named, depth first (containers name their parts)."""
    label = name or type(hook).__name__
    parts = getattr(hook, "parts", None)
    held: Sequence[object] = tuple(parts()) if callable(parts) else ()
    if callable(getattr(hook, "erase", None)) or callable(getattr(hook, "aerase", None)):
        yield label, hook
    elif not held and type(hook).__name__ != "NoopHook":
        yield label, hook  # keeps something, cannot erase: reported as unsupported
    for i, part in enumerate(held):
        yield from tiers(part, f"{label}[{i}].{type(part).__name__}")


class EraseMixin(DeliveryMixin):
    """The Demoter's ``erase``."""

    lease_ttl: float

    def _erase(
        self,
        conversation_id: str,
        messages: Sequence[T] | None,
        describe: Callable[[T], MessageRecord] | None,
        wait: float | None,
    ) -> Flow[EraseReport]:
        cid = validate_conversation_id(conversation_id)
        if (messages is None) != (describe is None):
            raise ConfigError("erase: give both messages and describe, or neither")
        keys = None
        if messages is not None and describe is not None:
            keys = [make_key(cid, i, describe(m).fingerprint) for i, m in enumerate(messages)]
        deadline = time.monotonic() + (self.lease_ttl if wait is None else wait)
        hold: Hold | None = None
        took_over = False
        try:
            while True:  # wait for a delivery in flight, here or elsewhere, to end
                hold = yield from self._take_leased(cid)
                if hold is not None or time.monotonic() >= deadline:
                    break
                yield Sleep(_POLL_SECONDS)
            if hold is None:  # it did not end in time: revoke its lease and take over
                took_over = True
                with self._lock:
                    self._gates.pop(cid, None)
                yield from self._store("delete", cid)
                hold = yield from self._take_leased(cid)
            fence = hold.lease.token if hold is not None and hold.lease is not None else None
            reports = []
            for label, tier in tiers(self.hook):
                if not (callable(getattr(tier, "erase", None)) or hasattr(tier, "aerase")):
                    reports.append(TierReport(label, "unsupported"))
                    continue
                try:
                    removed = yield Call(tier, "erase", (cid,), {"fence": fence, "keys": keys})
                except Exception as exc:  # reported, and the other tiers still erase
                    reports.append(TierReport(label, "failed", error=repr(exc)))
                    continue
                reports.append(TierReport(label, "erased", _count(removed)))
            yield from self._store("delete", cid)  # state, summary and lease, bytes too
            if hold is not None and hold.lease is not None:
                hold.released = True
                self._keeper.drop(hold.lease)
            self._forget_everywhere(cid)
            return EraseReport(cid, tuple(reports), True, took_over)
        finally:
            if hold is not None:
                self._let_go(hold)

    def _forget_everywhere(self, cid: str) -> None:
        """Drop what this process keeps of the conversation (caches, counters, errors)."""
        self._views.forget(cid)
        self._retry.succeeded(cid)
        with self._tally.lock:
            self._tally.errors.pop(cid, None)
            self._tally.pending.pop(cid, None)


def _count(removed: Any) -> int | None:
    return removed if isinstance(removed, int) and not isinstance(removed, bool) else None
