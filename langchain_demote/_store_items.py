"""What ``StoreHook`` and ``StoreRecall`` share: namespaces, item values, guarded store calls.

A demoted message is one item of a LangGraph ``BaseStore``:

- **namespace**: a prefix (a tuple, or a callable of the conversation id, e.g. per user)
  followed by one label naming the conversation (:func:`conversation_label`). LangGraph
  refuses a label holding ``.`` (its stores join labels with dots), so ``%`` and ``.`` of
  a conversation id are percent-escaped: the label is the id itself for most ids, and two
  ids never share one;
- **key**: the message's dedup key, so a re-delivered message overwrites its item;
- **value** (:func:`item_value`): :data:`TEXT_FIELD`, what a store's index embeds (the
  text, then one line per tool call, as the archives index it); :data:`MESSAGE_FIELD`, the
  whole message in demote's neutral JSON form; ``role``, ``index`` (its position in the
  conversation), ``position`` (the same, as zero-padded text: a store's ``$gt`` filter
  compares it right whether it compares numbers or text, as ``PostgresStore`` does) and
  ``conversation_id``.

Every store call goes through :func:`guarded`: the store's circuit breaker
(:mod:`demote.backends.breaker`) skips a store that failed recently at once, and a
store's own exception is translated to :class:`~demote.errors.StoreError` here, at the
boundary. The calls are flow operations (:mod:`demote.flow`): the sync driver
calls ``batch`` / ``search`` / ``get``, the async one awaits ``abatch`` / ``asearch`` /
``aget``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langgraph.store.base import BaseStore, Item, SearchOp

from demote.backends.breaker import breaker_of, is_outage
from demote.errors import ConfigError, StoreError, StoreUnavailable
from demote.flow import Call, Flow
from demote.kit import data_by_reference
from demote.records import ROLES, DemotedMessage, Recalled, searchable_text, storable_text
from demote.state.base import validate_conversation_id

__all__ = [
    "DEFAULT_PREFIX",
    "MESSAGE_FIELD",
    "PAGE",
    "POSITION_DIGITS",
    "TEXT_FIELD",
    "Namespaces",
    "Prefix",
    "conversation_label",
    "guarded",
    "item_value",
    "listing",
    "ours",
    "recalled",
]

#: The value field a store's index embeds: the message's searchable text.
TEXT_FIELD = "text"
#: The value field holding the whole message (:data:`demote.records.MESSAGE_DATA_KEYS`).
MESSAGE_FIELD = "message"
#: The namespace prefix used when none is given.
DEFAULT_PREFIX: tuple[str, ...] = ("demote",)
#: Keys looked up per store call (``has_keys``).
PAGE = 256
#: Digits of an item's ``position``.
POSITION_DIGITS = 16

#: A namespace prefix: fixed, or made from the conversation id (say, its user's).
Prefix = Sequence[str] | Callable[[str], Sequence[str]]


def conversation_label(conversation_id: str) -> str:
    """The namespace label of a conversation: its id, ``%`` and ``.`` percent-escaped."""
    return conversation_id.replace("%", "%25").replace(".", "%2E")


def _checked_prefix(value: object, what: str) -> tuple[str, ...]:
    """``value`` as a namespace prefix LangGraph's stores accept, or a ConfigError."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError(f"{what}: must be a tuple of str labels, got {value!r:.60}")
    prefix = tuple(value)
    if not prefix:
        raise ConfigError(f"{what}: must hold at least one label (LangGraph refuses ())")
    for label in prefix:
        if not isinstance(label, str) or not label:
            raise ConfigError(f"{what}: labels must be non-empty str, got {label!r:.40}")
        if "." in label or "\x00" in label:
            raise ConfigError(f"{what}: a label must not contain '.' or NUL, got {label!r:.40}")
    if prefix[0] == "langgraph":
        raise ConfigError(f"{what}: LangGraph reserves the root label 'langgraph'")
    return prefix


@dataclass(frozen=True, slots=True)
class Namespaces:
    """Where a conversation's items live: ``prefix`` (or ``prefix(cid)``) + its label."""

    prefix: tuple[str, ...] | Callable[[str], Sequence[str]]

    @classmethod
    def of_option(cls, namespace: object) -> Namespaces:
        """The ``namespace=`` option checked (a callable is checked at each use).

        Raises:
            ConfigError: ``namespace`` is neither a callable nor a valid prefix.
        """
        if callable(namespace):
            return cls(namespace)
        return cls(_checked_prefix(namespace, "namespace"))

    def __call__(self, conversation_id: str) -> tuple[str, ...]:
        """The namespace of ``conversation_id``'s items.

        Raises:
            ConversationIdError: The conversation id is unusable.
            ConfigError: A ``namespace`` callable failed or returned no valid prefix.
        """
        cid = validate_conversation_id(conversation_id)
        prefix = self.prefix
        if callable(prefix):
            try:
                made = prefix(cid)
            except Exception as exc:
                raise ConfigError(f"namespace: the callable failed: {exc!r:.200}") from exc
            prefix = _checked_prefix(made, "namespace")
        return (*prefix, conversation_label(cid))


def _plain_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as plain JSON a store can hold: a copy, odd values as their repr."""
    text = json.dumps(data, ensure_ascii=False, default=repr)
    loaded: dict[str, Any] = json.loads(storable_text(text))
    return loaded


def item_value(
    conversation_id: str, message: DemotedMessage, media: Literal["reference", "bytes"]
) -> dict[str, Any]:
    """The store value of one demoted message (see the module docstring)."""
    data = message.data
    if data is None:
        data = {"role": message.role, "text": message.text}
    elif media == "reference":
        data = data_by_reference(data)
    return {
        TEXT_FIELD: storable_text(searchable_text(message.text, data)),
        MESSAGE_FIELD: _plain_json(data),
        "role": message.role,
        "index": message.index,
        "position": f"{message.index:0{POSITION_DIGITS}d}",
        "conversation_id": conversation_id,
    }


def _ours(item: Item, namespace: tuple[str, ...], conversation_id: str) -> bool:
    """Is ``item`` a message of this conversation, in its namespace, as the hook wrote it?

    A store's prefix search also returns deeper namespaces, and a namespace may hold
    items of the user's own: anything else is left alone.
    """
    value = item.value
    index = value.get("index")
    return (
        tuple(item.namespace) == namespace
        and value.get("conversation_id") == conversation_id
        and value.get("role") in ROLES
        and isinstance(value.get(TEXT_FIELD), str)
        and isinstance(index, int)
        and not isinstance(index, bool)
    )


def recalled(item: Item, score: float | None = None) -> Recalled:
    """The :class:`~demote.records.Recalled` form of one of the hook's items."""
    value = item.value
    message = value.get(MESSAGE_FIELD)
    return Recalled(
        role=str(value["role"]),
        text=str(value[TEXT_FIELD]),
        index=int(value["index"]),
        key=item.key,
        score=float(score or 0.0),
        data=dict(message) if isinstance(message, Mapping) else None,
        at=item.created_at.timestamp(),
    )


def guarded(store: BaseStore, name: str, args: tuple[Any, ...], what: str) -> Flow[Any]:
    """``store.<name>(*args)`` (``a<name>`` when awaited), through the store's breaker.

    Raises:
        StoreUnavailable: The store failed recently; it was not called.
        StoreError: The store raised (the cause is chained).
    """
    breaker = breaker_of(store)
    ticket = breaker.admit()
    if ticket is None:
        raise StoreUnavailable(
            f"LangGraph store skipped ({what}): it failed recently (next probe in "
            f"{breaker.retry_in():.2g} s)"
        )
    try:
        result = yield Call(store, name, args, {})
    except Exception as exc:
        if is_outage(exc):
            breaker.failed(ticket)
        else:  # it answered: the store is up
            breaker.succeeded(ticket)
        raise StoreError(f"LangGraph store: {what} failed: {exc!r:.300}") from exc
    except BaseException:  # cancelled, or the flow was closed: no answer
        breaker.abandon(ticket)
        raise
    breaker.succeeded(ticket)
    return result


def listing(
    store: BaseStore,
    namespace: tuple[str, ...],
    conversation_id: str,
    limit: int,
    after: int | None = None,
) -> Flow[dict[str, Item]]:
    """The conversation's items in ``namespace`` by key: at most ``limit``, in one call.

    With ``after``, only those at a position above it. Read in the store's listing order
    (``PostgresStore``: newest first), without refreshing TTLs; items that are not the
    hook's (:func:`_ours`) are skipped. One call, not pages: an ``InMemoryStore`` scans
    the whole namespace for every page it is asked.
    """
    where: dict[str, Any] = {"conversation_id": conversation_id}
    if after is not None:
        where["position"] = {"$gt": f"{after:0{POSITION_DIGITS}d}"}
    op = SearchOp(namespace, where, limit, 0, None, False)
    results = yield from guarded(store, "batch", ([op],), "list a conversation's items")
    page: list[Item] = results[0]
    return {item.key: item for item in page if _ours(item, namespace, conversation_id)}


def ours(items: Iterable[Item], namespace: tuple[str, ...], conversation_id: str) -> list[Item]:
    """The items of ``items`` that are this conversation's, as the hook wrote them."""
    return [item for item in items if _ours(item, namespace, conversation_id)]
