"""The adapter kit: what a framework adapter needs from the core, public and documented.

An adapter (``langchain_demote``, ``llamaindex_demote``, or one of your own for another
framework) translates framework messages into the core's records and calls the engine; it
never imports a private module of ``demote``. What it needs besides the engine itself:

- argument checks with the core's wording and typed errors, here: :func:`check_message`
  and :func:`check_messages` (the framework's message class is a parameter),
  :func:`count` and :func:`seconds` for the numbers an option takes, :data:`MAX_COUNT`;
- what a hook stores of a message: :func:`data_by_reference` (media bytes left out, URLs,
  file ids and sizes kept), here;
- the flows and their drivers: :mod:`demote.flow` (``Call``, ``Twin``, ``drive_sync``,
  ``drive_async``, ``run_sync``);
- the erase every adapter does (read the inner store, empty it, erase every tier, report):
  :func:`demote.engine.erase_conversation`, a flow;
- the arguments every archive and recall source checks (a query, ``k``, a budget, keys, a
  fence): :mod:`demote.archive.args`; the ranking rules a source that ranks by itself
  applies: :mod:`demote.archive.ranking`.

This module sits on the ground floor (it imports no engine, store or archive), so a hook
or recall source inside the core may use it too.
"""

from __future__ import annotations

from demote._validate import MAX_COUNT, check_message, check_messages, count, seconds
from demote.window.media import data_by_reference

__all__ = [
    "MAX_COUNT",
    "check_message",
    "check_messages",
    "count",
    "data_by_reference",
    "seconds",
]
