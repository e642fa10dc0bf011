"""The demotion engine: the Demoter and its parts (flow, delivery, compaction, erase).

``demote.engine.demoter`` holds the :class:`Demoter` and its theory of operation; the
private modules beside it are its parts: the I/O operations and their drivers
(``_flow``), delivery under the gate and lease (``_delivery``), background summaries
(``_compaction``), erase (``_erasing``, ``_erase_flow``), per-conversation views
(``_views``), the hook threads and lease keeper (``_runner``), and retry backoff.
"""

from demote.engine.demoter import (
    PROGRESS_PREFIX,
    SUMMARY_PREFIX,
    Demoter,
    Window,
    render_progress,
    render_summary,
)

__all__ = [
    "PROGRESS_PREFIX",
    "SUMMARY_PREFIX",
    "Demoter",
    "Window",
    "render_progress",
    "render_summary",
]
