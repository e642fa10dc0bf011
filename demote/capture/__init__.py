"""Capture off the request path: a Recorder in front of a slow sink, durable when asked.

``Recorder(sink)`` (a thread) and ``AsyncRecorder(sink)`` (an asyncio task) queue items
(``Demotion`` batches, ``CapturedTurn`` records, JSON values) and deliver them to ``sink``
in the background, in order; ``close`` drains what was queued within ``flush_timeout``.
With ``outbox=SQLiteOutbox(path)`` every queued item is written to SQLite first, survives
a crash, is retried with backoff and ends in a dead-letter table if it keeps failing.
Both Recorders are demotion hooks and capture sinks. See :mod:`demote.capture.recorder`
for the theory of operation and what a Recorder does to the watermark guarantee.
"""

from demote.capture.codec import dedup_key
from demote.capture.dispatch import RecorderStats, RetryPolicy
from demote.capture.outbox import DeadLetter, SQLiteOutbox
from demote.capture.recorder import AsyncRecorder, Recorder, current_key

__all__ = [
    "AsyncRecorder",
    "DeadLetter",
    "Recorder",
    "RecorderStats",
    "RetryPolicy",
    "SQLiteOutbox",
    "current_key",
    "dedup_key",
]
