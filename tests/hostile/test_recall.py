"""The catalogue, recall helpers: archive_retriever, Mem0Recall, VectorStoreHook, embeddings.

The same rules as tests/hostile/test_archive.py: a typed error naming the argument, raised
before the backend is touched (a stub mem0 records every call), or a right result.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore

from demote import SQLiteArchive
from demote.mem0 import Mem0Recall
from langchain_demote import VectorStoreHook, archive_retriever
from tests.hostile.harness import (
    BAD_COUNTS,
    BAD_IDS,
    BAD_NUMBERS,
    BAD_TEXT,
    Env,
    Probe,
    check,
    probes_for,
)
from tests.hostile.test_archive import BAD_K, TEXTS, ar, demotion, filled

PROBES: list[Probe] = []


class StubMem0:
    """Enough of ``mem0.Memory`` for argument checks; records every call it gets."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def add(self, messages: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append("add")
        return {"results": []}

    def search(self, query: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append("search")
        return {"results": []}

    def get_all(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append("get_all")
        return {"results": []}


def mem0(env: Env) -> None:
    env.objects["mem0"] = StubMem0()
    env.objects["recall"] = Mem0Recall(env.objects["mem0"])


def recall(env: Env) -> Mem0Recall:
    found: Mem0Recall = env.objects["recall"]
    return found


def untouched(result: Any, env: Env) -> bool:
    return result == [] and env.objects["mem0"].calls == []


# -- Mem0Recall ----------------------------------------------------------------------------------

PROBES += probes_for(
    "Mem0Recall", "memory", [None, 3, "mem0", object()], lambda env, v: Mem0Recall(v)
)
PROBES += probes_for(
    "Mem0Recall",
    "threshold",
    [v for v in BAD_NUMBERS if v is not None],
    lambda env, v: Mem0Recall(StubMem0(), threshold=v),
)
PROBES += probes_for(
    "Mem0Recall", "counter", [3, "words", [1]], lambda env, v: Mem0Recall(StubMem0(), counter=v)
)
for name, call in (
    (
        "search",
        lambda env, **kw: recall(env).search(**{"conversation_id": "A", "query": "garden", **kw}),
    ),
    (
        "asearch",
        lambda env, **kw: asyncio.run(
            recall(env).asearch(**{"conversation_id": "A", "query": "garden", **kw})
        ),
    ),
):
    PROBES += probes_for(
        f"Mem0Recall.{name}", "query", BAD_TEXT, lambda env, v, c=call: c(env, query=v), mem0
    )
    PROBES += probes_for(f"Mem0Recall.{name}", "k", BAD_K, lambda env, v, c=call: c(env, k=v), mem0)
    PROBES += probes_for(
        f"Mem0Recall.{name}",
        "budget_tokens",
        [math.nan, -1, "5", 2.5, True, 10**20],
        lambda env, v, c=call: c(env, budget_tokens=v),
        mem0,
    )
    PROBES += probes_for(
        f"Mem0Recall.{name}",
        "conversation",
        BAD_IDS,
        lambda env, v, c=call: c(env, conversation_id=v),
        mem0,
    )
    PROBES += [
        Probe(
            f"Mem0Recall.{name}(k=0)", "k", lambda env, c=call: c(env, k=0), True, untouched, mem0
        ),
        Probe(
            f"Mem0Recall.{name}(query='  ')",
            "query",
            lambda env, c=call: c(env, query="  "),
            True,
            untouched,
            mem0,
        ),
    ]

# -- archive_retriever ---------------------------------------------------------------------------

PROBES += probes_for(
    "archive_retriever",
    "k",
    [*BAD_COUNTS, 10**20],
    lambda env, v: archive_retriever(ar(env), "A", v),
    filled,
)
PROBES += probes_for(
    "archive_retriever",
    "budget_tokens",
    [math.nan, -1, "5", 2.5, 10**20],
    lambda env, v: archive_retriever(ar(env), "A", budget_tokens=v),
    filled,
)
PROBES += probes_for(
    "archive_retriever",
    "conversation_id",
    BAD_IDS,
    lambda env, v: archive_retriever(ar(env), v),
    filled,
)
PROBES += probes_for(
    "archive_retriever",
    "archive",
    [None, "archive.db", 3],
    lambda env, v: archive_retriever(v, "A"),
)
PROBES += probes_for(
    "archive_retriever",
    "demoter",
    ["demoter", 3],
    lambda env, v: archive_retriever(ar(env), "A", demoter=v),
    filled,
)


def retrieved(query: object) -> Probe:
    def run(env: Env) -> object:
        return archive_retriever(ar(env), "A", 5).invoke(query)  # type: ignore[arg-type]

    def check(docs: Any, env: Env) -> bool:
        return all(d.page_content in TEXTS["A"] for d in docs)

    accept = isinstance(query, str)
    return Probe(
        f"ArchiveRetriever.invoke(query={query!r:.20})",
        "query",
        run,
        accept,
        check if accept else None,
        filled,
    )


PROBES += [retrieved(q) for q in ["garden", "giraffe", "", "\ud800", 'NEAR("a" b)', None, 3, b"x"]]

# -- VectorStoreHook ------------------------------------------------------------------------------


def vectors(env: Env) -> None:
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))
    env.objects.update(store=store, hook=VectorStoreHook(store))
    env.objects["hook"].deliver(demotion("A", TEXTS["A"]))


def hook(env: Env) -> VectorStoreHook:
    found: VectorStoreHook = env.objects["hook"]
    return found


PROBES += probes_for(
    "VectorStoreHook",
    "vectorstore",
    [None, 3, "store", object()],
    lambda env, v: VectorStoreHook(v),
)
PROBES += probes_for(
    "VectorStoreHook",
    "find_ids",
    [3, "ids"],
    lambda env, v: VectorStoreHook(
        InMemoryVectorStore(DeterministicFakeEmbedding(size=4)), find_ids=v
    ),
)
PROBES += probes_for(
    "VectorStoreHook",
    "skip_empty",
    ["no", None, 0],
    lambda env, v: VectorStoreHook(
        InMemoryVectorStore(DeterministicFakeEmbedding(size=4)), skip_empty=v
    ),
)
PROBES += probes_for(
    "VectorStoreHook.deliver",
    "batch",
    [None, "batch", 3],
    lambda env, v: hook(env).deliver(v),
    vectors,
)
PROBES += probes_for(
    "VectorStoreHook.deliver",
    "conversation_id",
    BAD_IDS,
    lambda env, v: hook(env).deliver(demotion(v, ["x"])),
    vectors,
)
PROBES += probes_for(
    "VectorStoreHook.deliver",
    "fence",
    ["x", math.nan, -1, 2.5],
    lambda env, v: hook(env).deliver(demotion("A", ["x"], 5, v)),
    vectors,
)
PROBES += probes_for(
    "VectorStoreHook.has_keys",
    "conversation_id",
    BAD_IDS,
    lambda env, v: hook(env).has_keys(v, ["k"]),
    vectors,
)
PROBES += probes_for(
    "VectorStoreHook.has_keys",
    "keys",
    [None, 3, "abc", [1]],
    lambda env, v: hook(env).has_keys("A", v),
    vectors,
)

# -- embeddings given to an archive ------------------------------------------------------------


def bad_model(kind: str) -> Any:
    def embed(texts: list[str]) -> Any:
        if kind == "raises":
            raise RuntimeError("model down")
        if kind == "nan":
            return [[math.nan, 1.0] for _ in texts]
        if kind == "short":
            return [[1.0, 0.0]][: max(0, len(texts) - 1)]
        if kind == "strings":
            return [["a", "b"] for _ in texts]
        if kind == "ragged":
            return [[1.0] * (1 + i) for i, _ in enumerate(texts)]
        return None

    return embed


for kind in ("raises", "nan", "short", "strings", "none"):  # refused at open: no file made
    PROBES.append(
        Probe(
            f"SQLiteArchive(embeddings={kind} model)",
            "model",
            lambda env, kind=kind: SQLiteArchive(env.root / "e.db", embeddings=bad_model(kind)),
        )
    )


def ragged(env: Env) -> None:
    archive = SQLiteArchive(env.root / "e.db", embeddings=bad_model("ragged"))
    env.closers.append(archive.close)
    archive.deliver(demotion("A", ["one"]))
    env.objects["archive"] = archive


PROBES.append(
    Probe(
        "SQLiteArchive(embeddings=ragged model).deliver",
        "model",
        lambda env: ar(env).deliver(demotion("A", ["x", "y"], 1)),
        setup=ragged,
    )
)


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_recall_probe(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def test_the_catalogue_is_large() -> None:
    assert len(PROBES) >= 150
    assert len({p.name for p in PROBES}) == len(PROBES)
