"""Same inputs, same answers: SQLiteArchive and PostgresArchive side by side.

The built-in 600-message conversation goes to both archives (in batches, so neighbours
arrive across deliveries), then every user message's text and every probe question is
asked of both, under several option sets. With one conversation per archive, BM25's
statistics are the same in both (FTS5 takes them over the file, PostgreSQL over the
conversation: see demote.archive.postgres), so the hits, their order and their
scores agree, with three exceptions, each stated where it is handled:

- scores agree to about 1e-7 (``ts_rank_cd`` returns a float4), so two hits whose scores
  are that close (near-ties) may come in either order, and the rest of the list with them;
- FTS5 leaves words of one or two letters unstemmed, Snowball stems them ("us" -> "u"):
  for a query term whose stem is such a word ("uses" -> "us", which FTS5 shares with the
  pronoun "us"), the document frequencies differ and so do the scores;
- reciprocal-rank fusion turns a near-tie swapped in one ranking into different scores, so
  with ``fusion="rrf"`` only the best hit is compared.

With a second conversation in the file the scores differ too: the last test shows
PostgreSQL's ranking of one conversation ignoring the other.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demote.archive._fts import query_terms
from demote.archive.postgres import PostgresArchive
from demote.archive.sqlite import SQLiteArchive
from demote.cli.transcript import DATA
from demote.records import DemotedMessage, Demotion, Recalled, fingerprint, make_key
from tests.demote.archive.archive_contract import Concepts
from tests.demote.archive.pg import drop_archive

DOC = json.loads(DATA.joinpath("conversation.json").read_text("utf-8"))
NAMES = {"user": "Sam", "assistant": "Ava"}


def demotions(cid: str, size: int = 37) -> Iterator[Demotion]:
    messages = [
        DemotedMessage(
            role=m["role"],
            text=m["content"],
            index=i,
            key=make_key(cid, i, fingerprint(m["role"], m["content"])),
        )
        for i, m in enumerate(DOC["messages"])
    ]
    for start in range(0, len(messages), size):
        yield Demotion(cid, tuple(messages[start : start + size]))


def queries() -> list[str]:
    asked = [p["question"] for p in DOC["probes"]]
    asked += [m["content"] for m in DOC["messages"] if m["role"] == "user"]
    return asked


def speaker(message: DemotedMessage) -> dict[str, str]:
    return {"speaker": NAMES[message.role], "date": f"day {message.index // 40}"}


def agree(want: list[Recalled], got: list[Recalled]) -> bool:
    """The same hits and scores in the same order, up to the first near-tie."""
    for w, g in zip(want, got, strict=False):
        if w.score != pytest.approx(g.score, rel=1e-6, abs=1e-9):
            return False
        if (w.index, w.key) != (g.index, g.key):
            return True  # a near-tie, in the other order: the rest depends on it
    return len(want) == len(got)


# Query terms whose stem FTS5 shares with an unstemmed two-letter word ("us").
STEMMED_APART = {"use", "uses", "used", "using"}


OPTIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "speaker and date context": {"context": speaker},
    "plain BM25": {"coverage": 0, "neighbours": 0, "adjacent_weight": 0},
    "after=1, heavy context": {"context": speaker, "after": 1, "context_weight": 2.5},
    "vectors, weighted": {"embeddings": Concepts(), "context": speaker},
    "vectors, rrf": {"embeddings": Concepts(), "fusion": "rrf", "context": speaker},
}


@pytest.fixture
def table(postgres_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_archive(postgres_url, name)


@pytest.mark.parametrize("label", list(OPTIONS))
def test_both_archives_give_the_same_answers(
    postgres_url: str, table: str, tmp_path: Path, label: str
) -> None:
    options = OPTIONS[label]
    with (
        SQLiteArchive(tmp_path / "a.db", **options) as lite,
        PostgresArchive(postgres_url, table=table, **options) as pg,
    ):
        for b in demotions("c"):
            lite.deliver(b)
            pg.deliver(b)
        assert pg.messages("c") == lite.messages("c")
        compared = skipped = 0
        for query in queries():
            if STEMMED_APART & set(query_terms(query)):
                skipped += 1
                continue
            for k, budget in ((5, None), (100, 250)):
                want = lite.search("c", query, k, budget_tokens=budget)
                got = pg.search("c", query, k, budget_tokens=budget)
                if options.get("fusion") == "rrf":
                    assert got[:1] == want[:1], query
                else:
                    assert agree(want, got), (query, want, got)
                compared += bool(want)
        assert compared > 500 and skipped < 10


def test_one_conversations_ranking_ignores_the_others_in_postgres(
    postgres_url: str, table: str
) -> None:
    with PostgresArchive(postgres_url, table=table) as pg:
        for b in demotions("c"):
            pg.deliver(b)
        before = {q: pg.search("c", q, 5) for q in queries()[:60]}
        # Another tenant full of the same words changes nothing of "c"'s ranking (in an
        # SQLite file its messages would count in BM25's statistics).
        for b in demotions("noisy"):
            pg.deliver(b)
            pg.deliver(Demotion("noisy", b.messages, fence=None))
        assert {q: pg.search("c", q, 5) for q in before} == before
