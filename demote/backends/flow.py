"""Kept so that ``demote.backends.flow`` still imports: the flows live in :mod:`demote.flow`.

Deprecated: import from :mod:`demote.flow`. The names here are the same objects.
"""

from __future__ import annotations

from demote.flow import (
    Call,
    Flow,
    Op,
    Sleep,
    Spawn,
    Twin,
    drive_async,
    drive_sync,
    run_sync,
)

__all__ = [
    "Call",
    "Flow",
    "Op",
    "Sleep",
    "Spawn",
    "Twin",
    "drive_async",
    "drive_sync",
    "run_sync",
]
