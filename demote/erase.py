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

The :class:`EraseReport` names every tier the erase touched, in the order it touched them
(:attr:`EraseReport.touched`): the adapter's inner store (a chat history, a chat store, an
agent's checkpoint: ``inner``), then the long tail behind the hook (``tiers``), then the
demotion state (``state``, deleted last, so a load that ran meanwhile finds nothing to
demote again). Each :class:`TierReport` says what that tier did and, where it can count,
how much it removed. An id nothing knew is reported as such: every tier ``erased`` with
``0`` removed, and :attr:`EraseReport.found` ``False`` (``demote erase`` exits with its own
status then, see :mod:`demote.cli.erase`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "Erasable",
    "EraseReport",
    "TierKind",
    "TierReport",
    "TierStatus",
    "conversation_hash",
    "tiers",
]

#: What a tier did: ``erased`` (see ``removed``), ``unsupported`` (it cannot erase: it may
#: still hold the conversation), ``failed`` (it raised; see ``error``), ``kept`` (an inner
#: store the caller asked to keep: ``erase(inner=False)``).
TierStatus = Literal["erased", "unsupported", "failed", "kept"]

#: What a tier is: the ``long tail`` behind the hook (archive, outbox, mem0, vector store,
#: capture), the demotion ``state``, or the adapter's inner store: a LangChain chat
#: ``history``, a LlamaIndex ``chat store``, a LangGraph ``checkpoint``.
TierKind = Literal["long tail", "state", "history", "chat store", "checkpoint"]


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
            conversation), ``failed`` (it raised; see ``error``) or ``kept`` (an inner
            store the caller asked to keep).
        removed: Items it removed, if it could count them (``0``: it held none): the
            state's row (``1`` or ``0``), an inner store's messages, a long tail's
            messages or queued items.
        error: The failure, as ``repr(exception)``.
        kind: What the tier is (see :data:`TierKind`).
    """

    tier: str
    status: TierStatus
    removed: int | None = None
    error: str | None = None
    kind: TierKind = "long tail"


@dataclass(frozen=True, slots=True)
class EraseReport:
    """What an erase did (:meth:`demote.Demoter.erase`, and the adapters' ``erase``).

    Attributes:
        conversation_id: The conversation.
        tiers: The long tail: one report per tier behind the hook, in the order the hook
            holds them, then those of the other holders (an adapter's ``capture``).
        state: The demotion state (watermarks, summary, lease): ``removed`` is ``1`` if
            the store held the conversation, ``0`` if it did not.
        took_over: A delivery in flight did not end within ``wait``: its lease was revoked
            and the erase ran with a newer fencing token. Tiers that check tokens refuse
            its late write; others may receive it (erase again once it has ended).
        inner: The adapter's inner store (its chat history, chat store or checkpoint):
            ``removed`` is how many messages left it; ``kept`` when the caller kept it;
            ``None`` for the engine alone, which has none.
    """

    conversation_id: str
    tiers: tuple[TierReport, ...]
    state: TierReport
    took_over: bool = False
    inner: TierReport | None = None

    @property
    def touched(self) -> tuple[TierReport, ...]:
        """Every tier, in the order the erase touched them: inner store, long tail, state."""
        return (*(() if self.inner is None else (self.inner,)), *self.tiers, self.state)

    @property
    def found(self) -> bool | None:
        """Did any tier hold the conversation?

        ``True`` if one removed something; ``False`` if every tier erased and counted
        nothing (an id nothing knew); ``None`` if none removed anything but one could not
        count, cannot erase, or failed, so it may hold the conversation still. A kept
        inner store is not asked.
        """
        asked = [t for t in self.touched if t.status != "kept"]
        if any(t.removed for t in asked):
            return True
        if all(t.status == "erased" and t.removed == 0 for t in asked):
            return False
        return None

    @property
    def complete(self) -> bool:
        """Did every tier erase (or was kept, as asked), with no delivery left in flight?"""
        return not self.took_over and all(t.status in ("erased", "kept") for t in self.touched)


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
