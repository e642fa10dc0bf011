"""LoCoMo turns delivered as framework messages that carry their speaker and date.

The recall sections replay LoCoMo as plain :class:`~demote.records.DemotedMessage` rows
whose ``raw`` holds the turn's speaker and session date for the hand-made ``context=``
callables. A user's chat has no such callable: its messages are LangChain or LlamaIndex
messages, and whatever speaker and date they carry is in their metadata. :class:`Framed`
wraps an archive so each delivered turn becomes such a message, in one of several
plausible spellings (:data:`SPELLINGS`), and reaches the archive as the adapters deliver
it: ``raw`` the framework message, ``data`` its neutral form made by the adapter's own
``to_data``. Nothing else of the turn is kept, so an archive given no ``context=`` sees
only what the message carries.

Dates are converted from LoCoMo's words (``"1:56 pm on 8 May, 2023"``) with
:func:`datetime.strptime`, not with the archive's parser, so a spelling the parser
misreads shows up as a lower figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from demote.records import Demotion, Recalled

__all__ = ["SPELLINGS", "Framed", "locomo_datetime"]

_FORMAT = "%I:%M %p on %d %B, %Y"


def locomo_datetime(words: str) -> datetime:
    """A LoCoMo session date (``"1:56 pm on 8 May, 2023"``) as a naive ``datetime``."""
    return datetime.strptime(words, _FORMAT)


def _langchain(role: str, text: str, name: str, **fields: Any) -> tuple[Any, dict[str, Any]]:
    from langchain_core.messages import AIMessage, HumanMessage

    from langchain_demote.messages import to_data

    kind = HumanMessage if role == "user" else AIMessage
    message = kind(content=text, name=name, **fields)
    return message, to_data(message)


def _llamaindex(role: str, text: str, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from llama_index.core.llms import ChatMessage

    from llamaindex_demote.messages import to_data

    message = ChatMessage(role=role, content=text, additional_kwargs=kwargs)
    return message, to_data(message)


def _lc_iso(role: str, text: str, speaker: str, date: str) -> tuple[Any, dict[str, Any]]:
    stamp = locomo_datetime(date).isoformat()
    return _langchain(role, text, speaker, additional_kwargs={"timestamp": stamp})


def _lc_datetime(role: str, text: str, speaker: str, date: str) -> tuple[Any, dict[str, Any]]:
    at = {"created_at": locomo_datetime(date)}  # the object itself, as an app would set it
    where = "additional_kwargs" if role == "user" else "response_metadata"
    return _langchain(role, text, speaker, **{where: at})


def _li_words(role: str, text: str, speaker: str, date: str) -> tuple[Any, dict[str, Any]]:
    return _llamaindex(role, text, {"speaker": speaker, "date_time": date})


def _li_epoch(role: str, text: str, speaker: str, date: str) -> tuple[Any, dict[str, Any]]:
    millis = int(locomo_datetime(date).replace(tzinfo=UTC).timestamp() * 1000)
    return _llamaindex(role, text, {"metadata": {"author": speaker, "ts": millis}})


#: ``key: (label, make)``; ``make(role, text, speaker, date)`` gives the framework message
#: and its neutral form.
SPELLINGS: dict[str, tuple[str, Callable[[str, str, str, str], tuple[Any, dict[str, Any]]]]] = {
    # additional_kwargs={"timestamp": "2023-05-08T13:56:00"}, name="Caroline"
    "lc-iso": ("LangChain: name, ISO timestamp", _lc_iso),
    # additional_kwargs (user) or response_metadata (assistant) {"created_at": datetime(...)}
    "lc-datetime": ("LangChain: name, datetime created_at", _lc_datetime),
    # additional_kwargs={"speaker": "Caroline", "date_time": "1:56 pm on 8 May, 2023"}
    "li-words": ("LlamaIndex: speaker, LoCoMo's date_time", _li_words),
    # additional_kwargs={"metadata": {"author": "Caroline", "ts": 1683554160000}}
    "li-epoch": ("LlamaIndex: nested author, epoch-ms ts", _li_epoch),
}


class Framed:
    """An archive fed each replayed turn as a framework message of one spelling.

    Args:
        archive: The archive (any store with ``deliver`` and ``search``).
        spelling: A key of :data:`SPELLINGS`.
    """

    def __init__(self, archive: Any, spelling: str) -> None:
        self.archive = archive
        self.make = SPELLINGS[spelling][1]

    def deliver(self, batch: Demotion) -> None:
        messages = []
        for m in batch.messages:
            turn = m.raw  # the replay's speaker and date: moved into the message, then gone
            raw, data = self.make(m.role, m.text, turn["speaker"], turn["date"])
            messages.append(dataclasses.replace(m, raw=raw, data=data))
        self.archive.deliver(dataclasses.replace(batch, messages=tuple(messages)))

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        return list(self.archive.search(conversation_id, query, k, budget_tokens=budget_tokens))

    def close(self) -> None:
        self.archive.close()
