"""What every archive does with its :class:`~demote.archive.options.ArchiveOptions`, once.

:func:`merged` gives the options an archive was given (``options=`` with its keywords
laid over it); :func:`searcher` builds the :class:`~demote.archive._search.Searcher` that
ranks with them; :func:`model_parts` wraps the embedding model and probes its dimension;
:func:`describe` turns a ``context=`` callable's answer into the indexed context string
and the speaker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace

from demote.archive import _rank, _search, _vectors, args
from demote.archive._fts import STOP_WORDS
from demote.archive.embeddings import Embedder, as_embedder
from demote.archive.options import ArchiveOptions, ContextFn
from demote.errors import ArgumentTypeError
from demote.records import DemotedMessage

__all__ = ["ContextFn", "describe", "embedded", "merged", "model_parts", "searcher"]

_FIELDS = frozenset(f.name for f in fields(ArchiveOptions))


def merged(archive: str, options: object, keywords: Mapping[str, object]) -> ArchiveOptions:
    """``options`` (or the defaults) with each field ``keywords`` names replaced, checked.

    Raises:
        ArgumentTypeError: ``options`` is not an :class:`ArchiveOptions`, or a keyword
            is none of its fields (the message names the archive and the keyword).
        ConfigError: A field is out of range; the message names it.
    """
    if options is None:
        options = ArchiveOptions()
    elif not isinstance(options, ArchiveOptions):
        raise ArgumentTypeError(
            f"options: must be an ArchiveOptions or None, got {type(options).__name__}"
        )
    unknown = sorted(set(keywords) - _FIELDS)
    if unknown:
        raise ArgumentTypeError(f"{archive}() got an unexpected keyword argument {unknown[0]!r}")
    return replace(options, **keywords) if keywords else options  # type: ignore[arg-type]


def model_parts(options: ArchiveOptions) -> tuple[Embedder | None, int | None]:
    """The embedding model of ``options`` wrapped, and its dimension.

    The dimension probe runs here, before the archive opens its file or pool and outside
    any lock, so a failing model leaves nothing behind.
    """
    if options.embeddings is None:
        return None, None
    embedder = as_embedder(options.embeddings)
    _vectors.numpy()  # fail now, not at the first delivery
    return embedder, len(embedder.embed_query("dimensions"))


def embedded(speaker: str, text: str) -> str:
    """What is embedded for a message: its text, after its speaker when it has one."""
    return f"{speaker}: {text}" if speaker else text


def searcher(options: ArchiveOptions, *, entity_weight: float = 0.0) -> _search.Searcher:
    """The searcher that ranks with ``options`` (checked when they were made).

    ``entity_weight`` is the SQLite archive's own option (its entity index), checked by it.
    """
    words = STOP_WORDS if options.stop_words is None else options.stop_words
    return _search.Searcher(
        ranking=_rank.Ranking(
            (0.0, 1.0, options.context_weight, options.adjacent_weight),
            options.candidates,
            options.coverage,
            options.neighbours,
            options.after,
            options.packing,
        ),
        speaker_weight=options.speaker_weight,
        fusion=options.fusion,
        dense_weight=options.dense_weight,
        count=args.counter(options.counter),
        stop_words=frozenset(w.lower() for w in words),
        methods=_search.Methods(
            entity_weight=entity_weight,
            time_weight=options.time_weight,
            decompose=options.decompose,
            reranker=options.reranker,
            rerank_depth=options.rerank_depth,
            rerank_weight=options.rerank_weight,
        ),
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
