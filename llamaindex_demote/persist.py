"""Saving and restoring a ``DemotingMemory`` (``to_dict``/``from_dict`` and pickle).

LlamaIndex saves a workflow's memory with the rest of its context: ``Context.to_dict``
with the ``JsonSerializer`` calls the memory's ``to_dict`` (and ``from_dict`` on resume);
the ``PickleSerializer`` tries that first and pickles when it fails. A memory is two
kinds of thing:

- data, saved as is: ``chat_store_key``, ``recall_k`` and the chat store's messages (an
  unnamed ``SimpleChatStore`` in JSON; any chat store in a pickle);
- live objects, saved by the name they are registered under in the process
  (:mod:`demote.registry`): the demoter, the recall (or a note that it is the demoter's
  hook), the capture, and in JSON any chat store but an unnamed ``SimpleChatStore``
  (its data lives elsewhere: a database, a file). A restored memory is attached to the
  objects registered under those names where it is restored, so it keeps demoting into
  the same state and hook.

An unregistered part is saved under a name that holds only in the saving process
(:func:`demote.registry.name_for`): restoring it there works (LlamaIndex round-trips a
reused workflow context on every run), restoring it in another process raises a
:class:`~demote.errors.ConfigError` saying to register a stable name. A part that cannot
be referred to at all raises when saving. Either way no broken copy is ever made.
"""

from __future__ import annotations

from typing import Any, Protocol

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.storage.chat_store import BaseChatStore, SimpleChatStore

from demote.engine import Demoter
from demote.errors import ConfigError
from demote.registry import lookup, name_for, name_of


class SavedParts(Protocol):
    """The live parts of a memory that :func:`dump` saves by name."""

    @property
    def demoter(self) -> Demoter: ...  # noqa: D102
    @property
    def recall(self) -> Any: ...  # noqa: D102
    @property
    def recall_k(self) -> int: ...  # noqa: D102
    @property
    def recall_budget_tokens(self) -> int | None: ...  # noqa: D102
    @property
    def recall_role(self) -> str: ...  # noqa: D102
    @property
    def capture(self) -> Any: ...  # noqa: D102


__all__ = ["SavedParts", "dump", "load"]

#: Format of a saved memory (raise it on an incompatible change).
VERSION = 1

_HOOK = {"demoter_hook": True}  # the recall is the demoter's own hook (SQLiteArchive)


def _named(obj: object, part: str) -> dict[str, Any]:
    return {"registered": name_for(obj, part)}


def _part(ref: Any, part: str) -> Any:
    if ref is None:
        return None
    if isinstance(ref, dict) and isinstance(ref.get("registered"), str):
        return lookup(ref["registered"], part)
    raise ConfigError(f"DemotingMemory.from_dict: {part}: unreadable reference {ref!r}")


def _store_json(store: BaseChatStore) -> dict[str, Any]:
    if name_of(store) is not None or type(store) is not SimpleChatStore:
        return _named(store, "chat_store")
    try:
        messages = {
            key: [m.model_dump(mode="json") for m in store.get_messages(key)]
            for key in store.get_keys()
        }
    except Exception as exc:
        raise ConfigError(f"DemotingMemory cannot be saved as JSON: a message: {exc}") from exc
    return {"class_name": SimpleChatStore.class_name(), "store": messages}


def _store_from_json(data: Any) -> BaseChatStore:
    if isinstance(data, BaseChatStore):
        return data
    if isinstance(data, dict) and "registered" in data:
        store = _part(data, "chat_store")
        if not isinstance(store, BaseChatStore):
            raise ConfigError(f"chat_store {data['registered']!r} is not a BaseChatStore")
        return store
    if isinstance(data, dict) and data.get("class_name") == SimpleChatStore.class_name():
        saved = data.get("store", {})
        return SimpleChatStore(
            store={k: [ChatMessage.model_validate(m) for m in v] for k, v in saved.items()}
        )
    raise ConfigError(f"DemotingMemory.from_dict: chat_store: unreadable {data!r:.120}")


def dump(
    class_name: str,
    store: BaseChatStore,
    chat_store_key: str,
    parts: SavedParts,
    *,
    store_as_json: bool = True,
) -> dict[str, Any]:
    """What a memory is saved as (JSON-ready when ``store_as_json``).

    Args:
        class_name: The memory's ``class_name()``.
        store: Its chat store.
        chat_store_key: Its conversation key.
        parts: Its live parts (demoter, recall, capture), saved by name; its memory
            blocks, if any (``parts.blocks``), by their place in the demoter's hook.
        store_as_json: Save an unnamed ``SimpleChatStore``'s messages as JSON.

    Raises:
        ConfigError: A part cannot be saved (see the module docstring).
    """
    recall: Any = None
    if parts.recall is not None:
        recall = _HOOK if parts.recall is parts.demoter.hook else _named(parts.recall, "recall")
    data: dict[str, Any] = {
        "class_name": class_name,
        "version": VERSION,
        "chat_store": _store_json(store) if store_as_json else store,
        "chat_store_key": chat_store_key,
        "demoter": _named(parts.demoter, "demoter"),
        "recall": recall,
        "recall_k": parts.recall_k,
        "recall_budget_tokens": parts.recall_budget_tokens,
        "recall_role": parts.recall_role,
        "capture": None if parts.capture is None else _named(parts.capture, "capture"),
    }
    blocks = getattr(parts, "blocks", None)
    if blocks is not None:  # live blocks: by their place in the demoter's hook
        data["memory_blocks"] = blocks.dump(parts.demoter.hook)
    return data


def load(data: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The ``DemotingMemory`` arguments a saved memory stands for.

    Args:
        data: What :func:`dump` made.
        **overrides: Live objects given directly instead of by name (``demoter=``, ...).

    Raises:
        ConfigError: A name is not registered here, or ``data`` is not a saved memory.
    """
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ConfigError(
            f"DemotingMemory.from_dict: not a saved DemotingMemory (version {VERSION}): "
            f"{data!r:.120}"
        )
    given = dict(overrides)
    demoter = given.pop("demoter") if "demoter" in given else _part(data.get("demoter"), "demoter")
    if not isinstance(demoter, Demoter):
        raise ConfigError(f"demoter: expected a Demoter, got {type(demoter).__name__}")
    if "recall" in given:
        recall = given.pop("recall")
    elif data.get("recall") == _HOOK:
        recall = demoter.hook
    else:
        recall = _part(data.get("recall"), "recall")
    capture = given.pop("capture") if "capture" in given else _part(data.get("capture"), "capture")
    kwargs: dict[str, Any] = {
        "demoter": demoter,
        "recall": recall,
        "capture": capture,
        "chat_store": _store_from_json(given.pop("chat_store", data.get("chat_store"))),
        "chat_store_key": data.get("chat_store_key"),
        "recall_k": data.get("recall_k", 5),
        "recall_budget_tokens": data.get("recall_budget_tokens"),
        "recall_role": data.get("recall_role", "user"),
    }
    kwargs.update(given)
    return kwargs
