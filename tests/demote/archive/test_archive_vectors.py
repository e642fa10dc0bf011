"""SQLiteArchive with the user's embedding model: stored once, fused, never mixed."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from llama_index.core.embeddings import MockEmbedding

from demote.archive.sqlite import SQLiteArchive
from demote.errors import EmbeddingError, EmbeddingModelChanged, MissingExtraError, StoreError
from demote.records import DemotedMessage, Demotion, fingerprint, make_key
from tests.demote.archive.legacy import make_old_archive

# A toy semantic model: words of one concept share a dimension, so "automobile" is near
# "car" although they share no letters; the archive's lexical search cannot see that.
CONCEPTS = {
    "car": 0,
    "automobile": 0,
    "vehicle": 0,
    "dog": 1,
    "puppy": 1,
    "guitar": 2,
    "music": 2,
    "bread": 3,
    "bakery": 3,
}


class Concepts:
    """A plain callable model that records every batch it is given."""

    def __init__(self, dims: int = 6) -> None:
        self.dims = dims
        self.batches: list[list[str]] = []

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.batches.append(list(texts))
        out = []
        for text in texts:
            vector = [0.0] * self.dims
            for word in text.lower().replace("?", " ").replace(":", " ").split():
                if word in CONCEPTS:
                    vector[CONCEPTS[word]] += 1.0
            vector[-1] = 0.1  # never all zero
            out.append(vector)
        return out


def message(conversation_id: str, index: int, text: str, speaker: str = "") -> DemotedMessage:
    return DemotedMessage(
        role="user",
        text=text,
        index=index,
        key=make_key(conversation_id, index, fingerprint("user", text)),
        raw={"speaker": speaker} if speaker else None,
    )


def batch(conversation_id: str, *texts: str, start: int = 0) -> Demotion:
    return Demotion(
        conversation_id,
        tuple(message(conversation_id, start + i, t) for i, t in enumerate(texts)),
    )


TEXTS = [
    "I finally bought a car last week.",
    "We went to the bakery for fresh bread.",
    "My guitar lessons start in May.",
    "The weather was grey all day.",
]


def stored_vectors(archive: SQLiteArchive) -> int:
    return int(archive._db.execute("SELECT count(*) FROM vectors").fetchone()[0])


def test_each_message_is_embedded_once_in_one_batch(tmp_path: Path) -> None:
    model = Concepts()
    with SQLiteArchive(tmp_path / "a.db", embeddings=model) as archive:
        model.batches.clear()  # the dimension probe at open
        archive.deliver(batch("c", *TEXTS))
        archive.deliver(batch("c", *TEXTS))  # re-delivery: nothing new to embed
        archive.deliver(batch("c", TEXTS[0], "A new puppy!", start=0))
        assert model.batches == [TEXTS, ["A new puppy!"]]
        assert stored_vectors(archive) == 5
        assert archive.search("c", "automobile", k=1)[0].text == TEXTS[0]  # caches "c"
        assert archive.delete("c") == 5
        assert stored_vectors(archive) == 0
        assert archive.search("c", "automobile") == []
        archive.deliver(batch("c", "Selling my vehicle.", *TEXTS[1:]))
        assert archive.search("c", "automobile", k=1)[0].text == "Selling my vehicle."


def test_a_speaker_from_the_context_prefixes_the_embedded_text(tmp_path: Path) -> None:
    model = Concepts()

    def context(m: DemotedMessage) -> dict[str, str] | None:
        return {"speaker": m.raw["speaker"], "date": "8 May 2023"} if m.raw else None

    with SQLiteArchive(tmp_path / "a.db", embeddings=model, context=context) as archive:
        model.batches.clear()
        archive.deliver(
            Demotion("c", (message("c", 0, "Hello!", "Caroline"), message("c", 1, "Hi.")))
        )
        assert model.batches == [["Caroline: Hello!", "Hi."]]
        # The mapping's values are indexed as context: the date finds the message.
        assert archive.search("c", "May 2023")[0].text == "Hello!"


@pytest.mark.parametrize("fusion", ["weighted", "rrf"])
def test_dense_recall_finds_what_shares_no_word(tmp_path: Path, fusion: str) -> None:
    with (
        SQLiteArchive(tmp_path / "a.db", embeddings=Concepts(), fusion=fusion) as dense,  # type: ignore[arg-type]
        SQLiteArchive(tmp_path / "b.db") as lexical,
    ):
        for archive in (dense, lexical):
            archive.deliver(batch("c", *TEXTS))
        assert lexical.search("c", "automobile") == []
        assert dense.search("c", "automobile", k=1)[0].text == TEXTS[0]
        # Only stop words: no lexical terms, yet the query is embedded and searched.
        assert lexical.search("c", "what about it?") == []
        assert len(dense.search("c", "what about it?", k=2)) == 2
        # Lexical and dense agree: the fused ranking keeps the match first.
        assert dense.search("c", "bakery bread", k=1)[0].text == TEXTS[1]
        assert dense.search("other", "automobile") == []


async def test_framework_fake_embeddings_work_end_to_end(tmp_path: Path) -> None:
    for n, model in enumerate([DeterministicFakeEmbedding(size=16), MockEmbedding(embed_dim=16)]):
        with SQLiteArchive(tmp_path / f"{n}.db", embeddings=model) as archive:
            archive.deliver(batch("c", *TEXTS))
            assert stored_vectors(archive) == len(TEXTS)
            hits = await archive.asearch("c", "guitar lessons", k=2)
            assert hits[0].text == TEXTS[2]
            assert hits == archive.search("c", "guitar lessons", k=2)


def test_another_model_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    with SQLiteArchive(path, embeddings=DeterministicFakeEmbedding(size=8)) as archive:
        archive.deliver(batch("c", *TEXTS))
    for other in (
        DeterministicFakeEmbedding(size=16),  # same name, other dimensions
        Concepts(8),  # same dimensions, other name
    ):
        with pytest.raises(EmbeddingModelChanged, match="on_model_change='reembed'"):
            SQLiteArchive(path, embeddings=other)
    with SQLiteArchive(path) as plain:  # without a model: lexical recall, vectors kept
        assert plain.count("c") == 4
        assert stored_vectors(plain) == 4
        assert plain.search("c", "guitar")[0].text == TEXTS[2]


def test_reembed_replaces_every_vector(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    with SQLiteArchive(path, embeddings=DeterministicFakeEmbedding(size=8)) as archive:
        archive.deliver(batch("c", *TEXTS))
    model = Concepts(6)
    with SQLiteArchive(path, embeddings=model, on_model_change="reembed") as archive:
        assert stored_vectors(archive) == 4
        lengths = {len(v) for (v,) in archive._db.execute("SELECT vector FROM vectors")}
        assert lengths == {6 * 4}  # float32
        assert archive.search("c", "automobile", k=1)[0].text == TEXTS[0]
    with SQLiteArchive(path, embeddings=Concepts(6)) as again:  # now the stored model
        assert stored_vectors(again) == 4


def test_a_model_that_changes_its_answers_is_caught(tmp_path: Path) -> None:
    model = Concepts(6)
    with SQLiteArchive(tmp_path / "a.db", embeddings=model) as archive:
        archive.deliver(batch("c", *TEXTS))
        model.dims = 7
        with pytest.raises(EmbeddingModelChanged, match="7 dimensions"):
            archive.search("c", "automobile")
        with pytest.raises(EmbeddingModelChanged):
            archive.deliver(batch("c", "A new car.", start=10))
        assert archive.count("c") == 4  # nothing of the refused batch is stored


def test_a_failing_model_stores_nothing(tmp_path: Path) -> None:
    failing = {"now": False}

    def model(texts: list[str]) -> list[list[float]]:
        if failing["now"]:
            raise TimeoutError("model server away")
        return [[1.0, float(len(t))] for t in texts]

    with SQLiteArchive(tmp_path / "a.db", embeddings=model) as archive:
        failing["now"] = True
        with pytest.raises(EmbeddingError, match="model server away"):
            archive.deliver(batch("c", *TEXTS))
        assert archive.count("c") == 0
        failing["now"] = False
        archive.deliver(batch("c", *TEXTS))  # the engine's retry
        assert archive.count("c") == stored_vectors(archive) == 4


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_file_is_migrated_and_embedded_on_request(tmp_path: Path, version: int) -> None:
    path = tmp_path / "old.db"
    old = [("c", message("c", i, t)) for i, t in enumerate(TEXTS)]
    make_old_archive(path, old, version)
    with SQLiteArchive(path, embeddings=Concepts()) as archive:
        db = archive._db
        assert db.execute("PRAGMA user_version").fetchone() == (5,)
        assert [m.text for m in archive.messages("c")] == TEXTS
        assert archive.search("c", "bakery")[0].text == TEXTS[1]
        # Neighbours' text was filled in by the migration.
        adjacent = db.execute("SELECT adjacent FROM messages WHERE idx = 1").fetchone()[0]
        assert adjacent == f"{TEXTS[0]}\n{TEXTS[2]}"
        assert stored_vectors(archive) == 0
        assert archive.search("c", "automobile") == []  # not embedded yet
        assert archive.embed_pending(batch_size=3) == 4
        assert archive.embed_pending() == 0
        assert archive.search("c", "automobile", k=1)[0].text == TEXTS[0]


def test_a_failed_migration_leaves_a_version_2_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    make_old_archive(path, [("c", message("c", i, t)) for i, t in enumerate(TEXTS)], 2)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE vectors (broken)")  # the migration's CREATE will not fit it
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="cannot use archive"):
        SQLiteArchive(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (2,)
    columns = [r[1] for r in db.execute("PRAGMA table_info(messages)")]
    assert "adjacent" not in columns
    assert db.execute(
        "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'car'"
    ).fetchone() == (1,)
    db.close()


def test_without_numpy_the_missing_extra_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)
    with pytest.raises(MissingExtraError, match=r"demote\[embeddings\]"):
        SQLiteArchive(tmp_path / "a.db", embeddings=Concepts())
    with SQLiteArchive(tmp_path / "a.db") as lexical:  # text recall needs no numpy
        lexical.deliver(batch("c", *TEXTS))
        assert lexical.search("c", "bakery")[0].text == TEXTS[1]
