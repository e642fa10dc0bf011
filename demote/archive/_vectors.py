"""Dense vectors in the SQLite archive: stored as BLOBs, scanned per conversation.

A conversation holds thousands of messages, not millions, so recall scans all of its
vectors with numpy (one matrix product) instead of keeping an approximate index; the
``sqlite-vec`` extension would need an SQLite that can load extensions, which Python's
own often cannot. Vectors are L2-normalised float32 when stored, so a dot product is the
cosine. A conversation's matrix is cached in memory and reloaded when its vectors change
(checked by their newest sequence number, which AUTOINCREMENT never reuses).

The ``settings`` table records which model made the stored vectors (its name and
dimensions); :func:`check_model` refuses, or clears for re-embedding, when another model
is configured, so vectors of two models are never compared.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from demote.errors import EmbeddingModelChanged, MissingExtraError

__all__ = [
    "SCHEMA",
    "VectorIndex",
    "check_model",
    "compare_model",
    "nearest",
    "numpy",
    "pack",
    "record_model",
]

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS vectors (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, message INTEGER NOT NULL UNIQUE,
        conversation_id TEXT NOT NULL, idx INTEGER NOT NULL, vector BLOB NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS vectors_conversation ON vectors (conversation_id, seq)",
    """CREATE TRIGGER IF NOT EXISTS messages_vectors_ad AFTER DELETE ON messages BEGIN
        DELETE FROM vectors WHERE message = old.id;
    END""",
    "CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


def numpy() -> Any:
    """The numpy module, or :class:`MissingExtraError` naming the extra."""
    try:
        import numpy as np
    except ImportError as exc:  # pragma: no cover - numpy comes with the extra
        raise MissingExtraError("numpy", "embeddings") from exc
    return np


def _setting(db: sqlite3.Connection, name: str) -> str | None:
    row = db.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
    return None if row is None else str(row[0])


def compare_model(
    stored_name: str | None, stored_dims: int | None, name: str, dims: int | None, reembed: bool
) -> bool:
    """Whether the stored vectors were made by another model than the configured one.

    Args:
        stored_name: The name recorded with the stored vectors (``None``: none stored).
        stored_dims: Their recorded dimensions, if any.
        name: The configured model's name.
        dims: Its dimensions, if known.
        reembed: On a mismatch, answer ``True`` (the caller deletes every stored vector,
            to embed again) instead of refusing.

    Raises:
        EmbeddingModelChanged: Another model made the stored vectors and not ``reembed``.
    """
    if stored_name is None:
        return False
    changed = []
    if stored_name != name:
        changed.append(f"model {stored_name!r}, now {name!r}")
    if dims is not None and stored_dims is not None and stored_dims != dims:
        changed.append(f"{stored_dims} dimensions, now {dims}")
    if not changed:
        return False
    if not reembed:
        raise EmbeddingModelChanged(
            "the archive's vectors were made by another embedding model ("
            + "; ".join(changed)
            + "); open it with that model, or pass on_model_change='reembed' to embed "
            "every stored message again"
        )
    return True


def check_model(db: sqlite3.Connection, name: str, dims: int | None, reembed: bool) -> bool:
    """Compare the configured model with the one that made the stored vectors.

    Args:
        db: The archive's connection, in a write transaction.
        name: The configured model's name.
        dims: Its dimensions, if known.
        reembed: On a mismatch, delete every stored vector (to embed again) instead of
            refusing.

    Returns:
        Whether stored vectors were deleted (the caller embeds the messages again).

    Raises:
        EmbeddingModelChanged: Another model made the stored vectors and not ``reembed``.
    """
    if not compare_model(_setting(db, "embedding_model"), stored_dims(db), name, dims, reembed):
        return False
    db.execute("DELETE FROM vectors")
    db.execute("DELETE FROM settings WHERE name IN ('embedding_model', 'embedding_dims')")
    return True


def record_model(db: sqlite3.Connection, name: str, dims: int) -> None:
    """Record which model made the vectors being stored (first store only)."""
    db.executemany(
        "INSERT OR IGNORE INTO settings (name, value) VALUES (?, ?)",
        [("embedding_model", name), ("embedding_dims", str(dims))],
    )


def stored_dims(db: sqlite3.Connection) -> int | None:
    """The dimensions of the stored vectors, if any are recorded."""
    value = _setting(db, "embedding_dims")
    return None if value is None else int(value)


def pack(vectors: Sequence[Sequence[float]]) -> list[bytes]:
    """Each vector L2-normalised, as little-endian float32 bytes."""
    np = numpy()
    matrix = np.asarray(vectors, dtype="<f4")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    matrix = matrix / np.where(norms > 0, norms, 1.0)
    return [row.tobytes() for row in matrix]


class VectorIndex:
    """Per-conversation matrices of stored vectors, cached, and the top-``n`` scan.

    Args:
        conversations: How many conversations' matrices stay cached.
    """

    def __init__(self, conversations: int = 16) -> None:
        self._cache: OrderedDict[str, tuple[int, Any, Any]] = OrderedDict()
        self._size = conversations
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every cached matrix."""
        with self._lock:
            self._cache.clear()

    def forget(self, conversation_id: str) -> None:
        """Drop one conversation's cached matrix (it was erased)."""
        with self._lock:
            self._cache.pop(conversation_id, None)

    def _matrix(self, db: sqlite3.Connection, conversation_id: str, dims: int) -> tuple[Any, Any]:
        np = numpy()
        # Vectors are only ever added, or deleted with their whole conversation (or all
        # of them, to re-embed), and AUTOINCREMENT never reuses a number: the newest
        # sequence number alone tells whether the cached matrix is still the stored one.
        (newest,) = db.execute(
            "SELECT coalesce(max(seq), 0) FROM vectors WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchone()
        version = int(newest)
        with self._lock:
            hit = self._cache.get(conversation_id)
            if hit is not None and hit[0] == version:
                self._cache.move_to_end(conversation_id)
                return hit[1], hit[2]
        rows = db.execute(
            "SELECT idx, vector FROM vectors WHERE conversation_id = ? ORDER BY seq",
            (conversation_id,),
        ).fetchall()
        indexes = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), dims)
        with self._lock:
            self._cache[conversation_id] = (version, indexes, matrix)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return indexes, matrix

    def top(
        self, db: sqlite3.Connection, conversation_id: str, query: Sequence[float], n: int
    ) -> dict[int, float]:
        """The ``n`` messages of ``conversation_id`` nearest ``query``: cosine by index.

        Raises:
            EmbeddingModelChanged: The query's dimensions differ from the stored vectors'.
        """
        dims = stored_dims(db)
        if dims is None:
            return {}
        if len(query) != dims:
            raise EmbeddingModelChanged(
                f"the query vector has {len(query)} dimensions, the stored vectors {dims}"
            )
        indexes, matrix = self._matrix(db, conversation_id, dims)
        return nearest(indexes, matrix, query, n)


def nearest(indexes: Any, matrix: Any, query: Sequence[float], n: int) -> dict[int, float]:
    """The ``n`` rows of ``matrix`` (L2-normalised) nearest ``query``: cosine by index.

    Args:
        indexes: Each row's message index (a numpy int array).
        matrix: One stored vector per row (float32).
        query: The query vector (normalised here).
        n: How many rows at most.
    """
    if not len(indexes):
        return {}
    np = numpy()
    q = np.asarray(query, dtype="<f4")
    q = q / (float(np.sqrt(q @ q)) or 1.0)
    # einsum's own loop: a matrix-vector product this small loses more to BLAS
    # threads waking up on a busy machine than it gains (4x slower at 20,000 rows).
    sims = np.einsum("ij,j->i", matrix, q)
    n = min(n, len(sims))
    best = np.argpartition(-sims, n - 1)[:n]
    found: dict[int, float] = {}
    for i in best.tolist():
        index = int(indexes[i])
        found[index] = max(float(sims[i]), found.get(index, -1.0))
    return found
