"""What every archive does with its recall options and its messages' context, once.

:func:`searcher` checks the ranking options an archive takes (the same names and ranges
for SQLite and PostgreSQL) and builds the :class:`~demote.archive._search.Searcher` that
ranks with them; :func:`describe` turns a ``context=`` callable's answer into the indexed
context string and the speaker; :func:`model_parts` checks ``context=`` and
``embeddings=`` and probes the model's dimension; :func:`media_option` checks ``media=``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from demote._validate import count
from demote.archive import _args, _rank, _search, _vectors
from demote.archive._fts import STOP_WORDS
from demote.archive.embeddings import Embedder, as_embedder
from demote.errors import ArgumentTypeError, ConfigError
from demote.records import DemotedMessage
from demote.window.tokens import Counter

__all__ = ["ContextFn", "describe", "embedded", "media_option", "model_parts", "searcher"]

#: Gives a demoted message's context (speaker, date, a title) to index with its text.
ContextFn = Callable[[DemotedMessage], str | Mapping[str, str] | None]


def media_option(media: object) -> Literal["reference", "bytes"]:
    """``media=`` checked: ``"reference"`` or ``"bytes"``."""
    if media not in ("reference", "bytes"):
        raise ConfigError(f"media: must be 'reference' or 'bytes', got {media!r:.40}")
    return "bytes" if media == "bytes" else "reference"


def model_parts(
    context: object, embeddings: object | None
) -> tuple[ContextFn | None, Embedder | None, int | None]:
    """``context=`` checked, the embedding model wrapped, and its dimension.

    The dimension probe runs here, before the archive opens its file or pool and outside
    any lock, so a failing model leaves nothing behind.
    """
    if context is not None and not callable(context):
        raise ArgumentTypeError(f"context: must be a callable or None, got {context!r:.40}")
    if embeddings is None:
        return context, None, None
    embedder = as_embedder(embeddings)
    _vectors.numpy()  # fail now, not at the first delivery
    return context, embedder, len(embedder.embed_query("dimensions"))


def embedded(speaker: str, text: str) -> str:
    """What is embedded for a message: its text, after its speaker when it has one."""
    return f"{speaker}: {text}" if speaker else text


def searcher(
    *,
    context_weight: float,
    adjacent_weight: float,
    coverage: float,
    neighbours: float,
    speaker_weight: float,
    pool: int,
    after: int,
    counter: str | Counter,
    fusion: str,
    dense_weight: float,
    on_model_change: str,
    stop_words: Iterable[str] | None,
    pool_name: str = "pool",
    entity_weight: float = 0.0,
    time_weight: float = 0.0,
    decompose: float = 0.0,
    reranker: object | None = None,
    rerank_depth: int = 20,
    rerank_weight: float = 0.5,
    packing: float = 0.0,
) -> _search.Searcher:
    """The searcher of an archive's options (see ``SQLiteArchive``), checked.

    Raises:
        ConfigError: An option is out of range; the message names it (``pool_name`` is
            what the archive calls its candidate pool).
    """
    weights = {
        name: _args.weight(name, value)
        for name, value in (
            ("context_weight", context_weight),
            ("adjacent_weight", adjacent_weight),
            ("coverage", coverage),
            ("neighbours", neighbours),
            ("speaker_weight", speaker_weight),
            ("entity_weight", entity_weight),
            ("time_weight", time_weight),
        )
    }
    if reranker is not None and not callable(reranker):
        raise ArgumentTypeError(f"reranker: must be a callable or None, got {reranker!r:.40}")
    methods = _search.Methods(
        entity_weight=weights["entity_weight"],
        time_weight=weights["time_weight"],
        decompose=_args.weight("decompose", decompose, high=1.0),
        reranker=reranker,  # checked callable above
        rerank_depth=count("rerank_depth", rerank_depth),
        rerank_weight=_args.weight("rerank_weight", rerank_weight, high=1.0),
    )
    pool = count(pool_name, pool)
    after = count("after", after, minimum=0)
    if fusion not in ("weighted", "rrf"):
        raise ConfigError(f"fusion must be 'weighted' or 'rrf', got {fusion!r:.40}")
    dense = _args.weight("dense_weight", dense_weight, high=1.0)
    if on_model_change not in ("refuse", "reembed"):
        raise ConfigError(
            f"on_model_change must be 'refuse' or 'reembed', got {on_model_change!r:.40}"
        )
    words = STOP_WORDS if stop_words is None else _args.words("stop_words", stop_words)
    return _search.Searcher(
        ranking=_rank.Ranking(
            (0.0, 1.0, weights["context_weight"], weights["adjacent_weight"]),
            pool,
            weights["coverage"],
            weights["neighbours"],
            after,
            _args.weight("packing", packing, high=4.0),
        ),
        speaker_weight=weights["speaker_weight"],
        fusion=fusion,  # type: ignore[arg-type]  # checked above
        dense_weight=dense,
        count=_args.counter(counter),
        stop_words=frozenset(w.lower() for w in words),
        methods=methods,
    )


def describe(context: object, message: DemotedMessage) -> tuple[str, str]:
    """The context string indexed with ``message`` and its speaker (``""`` if none).

    Args:
        context: The archive's ``context=`` callable, or ``None``.
        message: The message being archived.
    """
    found = context(message) if callable(context) else None
    speaker = ""
    if isinstance(found, Mapping):
        speaker = str(found.get("speaker") or "")
        found = " ".join(str(v) for v in found.values() if v)
    return (str(found) if found else ""), speaker
