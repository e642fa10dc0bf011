"""Moved to :mod:`demote.cli.cachecost`; this old import path re-exports it."""

from demote.cli.cachecost import *  # noqa: F403
from demote.cli.cachecost import __all__ as __all__
