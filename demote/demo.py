"""Moved to :mod:`demote.cli.demo` and :mod:`demote.cli.demo_parts`; re-exported here."""

from demote.cli.demo import (
    STRATEGIES,
    DemoOptions,
    builtin_script,
    demo_policy,
    locomo_script,
    run_demo,
)
from demote.cli.demo_parts import (
    LANGCHAIN_ID,
    LLAMAINDEX_ID,
    RECALL_HEADER,
    CallLog,
    CountingHook,
    PartResult,
    Probe,
    Script,
    finish,
    progress_bar,
)

__all__ = [
    "STRATEGIES",
    "DemoOptions",
    "builtin_script",
    "demo_policy",
    "locomo_script",
    "run_demo",
    "LANGCHAIN_ID",
    "LLAMAINDEX_ID",
    "RECALL_HEADER",
    "CallLog",
    "CountingHook",
    "PartResult",
    "Probe",
    "Script",
    "finish",
    "progress_bar",
]
