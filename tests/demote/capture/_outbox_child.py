"""Child process for the outbox tests: enqueue a stream of items, then die or exit.

Usage: python _outbox_child.py MODE DB DELIVERED_LOG ENQUEUED_LOG COUNT

MODE ``kill``: enqueue COUNT items through a Recorder with an outbox at DB, then sleep until
the parent kills it (kill -9). MODE ``exit``: enqueue COUNT items through a Recorder without
an outbox and return without calling close, so the exit-time close drains them.

Every delivered key is appended to DELIVERED_LOG and every enqueued key (once enqueue has
returned) to ENQUEUED_LOG, one line each, with unbuffered O_APPEND writes that survive a
kill -9.
"""

from __future__ import annotations

import os
import sys
import time

from demote.capture import Recorder, SQLiteOutbox, current_key
from demote.records import CapturedTurn


def main() -> None:
    mode, db, delivered_log, enqueued_log, count = sys.argv[1:6]
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    delivered = os.open(delivered_log, flags)
    enqueued = os.open(enqueued_log, flags)

    def sink(item: object) -> None:
        time.sleep(0.004)
        os.write(delivered, f"{current_key()}\n".encode())

    outbox = SQLiteOutbox(db) if mode == "kill" else None
    recorder = Recorder(sink, outbox=outbox)
    for i in range(int(count)):
        key = f"item-{i}"
        if i % 2:
            recorder.enqueue(CapturedTurn("c1", "user", f"turn {i}", i, key))
        else:
            recorder.enqueue({"n": i}, key=key)
        os.write(enqueued, f"{key}\n".encode())
        time.sleep(0.001)
    if mode == "kill":
        time.sleep(120)  # the parent kills us long before this


if __name__ == "__main__":
    main()
