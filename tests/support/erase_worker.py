"""A worker process whose delivery is in flight when an erase runs elsewhere.

``python -m tests.support.erase_worker KIND TARGET PREFIX ARCHIVE CONVERSATION SLOW READY``

It opens the shared state store (``KIND`` ``sqlite``: the file ``TARGET``; ``redis``: the
URL ``TARGET`` under ``PREFIX``) and the shared archive file, and loads a conversation
holding :data:`SECRET` through a Demoter whose archive, once it has the batch, touches
``READY`` and takes ``SLOW`` seconds before it stores it (a slow sink, lease renewed
meanwhile). It prints what became of its delivery, as JSON: ``pending`` (messages left
undelivered) and ``error`` (the last delivery error, e.g. ``FencedOut``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from demote import Demoter, Demotion, SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from tests.support.lease_worker import open_store

SECRET = "quokka7741vault"


def messages(n: int = 10) -> list[tuple[str, str]]:
    return [(("user", "assistant")[i % 2], f"turn {i}: the code is {SECRET}") for i in range(n)]


class SlowArchive(SQLiteArchive):
    """Signals that the batch arrived, then takes its time before storing it."""

    def __init__(self, path: str, slow: float, ready: Path) -> None:
        super().__init__(path)
        self.slow, self.ready = slow, ready

    def deliver(self, batch: Demotion) -> None:
        self.ready.touch()
        time.sleep(self.slow)
        super().deliver(batch)


def main() -> None:
    kind, target, prefix, archive_path, cid, slow, ready = sys.argv[1:8]
    store = open_store(kind, target, prefix)
    archive = SlowArchive(archive_path, float(slow), Path(ready))
    # The load waits its slow archive out (the process exits right after it).
    demoter = Demoter(
        SlidingWindow.last_messages(2), archive, state=store, lease_ttl=1.0, hook_wait=None
    )
    result: dict[str, Any] = {}
    try:
        window = demoter.load(cid, messages(), lambda m: demoter.describe(*m))
        result = {"pending": window.pending, "error": demoter.stats().last_error}
    finally:
        demoter.close()
        archive.close()
        store.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
