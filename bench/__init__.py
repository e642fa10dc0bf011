"""Benchmarks for demote: ``python -m bench`` (what ``make bench`` runs).

Sections (each writes ``bench/results/<section>.json`` and a PNG, and prints a table):

1. ``turn_cost``: per-turn overhead versus history length (:mod:`bench.turn_cost`).
2. ``cache_cost``: prompt-cache cost of eviction strategies on LoCoMo
   (:mod:`bench.cache_cost`).
3. ``recall``: LoCoMo evidence retained, window versus window plus archive recall
   (:mod:`bench.recall_locomo`).
7. ``agents``: tokens sent per model call of agent tool loops, invalid requests and billed
   input with prompt caching, demote against LangChain's middleware (:mod:`bench.agents`).

Nothing reaches the network; the LoCoMo data is read in place from
``../shared/data/locomo`` (or ``$DEMOTE_LOCOMO``).
"""
