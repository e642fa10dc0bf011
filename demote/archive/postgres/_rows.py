"""A demoted message as a PostgreSQL archive row: storable text, indexed words, whole form.

PostgreSQL text cannot hold NUL, so :func:`text` turns it (and lone surrogates) into
U+FFFD; :func:`row` does so for every column, keeps the media of the whole message by
reference unless ``media="bytes"``, and adds the words indexed for the text and context
(:func:`demote.archive.postgres._text.index_words`).
"""

from __future__ import annotations

from typing import Literal

from demote.archive import _data
from demote.archive.options import _describe
from demote.archive.postgres._flows import Row
from demote.archive.postgres._text import index_words
from demote.kit import data_by_reference
from demote.records import DemotedMessage, searchable_text, storable_text

__all__ = ["row", "text"]


def text(value: str) -> str:
    """``value`` storable as PostgreSQL text: lone surrogates and NUL become U+FFFD."""
    return storable_text(value).replace("\x00", "\ufffd")


def row(message: DemotedMessage, context_fn: object, media: Literal["reference", "bytes"]) -> Row:
    """``message`` as a row (``context_fn`` gives its context and speaker)."""
    context, speaker = _describe(context_fn, message)
    data = message.data
    if data is not None and media == "reference":
        data = data_by_reference(data)
    body, context = text(searchable_text(message.text, data)), text(context)
    stored = _data.stored_data(body, data)
    return Row(
        int(message.index),
        text(str(message.role)),
        body,
        context,
        text(speaker),
        text(str(message.key)),
        index_words(body),
        index_words(context),
        None if stored is None else stored.replace("\x00", "\ufffd"),
    )
