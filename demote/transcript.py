"""Moved to :mod:`demote.cli.transcript`; this old import path re-exports it."""

from demote.cli.transcript import *  # noqa: F403
from demote.cli.transcript import __all__ as __all__
