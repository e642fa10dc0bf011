"""The ``demote`` command and the tools it is built from, one floor above the core.

The core (:mod:`demote.window.policy`, :mod:`demote.window.planner`, :mod:`demote.engine`, the state
stores, hooks and capture) never imports anything here. This package holds what is built
on it:

- :mod:`demote.cli.app`: the argument parser and :func:`main` (the ``demote`` script);
- :mod:`demote.cli.commands`: what ``demote replay``, ``inspect`` and ``search`` do;
- :mod:`demote.cli.demo`, :mod:`demote.cli.demo_parts`, :mod:`demote.cli.demo_table`:
  ``demote demo`` (the framework halves live in ``langchain_demote.demo`` and
  ``llamaindex_demote.demo``);
- :mod:`demote.cli.replay`, :mod:`demote.cli.transcript`, :mod:`demote.cli.cachecost`:
  replaying a transcript under window policies and pricing its prompts under provider
  prompt caching (also used by the benchmarks and the notebooks);
- :mod:`demote.cli.offline`: the offline stand-in model of the demo.
"""

from demote.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
