"""Moved to :mod:`demote.cli.demo` and :mod:`demote.cli.demo_parts`; re-exported here."""

from demote.cli.demo import *  # noqa: F403
from demote.cli.demo import __all__ as _demo_all
from demote.cli.demo_parts import *  # noqa: F403
from demote.cli.demo_parts import __all__ as _parts_all

__all__ = _demo_all + _parts_all
