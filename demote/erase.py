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

Tiers that remember an erase's fence name the conversation by
:func:`conversation_hash`, not by its id, so what they keep once it is erased does not
list who asked to be forgotten.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = ["Erasable", "EraseReport", "TierReport", "conversation_hash", "tiers"]


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


def conversation_hash(conversation_id: str) -> str:
    """How fencing tiers name an erased conversation: blake2b (16 bytes, hex) of its id.

    Not a secret: whoever can guess an id can hash it and confirm it was erased.
    """
    data = conversation_id.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16).hexdigest()
