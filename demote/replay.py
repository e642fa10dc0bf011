"""Moved to :mod:`demote.cli.replay`; this old import path re-exports it."""

from demote.cli.replay import *  # noqa: F403
from demote.cli.replay import __all__ as __all__
