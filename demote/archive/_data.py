"""The ``data`` column both archives keep: a message's whole form, as JSON.

``data`` is the whole message (:data:`demote.records.MESSAGE_DATA_KEYS`) without ``role``
(a column of its own) and, when it equals the ``text`` column, ``text``:
:func:`stored_data` writes it, :func:`row_data` reads it back. ``NULL`` marks a text-only
row (one stored before the column existed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from demote.records import storable_text

__all__ = ["row_data", "stored_data"]


def stored_data(text: str, data: Mapping[str, Any] | None) -> str | None:
    """The ``data`` column of a message whose ``text`` column is ``text`` (``None``: none).

    The role has a column of its own and the text is left out when the column holds it,
    so a plain message stores ``{}``.
    """
    if data is None:
        return None
    kept = {k: v for k, v in data.items() if k != "role" and not (k == "text" and v == text)}
    return storable_text(json.dumps(kept, ensure_ascii=False, separators=(",", ":"), default=repr))


def row_data(role: str, text: str, stored: str | None) -> dict[str, Any] | None:
    """The whole message of a row (``None`` for a text-only row, or unreadable JSON)."""
    if stored is None:
        return None
    try:
        kept = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(kept, dict):
        return None
    return {"role": role, "text": text, **kept}
