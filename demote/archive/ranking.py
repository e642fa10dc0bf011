"""The archives' rules that a recall source ranking by itself applies too.

A store that ranks its own hits (a LangGraph store's semantic index, mem0) still owes the
:class:`~demote.recall.Recall` protocol's ``budget_tokens``: :func:`fit` cuts its
hits the way the archives cut theirs, so every recall source spends a budget alike; and
:func:`query_terms` splits a query into the terms the archives search for (distinct,
lowercased, stop words out), for a source that weighs words itself.
"""

from __future__ import annotations

from demote.archive._fts import query_terms
from demote.archive._rank import fit

__all__ = ["fit", "query_terms"]
