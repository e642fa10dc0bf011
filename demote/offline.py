"""Moved to :mod:`demote.cli.offline`; this old import path re-exports it."""

from demote.cli.offline import *  # noqa: F403
from demote.cli.offline import __all__ as __all__
