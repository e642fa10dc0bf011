"""The user's own embedding model, behind one small protocol; no framework imported.

:func:`as_embedder` accepts any of:

* a LangChain ``Embeddings`` (``embed_documents`` / ``embed_query``, and their
  ``aembed_*`` coroutines),
* a LlamaIndex ``BaseEmbedding`` (``get_text_embedding_batch`` /
  ``get_query_embedding`` / ``aget_query_embedding``),
* a plain callable ``list[str] -> list[list[float]]``,

recognised by their method names (duck typing), and returns an :class:`Embedder`. The
embedder checks every answer: one finite vector per text, all of one length, else
:class:`~demote.errors.EmbeddingError`; a model's own exception becomes one too.

Its :attr:`Embedder.name` says which model made a vector (an archive refuses to mix
vectors of two models): the ``name=`` given to :func:`as_embedder`, else the object's
``model`` / ``model_name`` attribute, else its class name.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from demote.errors import ConfigError, EmbeddingError

__all__ = ["Embedder", "EmbedFn", "as_embedder"]

#: A plain embedding function: texts in, one vector per text out.
EmbedFn = Callable[[list[str]], Sequence[Sequence[float]]]


@runtime_checkable
class Embedder(Protocol):
    """What the archive needs from an embedding model."""

    #: Names the model (stored with the vectors; a different name is another model).
    name: str

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One vector per text (a batch)."""

    def embed_query(self, text: str) -> list[float]:
        """The vector of a search query."""

    async def aembed_query(self, text: str) -> list[float]:
        """:meth:`embed_query` for async callers."""


def _check(vectors: object, count: int) -> list[list[float]]:
    if not isinstance(vectors, Sequence) or len(vectors) != count:
        got = len(vectors) if isinstance(vectors, Sequence) else type(vectors).__name__
        raise EmbeddingError(f"the model returned {got} vectors for {count} texts")
    checked: list[list[float]] = []
    for vector in vectors:
        try:
            values = [float(x) for x in vector]
        except (TypeError, ValueError) as exc:
            raise EmbeddingError(f"the model returned a vector that is not numbers: {exc}") from exc
        if not values or not all(math.isfinite(x) for x in values):
            raise EmbeddingError("the model returned an empty or non-finite vector")
        if checked and len(values) != len(checked[0]):
            raise EmbeddingError(
                f"the model returned vectors of {len(checked[0])} and {len(values)} dimensions"
            )
        checked.append(values)
    return checked


class _Adapter:
    """Wraps a batch function, a query function and an optional async query function."""

    def __init__(
        self,
        name: str,
        batch: Callable[[list[str]], Any],
        query: Callable[[str], Any] | None,
        aquery: Callable[[str], Awaitable[Any]] | None,
    ) -> None:
        self.name = name
        self._batch = batch
        self._query = query
        self._aquery = aquery

    def __repr__(self) -> str:
        return f"Embedder({self.name!r})"

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        try:
            vectors = self._batch(list(texts))
        except Exception as exc:
            raise EmbeddingError(f"the embedding model failed: {exc!r}") from exc
        return _check(vectors, len(texts))

    def embed_query(self, text: str) -> list[float]:
        if self._query is None:
            return self.embed_documents([text])[0]
        try:
            vector = self._query(text)
        except Exception as exc:
            raise EmbeddingError(f"the embedding model failed: {exc!r}") from exc
        return _check([vector], 1)[0]

    async def aembed_query(self, text: str) -> list[float]:
        if self._aquery is None:
            return await asyncio.to_thread(self.embed_query, text)
        try:
            vector = await self._aquery(text)
        except Exception as exc:
            raise EmbeddingError(f"the embedding model failed: {exc!r}") from exc
        return _check([vector], 1)[0]


def _model_name(model: object) -> str:
    for attribute in ("model", "model_name"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


def as_embedder(model: object, *, name: str | None = None) -> Embedder:
    """An :class:`Embedder` for a LangChain or LlamaIndex embedding model or a callable.

    Args:
        model: A LangChain ``Embeddings``, a LlamaIndex ``BaseEmbedding``, a callable
            ``list[str] -> list[list[float]]``, or an :class:`Embedder` (returned as is).
        name: Names the model for the archive's model check; defaults to the model's
            ``model`` / ``model_name`` attribute, else its class (or function) name. Give
            one when two configurations of a class are different models.

    Returns:
        The embedder.

    Raises:
        ConfigError: ``model`` is none of these, or ``name`` is empty.
    """
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ConfigError(f"embeddings name must be a non-empty str, got {name!r}")
    if isinstance(model, _Adapter) and name is None:
        return model
    if callable(getattr(model, "embed_documents", None)) and callable(
        getattr(model, "embed_query", None)
    ):  # LangChain Embeddings
        return _Adapter(
            name or _model_name(model),
            model.embed_documents,  # type: ignore[attr-defined]
            model.embed_query,  # type: ignore[attr-defined]
            getattr(model, "aembed_query", None),
        )
    if callable(getattr(model, "get_text_embedding_batch", None)) and callable(
        getattr(model, "get_query_embedding", None)
    ):  # LlamaIndex BaseEmbedding (callable on nodes too, so checked before callables)
        return _Adapter(
            name or _model_name(model),
            model.get_text_embedding_batch,  # type: ignore[attr-defined]
            model.get_query_embedding,  # type: ignore[attr-defined]
            getattr(model, "aget_query_embedding", None),
        )
    if callable(model):
        label = name or getattr(model, "__qualname__", None) or type(model).__name__
        return _Adapter(str(label), model, None, None)
    raise ConfigError(
        "embeddings must be a LangChain Embeddings, a LlamaIndex BaseEmbedding or a "
        f"callable list[str] -> list[list[float]], got {type(model).__name__}"
    )
