"""Search latency of :class:`~demote.archive.sqlite.SQLiteArchive` against archive size.

Recall runs on the request path (every model call may search), so a search must stay cheap
however long the conversation has grown. This fills one conversation of a fresh archive
with ``N`` messages (LoCoMo turns, cycled; or synthetic ~50-word messages with
``--synthetic`` or when the data is missing), plus a second, smaller conversation in the
same file so that searches are really scoped, then times ``search(conversation, q, k=5)``
for LoCoMo questions (or synthetic queries) and prints p50/p95/mean per size and setup.

Run ``python -m bench.archive_search`` (from the repository root); ``--sizes 2000 20000``
and ``--queries 300`` are the defaults. The LoCoMo data is read in place (``$DEMOTE_LOCOMO``
or ``../shared/data/locomo``) and never copied.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.locomo_protocol import conversations, data_dir
from bench.recall_locomo import local_model
from demote.archive.sqlite import SQLiteArchive
from demote.records import DemotedMessage, Demotion, fingerprint, make_key

_TOPICS = (
    "garden river market letter holiday project kitchen weekend concert painting bicycle "
    "recipe sister brother school teacher guitar camping beach mountain hiking dog cat "
    "puppy adoption friend family birthday party cake music book novel library museum "
    "city trip flight hotel train coffee tea dinner lunch breakfast job interview office "
    "meeting career painting pottery yoga running marathon race swimming soccer team game "
    "movie film actor concert band song album photo camera picture art gallery class "
    "course degree support group community volunteer charity shelter parade pride speech"
)
_FUNCTION = "the of and to in is that it was for on with as at by this have from we my"
_WORDS = _TOPICS.split()
_GLUE = _FUNCTION.split()


def _synthetic(n: int, seed: int = 7) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        words = [rng.choice(_WORDS if rng.random() < 0.45 else _GLUE) for _ in range(50)]
        texts.append(" ".join(words).capitalize() + ".")
    queries = [
        "what did we say about " + " ".join(rng.sample(_WORDS, rng.randint(2, 5))) + "?"
        for _ in range(500)
    ]
    return texts, queries


def corpus(synthetic: bool) -> tuple[str, list[str], list[str]]:
    """``(source, message texts, queries)``: LoCoMo turns and questions, or synthetic."""
    if not synthetic and data_dir().is_dir():
        texts: list[str] = []
        queries: list[str] = []
        for conv in conversations():
            texts.extend(t.text for t in conv.turns)
            queries.extend(q for q, _, _ in conv.questions)
        if texts and queries:
            random.Random(7).shuffle(queries)
            return "LoCoMo", texts, queries
    texts, queries = _synthetic(4000)
    return "synthetic", texts, queries


def fill(archive: SQLiteArchive, conversation_id: str, texts: Sequence[str], n: int) -> None:
    """Deliver ``n`` messages (``texts`` cycled) to ``conversation_id`` in batches of 50."""
    for start in range(0, n, 50):
        messages = []
        for i in range(start, min(n, start + 50)):
            role = "user" if i % 2 == 0 else "assistant"
            text = texts[i % len(texts)]
            messages.append(
                DemotedMessage(
                    role=role,
                    text=text,
                    index=i,
                    key=make_key(conversation_id, i, fingerprint(role, text)),
                    raw={"speaker": "Caroline" if i % 2 == 0 else "Melanie", "date": "8 May"},
                )
            )
        archive.deliver(Demotion(conversation_id, tuple(messages)))


def speaker_and_date(message: DemotedMessage) -> str | None:
    raw = message.raw
    return f"{raw['speaker']} {raw['date']}" if isinstance(raw, dict) else None


def speaker_mapping(message: DemotedMessage) -> dict[str, str] | None:
    raw = message.raw
    return {"speaker": raw["speaker"], "date": raw["date"]} if isinstance(raw, dict) else None


class HashVectors:
    """A stand-in model: a fixed pseudo-random 384-d vector per text (memoised).

    It measures what the archive adds (storing, scanning, fusing vectors), not a model's
    own time: a real model adds its query embedding (all-MiniLM-L6-v2 on this CPU: see
    the README) on top.
    """

    name = "hash-384"

    def __init__(self) -> None:
        import numpy as np

        self._np = np
        self._memo: dict[str, list[float]] = {}

    def __call__(self, texts: list[str]) -> list[list[float]]:
        out = []
        for text in texts:
            if text not in self._memo:
                seed = int.from_bytes(text.encode("utf-8")[:64].ljust(8, b"_")[-8:], "little")
                rng = self._np.random.default_rng(seed ^ len(text))
                self._memo[text] = rng.standard_normal(384).tolist()
            out.append(self._memo[text])
        return out


def measure(
    factory: Callable[[Path], SQLiteArchive],
    texts: Sequence[str],
    queries: Sequence[str],
    n: int,
    k: int = 5,
) -> dict[str, float]:
    """Milliseconds per search (p50, p95, mean) over ``queries`` at ``n`` messages."""
    with tempfile.TemporaryDirectory() as tmp, factory(Path(tmp) / "archive.db") as archive:
        fill(archive, "other", texts[::-1], max(200, n // 10))
        fill(archive, "bench", texts, n)
        for query in queries[:20]:  # warm the page cache and prepared statements
            archive.search("bench", query, k)
        took = []
        for query in queries:
            began = time.perf_counter()
            archive.search("bench", query, k)
            took.append((time.perf_counter() - began) * 1000)
    took.sort()
    return {
        "p50": statistics.median(took),
        "p95": took[min(len(took) - 1, int(0.95 * len(took)))],
        "mean": statistics.fmean(took),
    }


def main(argv: Sequence[str] = ()) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.archive_search")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--synthetic", action="store_true")
    args = parser.parse_args(list(argv))
    source, texts, queries = corpus(args.synthetic)
    queries = queries[: args.queries]
    setups: dict[str, Callable[[Path], SQLiteArchive]] = {
        "defaults": lambda p: SQLiteArchive(p),
        "speaker/date context": lambda p: SQLiteArchive(p, context=speaker_and_date),
        "coverage=0": lambda p: SQLiteArchive(p, coverage=0),
        "no neighbours' text": lambda p: SQLiteArchive(
            p, context=speaker_and_date, adjacent_weight=0
        ),
    }
    try:
        vectors = HashVectors()
    except ImportError:
        print("numpy is missing: the vector setups are skipped", file=sys.stderr)
    else:
        setups["+ 384-d vectors, weighted"] = lambda p: SQLiteArchive(
            p, context=speaker_mapping, embeddings=vectors
        )
        setups["+ 384-d vectors, rrf"] = lambda p: SQLiteArchive(
            p, context=speaker_mapping, embeddings=vectors, fusion="rrf"
        )
    print(f"SQLiteArchive.search latency, k=5, {len(queries)} {source} queries (ms)")
    print(f"{'setup':<28}{'messages':>10}{'p50':>9}{'p95':>9}{'mean':>9}")
    results: dict[str, Any] = {}
    for title, factory in setups.items():
        for n in args.sizes:
            row = measure(factory, texts, queries, n)
            results[f"{title}@{n}"] = row
            print(f"{title:<28}{n:>10}{row['p50']:>9.2f}{row['p95']:>9.2f}{row['mean']:>9.2f}")
    model = local_model()
    if model is not None:  # what a real model adds per search: embedding the query
        took = []
        for query in queries[:100]:
            began = time.perf_counter()
            model.encode_uncached(query)
            took.append((time.perf_counter() - began) * 1000)
        took.sort()
        row = {"p50": statistics.median(took), "p95": took[int(0.95 * len(took))]}
        results[f"{model.name} query embedding"] = row
        print(
            f"{model.name} query embedding (sentence-transformers, CPU): "
            f"p50 {row['p50']:.1f} ms, p95 {row['p95']:.1f} ms"
        )
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
