"""What :meth:`SQLiteArchive.erase <demote.archive.sqlite.SQLiteArchive.erase>` costs.

An erase deletes one conversation's rows and statistics, then merges the whole full-text
index (FTS5 ``optimize``) so that no old segment keeps the conversation's words, and
truncates the WAL. The merge is what grows with the archive: this fills a fresh archive
file with ``N`` synthetic ~50-word messages spread over 100 conversations, delivered in
batches of 50 (as deliveries leave segments behind), then times:

- ``rows only``: the rows and statistics deleted, no merge (what an erase would cost
  without the guarantee that the words leave the file);
- ``erase``: one conversation erased (rows, merge, WAL truncated);
- ``erase again``: a second conversation right after (the index is merged already);
- ``after a delivery``: one more batch delivered, then an erase (the usual case: the
  index has new segments since the last merge).

Run ``python -m bench.erase_cost`` (from the repository root); ``--sizes 2000 20000
100000`` are the defaults. Not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from demote.archive.sqlite import SQLiteArchive, drop_terms
from demote.backends.wal import truncate_wal
from demote.records import DemotedMessage, Demotion

CONVERSATIONS = 100
BATCH = 50


def _words(rng: random.Random) -> list[str]:
    return [f"w{rng.randrange(20_000)}" for _ in range(50)]


def fill(path: Path, n: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    per = n // CONVERSATIONS
    with SQLiteArchive(path) as archive:
        for c in range(CONVERSATIONS):
            cid = f"c{c}"
            for start in range(0, per, BATCH):
                batch = tuple(
                    DemotedMessage("user", " ".join(_words(rng)), i, f"{cid}-{i}")
                    for i in range(start, min(per, start + BATCH))
                )
                archive.deliver(Demotion(cid, batch))


def rows_only(path: Path, cid: str) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA secure_delete = ON")
    began = time.perf_counter()
    db.execute("BEGIN IMMEDIATE")
    drop_terms(db, cid)
    db.execute("DELETE FROM messages WHERE conversation_id = ?", (cid,))
    db.execute("COMMIT")
    truncate_wal(db)
    elapsed = time.perf_counter() - began
    db.close()
    return elapsed


def timed_erase(archive: SQLiteArchive, cid: str) -> float:
    began = time.perf_counter()
    archive.erase(cid)
    return time.perf_counter() - began


def run(sizes: Sequence[int]) -> list[tuple[int, float, float, float, float, float]]:
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "archive.db"
            fill(path, n)
            mb = path.stat().st_size / 1e6
            bare = rows_only(path, "c0")
            with SQLiteArchive(path) as archive:
                first = timed_erase(archive, "c1")
                again = timed_erase(archive, "c2")
                rng = random.Random(1)
                batch = tuple(
                    DemotedMessage("user", " ".join(_words(rng)), 10_000 + i, f"new-{i}")
                    for i in range(BATCH)
                )
                archive.deliver(Demotion("c9", batch))
                after = timed_erase(archive, "c3")
        rows.append((n, mb, bare, first, again, after))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.erase_cost", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000, 100_000])
    args = parser.parse_args(argv)
    print("messages | file MB | rows only | erase | erase again | after a delivery")
    for n, mb, bare, first, again, after in run(args.sizes):
        print(
            f"{n:,} | {mb:.1f} | {bare * 1e3:.1f} ms | {first * 1e3:.1f} ms | "
            f"{again * 1e3:.1f} ms | {after * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()
