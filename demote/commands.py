"""Moved to :mod:`demote.cli.commands`; this old import path re-exports it."""

from demote.cli.commands import *  # noqa: F403
from demote.cli.commands import __all__ as __all__
