"""Moved to :mod:`demote.cli.cachecost`; this old import path re-exports it."""

from demote.cli.cachecost import (
    ANTHROPIC,
    OPENAI,
    PRICINGS,
    CacheCost,
    CacheMeter,
    CallCost,
    Pricing,
    Prompt,
    cache_cost,
    call_costs,
    common_prefix_tokens,
)

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "PRICINGS",
    "CacheCost",
    "CacheMeter",
    "CallCost",
    "Pricing",
    "Prompt",
    "cache_cost",
    "call_costs",
    "common_prefix_tokens",
]
