"""The demotion engine: the Demoter and its parts (load, delivery, compaction, erase).

``demote.engine.demoter`` holds the :class:`Demoter` and its theory of operation (its
base ``Making``, ``_making``, checks its arguments and makes its parts),
``demote.engine.result`` the :class:`Window` a load returns. The Demoter is composed of
parts, each an object with its own state that it holds (not inherits): ``Loader``
(``_loading``: one load, step by step, driving the others), ``Planning`` (``_planning``:
plans a load against the committed state and builds the window it returns, with
``Notes``, ``_notes``: the summary's count and the note a cut leaves), ``Delivery``
(``_delivery``: the gate and lease, the fenced commit, the store's breaker, hook threads
and background flows, with ``Batches``, ``_batches``: what one hook call is handed and
what its outcome records, and its base ``Holding``, ``_holding``: the gate, lease, store
calls and commit), ``Degradation`` (``_degraded``: degraded loads and warnings),
``Compactor`` (``_compaction``: background summaries) and ``Eraser`` (``_erasing``: clear,
forget and erase, with :func:`erase_conversation` for the adapters' erase); ``_work``
holds what they pass each other. Beside them: describing a message (``_describing``),
stats (``_stats``), the engine's own I/O operations (``_flow``; their drivers are
:mod:`demote.flow`), per-conversation views (``_views``), the hook threads and lease
keeper (``_runner``), and retry backoff.
"""

from demote.engine._erase_flow import erase_conversation
from demote.engine.demoter import Demoter
from demote.engine.result import (
    PROGRESS_PREFIX,
    SUMMARY_PREFIX,
    Window,
    render_progress,
    render_summary,
)

__all__ = [
    "PROGRESS_PREFIX",
    "SUMMARY_PREFIX",
    "Demoter",
    "Window",
    "erase_conversation",
    "render_progress",
    "render_summary",
]
