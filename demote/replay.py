"""Moved to :mod:`demote.cli.replay`; this old import path re-exports it."""

from demote.cli.replay import (
    SYSTEM_PROMPT_ID,
    ReplayMeter,
    ReplayResult,
    describe_policy,
    plot_windows,
    replay,
)

__all__ = [
    "SYSTEM_PROMPT_ID",
    "ReplayMeter",
    "ReplayResult",
    "describe_policy",
    "plot_windows",
    "replay",
]
