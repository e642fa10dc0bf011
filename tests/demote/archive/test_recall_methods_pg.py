"""The recall methods PostgresArchive shares with SQLiteArchive give the same answers.

Time awareness, query decomposition and a reranker run in the shared ranking flow
(``demote.archive._search``), so on one conversation both archives must agree as they do
without them (``test_archive_conformance.py`` explains the comparison).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from demote.archive._fts import query_terms
from demote.archive.postgres import PostgresArchive
from demote.archive.sqlite import SQLiteArchive
from demote.records import DemotedMessage
from tests.demote.archive.pg import drop_archive
from tests.demote.archive.test_archive_conformance import (
    NAMES,
    STEMMED_APART,
    agree,
    demotions,
    queries,
)


def dated(message: DemotedMessage) -> dict[str, str]:
    return {"speaker": NAMES[message.role], "date": f"{message.index // 40 + 1} June, 2023"}


def shortest_first(query: str, texts: list[str]) -> list[float]:
    return [-float(len(t)) for t in texts]


@pytest.fixture
def table(postgres_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_archive(postgres_url, name)


def test_time_decomposition_and_a_reranker_agree(
    postgres_url: str, table: str, tmp_path: Path
) -> None:
    options = {
        "context": dated,
        "time_weight": 1.0,
        "decompose": 0.8,
        "reranker": shortest_first,
        "rerank_weight": 0.3,
        "packing": 0.5,
    }
    asked = [
        *queries()[:60],
        "What did Sam and Ava both say about the garden?",
        "What did Sam cook on 3 June, 2023?",
        "Which trip was planned in June 2023 and which book was read?",
    ]
    with (
        SQLiteArchive(tmp_path / "a.db", **options) as lite,  # type: ignore[arg-type]
        PostgresArchive(postgres_url, table=table, **options) as pg,  # type: ignore[arg-type]
    ):
        for b in demotions("c"):
            lite.deliver(b)
            pg.deliver(b)
        compared = 0
        for query in asked:
            if STEMMED_APART & set(query_terms(query)):
                continue
            want = lite.search("c", query, 5)
            got = pg.search("c", query, 5)
            assert agree(want, got), query
            # A budget that binds: both pack the same hits.
            want = lite.search("c", query, 5, budget_tokens=30)
            got = pg.search("c", query, 5, budget_tokens=30)
            assert agree(want, got), query
            compared += bool(want)
        assert compared >= 40
