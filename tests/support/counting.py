"""A SQLite archive that also counts every key and index it is handed (agent tests)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from demote.archive.sqlite import SQLiteArchive
from demote.records import Demotion

__all__ = ["CountingArchive"]


class CountingArchive:
    """A SQLite archive that also counts every key it is handed."""

    def __init__(self, path: Path) -> None:
        self.archive = SQLiteArchive(path)
        self.deliveries: Counter[str] = Counter()
        self.indexes: Counter[int] = Counter()
        self.lock = threading.Lock()

    def deliver(self, batch: Demotion) -> None:
        with self.lock:
            for m in batch.messages:
                self.deliveries[m.key] += 1
                self.indexes[m.index] += 1
        self.archive.deliver(batch)

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        return self.archive.has_keys(conversation_id, keys)
