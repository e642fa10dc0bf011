"""demote.archive.embeddings: one protocol for LangChain, LlamaIndex and plain-callable models."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from llama_index.core.embeddings import MockEmbedding

from demote.archive.embeddings import Embedder, as_embedder
from demote.errors import ConfigError, EmbeddingError


def test_the_core_module_imports_no_framework() -> None:
    code = (
        "import sys, demote.archive.embeddings, demote.archive.sqlite; "
        "print([m for m in ('langchain_core', 'llama_index', 'numpy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_langchain_embeddings_is_adapted() -> None:
    model = DeterministicFakeEmbedding(size=8)
    embedder = as_embedder(model)
    assert isinstance(embedder, Embedder)
    assert embedder.name == "DeterministicFakeEmbedding"
    vectors = embedder.embed_documents(["a", "b", "a"])
    assert len(vectors) == 3 and all(len(v) == 8 for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    assert embedder.embed_query("a") == pytest.approx(model.embed_query("a"))
    assert all(isinstance(x, float) for x in vectors[0])  # numpy floats are converted


async def test_async_queries_use_the_models_async_method() -> None:
    lc = as_embedder(DeterministicFakeEmbedding(size=4))
    assert await lc.aembed_query("x") == lc.embed_query("x")
    li = as_embedder(MockEmbedding(embed_dim=4))
    assert await li.aembed_query("x") == [0.5] * 4
    plain = as_embedder(lambda texts: [[float(len(t)), 1.0] for t in texts])
    assert await plain.aembed_query("abc") == [3.0, 1.0]  # run in a worker thread


def test_a_llamaindex_embedding_is_adapted_before_being_taken_for_a_callable() -> None:
    model = MockEmbedding(embed_dim=5)
    assert callable(model)  # a TransformComponent: called on nodes, not texts
    embedder = as_embedder(model, name="mock-5")
    assert embedder.name == "mock-5"
    assert embedder.embed_documents(["a", "b"]) == [[0.5] * 5, [0.5] * 5]
    assert embedder.embed_query("q") == [0.5] * 5


def test_a_plain_callable_is_adapted_and_named_after_itself() -> None:
    calls: list[list[str]] = []

    def my_model(texts: list[str]) -> list[list[float]]:
        calls.append(texts)
        return [[1.0, float(len(t))] for t in texts]

    embedder = as_embedder(my_model)
    assert (
        embedder.name == "test_a_plain_callable_is_adapted_and_named_after_itself.<locals>.my_model"
    )
    assert embedder.embed_documents(["ab", "c"]) == [[1.0, 2.0], [1.0, 1.0]]
    assert embedder.embed_query("xyz") == [1.0, 3.0]
    assert embedder.embed_documents([]) == []
    assert calls == [["ab", "c"], ["xyz"]]  # one batch call; nothing for no texts
    assert as_embedder(embedder) is embedder


@pytest.mark.parametrize("bad", [None, 42, "model", object()])
def test_anything_else_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="LangChain Embeddings"):
        as_embedder(bad)


def test_an_empty_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="name"):
        as_embedder(lambda texts: [[1.0] for _ in texts], name=" ")


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda texts: [[1.0]], "1 vectors for 2 texts"),
        (lambda texts: [[1.0, 2.0], [1.0]], "2 and 1 dimensions"),
        (lambda texts: [[1.0], [math.nan]], "non-finite"),
        (lambda texts: [[], []], "empty"),
        (lambda texts: [["a"], ["b"]], "not numbers"),
        (lambda texts: None, "NoneType vectors"),
    ],
)
def test_bad_answers_are_embedding_errors(answer: object, message: str) -> None:
    with pytest.raises(EmbeddingError, match=message):
        as_embedder(answer).embed_documents(["x", "y"])


def test_a_failing_model_is_an_embedding_error() -> None:
    def broken(texts: list[str]) -> list[list[float]]:
        raise RuntimeError("GPU on fire")

    with pytest.raises(EmbeddingError, match="GPU on fire"):
        as_embedder(broken).embed_query("x")
