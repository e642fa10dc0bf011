"""The recall options both archives take, written and checked once: :class:`ArchiveOptions`.

:class:`~demote.archive.sqlite.SQLiteArchive` and
:class:`~demote.archive.postgres.PostgresArchive` rank with the same code, so they take the
same options: what is indexed with a message (``context=``), the embedding model, the
ranking weights, the optional recall methods and how media are stored. They are fields of
one frozen :class:`ArchiveOptions`, checked when it is made; each archive takes it as
``options=`` and also takes each field as a keyword of its own (:class:`ArchiveKeywords`),
as it always has.

**The rule when both are given.** The keywords override: the archive starts from
``options`` (or the defaults) and replaces each field a keyword names, checked again, so
``SQLiteArchive(path, options=tuned, after=1)`` is ``tuned`` with ``after=1``.

Example::

    tuned = ArchiveOptions(time_weight=0.5, packing=0.2)
    local = SQLiteArchive("archive.db", options=tuned)
    fleet = PostgresArchive("postgresql://app@db/app", options=tuned)  # ranks the same way

What every archive does with its options, once, is here too, private to the archives:
``_merged`` gives the options an archive was given (``options=`` with its keywords laid
over it); ``_searcher`` builds the :class:`~demote.archive._search.Searcher` that ranks
with them; ``_model_parts`` wraps the embedding model and probes its dimension;
``_describe`` turns a ``context=`` callable's answer into the indexed context string and
the speaker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Literal, TypedDict

from demote._validate import count
from demote.archive import _rank, _search, _vectors, args
from demote.archive._fts import STOP_WORDS
from demote.archive._search import Reranker
from demote.archive.context import message_context
from demote.archive.embeddings import Embedder, as_embedder
from demote.errors import ArgumentTypeError, ConfigError
from demote.records import DemotedMessage
from demote.window.tokens import Counter

__all__ = ["ArchiveKeywords", "ArchiveOptions", "ContextFn"]

#: Gives the context indexed with a message: a string (a speaker and a date, say), a
#: mapping whose values are indexed (its ``"speaker"``, if any, also prefixes the text
#: that is embedded), or ``None`` for none.
ContextFn = Callable[[DemotedMessage], str | Mapping[str, str] | None]

_WEIGHTS = (
    "context_weight",
    "adjacent_weight",
    "coverage",
    "neighbours",
    "speaker_weight",
    "time_weight",
)
_CHOICES = {
    "fusion": ("weighted", "rrf"),
    "on_model_change": ("refuse", "reembed"),
    "media": ("reference", "bytes"),
}


@dataclass(frozen=True, slots=True)
class ArchiveOptions:
    """The options both archives share (their recall, their model, their media), checked.

    Every field is checked when the object is made (and again by
    :func:`dataclasses.replace`), so a bad value raises here, before any archive opens a
    file or a pool. Numbers come back as ``float`` and ``stop_words`` as a ``frozenset``
    of lowercased words, so two equal sets of options compare equal.

    Attributes:
        context: Called with each delivered message; what it returns (a speaker name, a
            date, a title; see :data:`ContextFn`) is indexed alongside the text and
            searched with weight ``context_weight``. The default,
            :func:`~demote.archive.context.message_context`, gives the speaker and the
            date the message carries in its metadata (LangChain's ``name``,
            ``additional_kwargs`` and ``response_metadata``, LlamaIndex's
            ``additional_kwargs``); a callable of yours replaces it (call it in yours to
            keep it); ``None`` indexes the text only.
        embeddings: A LangChain ``Embeddings``, a LlamaIndex ``BaseEmbedding`` or a
            callable ``list[str] -> list[list[float]]`` (see
            :func:`demote.archive.embeddings.as_embedder`); ``None`` (the default)
            recalls by text alone. Needs numpy (``demote[embeddings]``). The archive
            asks it for one vector when it opens, to learn its dimensions.
        context_weight: BM25 weight of the context column relative to the text (1.0).
        adjacent_weight: BM25 weight of the neighbouring messages' text, indexed with
            each message; ``0`` leaves it out of the search.
        coverage: How much a message gains for containing more of the query's distinct
            terms (IDF-weighted); ``0`` ranks by plain BM25.
        neighbours: Share of the preceding message's score added to a message's score
            (doubled when the preceding message asks a question; half as much comes from
            the following message); ``0`` scores each message alone.
        speaker_weight: When a query names a speaker of the conversation (a context
            mapping's ``"speaker"``), that speaker's messages score ``1 + speaker_weight``
            times as much; ``0`` turns it off.
        candidates: How many BM25 candidates (and nearest vectors) are ranked per search
            (at least ``k``). ``SQLiteArchive`` also takes it as ``pool=``.
        after: How many of the messages that follow a hit come back with it, as one
            unit (a question's answer is often the turn after the one that matched).
        counter: Counts the tokens of a returned text for ``budget_tokens``: a counter
            name (``"approx"``, the default: characters / 4, rounded up; ``"tiktoken"``)
            or any ``str -> int`` callable. Only the text counts, not the role.
        fusion: How the lexical and the dense rankings are combined: ``"weighted"`` (a
            weighted sum of min-max-normalised scores) or ``"rrf"`` (reciprocal rank).
        dense_weight: The dense ranking's share in ``"weighted"`` fusion, in ``[0, 1]``.
        on_model_change: When the archive holds vectors of another model (name or
            dimensions): ``"refuse"`` raises :class:`~demote.errors.EmbeddingModelChanged`
            at open; ``"reembed"`` deletes them and embeds every stored message again, at
            open.
        stop_words: Lowercased words dropped from queries; ``None`` (the default) uses
            :data:`demote.archive._fts.STOP_WORDS`, 189 common English function words
            and question words.
        time_weight: When a question names a time ("in June", "last summer", "on 3 June,
            2023"), the messages whose context date falls in it score ``1 +
            time_weight`` times as much (:mod:`demote.archive._time`); ``0`` turns it off.
        decompose: Weight of the sub-queries of a question that names two speakers or
            joins two asks (:mod:`demote.archive._decompose`), merged with the whole
            query's ranking; ``0`` (off) to ``1``.
        reranker: ``reranker(query, texts) -> scores`` (a cross-encoder, any callable):
            the best ``rerank_depth`` candidates are re-scored by it and fused with
            weight ``rerank_weight``; it runs on the search path, once per search.
        rerank_depth: How many candidates the reranker sees.
        rerank_weight: The reranker's share of the fused score, in ``[0, 1]``.
        packing: Budget packing, in ``[0, 4]``: when the best ``k`` hits cost more than
            ``budget_tokens``, take them by score per token ** ``packing`` (a knapsack's
            greedy rule), so a budget holds more short hits than a few long ones; ``0``
            (the default) takes them best first. A search whose ``k`` binds before its
            budget is unchanged.
        media: How the whole messages' media are stored: ``"reference"`` (the default)
            keeps URLs, file ids, types and sizes and drops base64 bytes
            (:func:`demote.window.media.data_by_reference`); ``"bytes"`` keeps them, so
            the messages come back exactly as they were.

    Raises:
        ConfigError: A field is out of range, or of the wrong type
            (:class:`~demote.errors.ArgumentTypeError`); the message names it.
    """

    context: ContextFn | None = message_context
    embeddings: object | None = None
    context_weight: float = 0.5
    adjacent_weight: float = 0.8
    coverage: float = 1.0
    neighbours: float = 0.7
    speaker_weight: float = 1.0
    candidates: int = 50
    after: int = 0
    counter: str | Counter = "approx"
    fusion: Literal["weighted", "rrf"] = "weighted"
    dense_weight: float = 0.2
    on_model_change: Literal["refuse", "reembed"] = "refuse"
    stop_words: Iterable[str] | None = None
    time_weight: float = 0.0
    decompose: float = 0.0
    reranker: Reranker | None = None
    rerank_depth: int = 20
    rerank_weight: float = 0.5
    packing: float = 0.0
    media: Literal["reference", "bytes"] = "reference"

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)  # frozen: normalised once, here

        for name in ("context", "reranker"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                shown = getattr(self, name)
                raise ArgumentTypeError(f"{name}: must be a callable or None, got {shown!r:.40}")
        if self.embeddings is not None:
            as_embedder(self.embeddings)  # its kind is checked now; its dimension at open
        for name in _WEIGHTS:
            put(name, args.weight(name, getattr(self, name)))
        for name, high in (("dense_weight", 1.0), ("decompose", 1.0), ("rerank_weight", 1.0)):
            put(name, args.weight(name, getattr(self, name), high=high))
        put("packing", args.weight("packing", self.packing, high=4.0))
        count("candidates", self.candidates)
        count("after", self.after, minimum=0)
        count("rerank_depth", self.rerank_depth)
        args.counter(self.counter)
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                shown = getattr(self, name)
                raise ConfigError(f"{name}: must be one of {allowed}, got {shown!r:.40}")
        if self.stop_words is not None:
            put("stop_words", args.words("stop_words", self.stop_words))


class ArchiveKeywords(TypedDict, total=False):
    """The fields of :class:`ArchiveOptions`, as an archive's keyword arguments."""

    context: ContextFn | None
    embeddings: object | None
    context_weight: float
    adjacent_weight: float
    coverage: float
    neighbours: float
    speaker_weight: float
    candidates: int
    after: int
    counter: str | Counter
    fusion: Literal["weighted", "rrf"]
    dense_weight: float
    on_model_change: Literal["refuse", "reembed"]
    stop_words: Iterable[str] | None
    time_weight: float
    decompose: float
    reranker: Reranker | None
    rerank_depth: int
    rerank_weight: float
    packing: float
    media: Literal["reference", "bytes"]


# What every archive does with its options (see the module docstring).

_FIELDS = frozenset(f.name for f in fields(ArchiveOptions))


def _merged(archive: str, options: object, keywords: Mapping[str, object]) -> ArchiveOptions:
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


def _model_parts(options: ArchiveOptions) -> tuple[Embedder | None, int | None]:
    """The embedding model of ``options`` wrapped, and its dimension.

    The dimension probe runs here, before the archive opens its file or pool and outside
    any lock, so a failing model leaves nothing behind.
    """
    if options.embeddings is None:
        return None, None
    embedder = as_embedder(options.embeddings)
    _vectors.numpy()  # fail now, not at the first delivery
    return embedder, len(embedder.embed_query("dimensions"))


def _embedded(speaker: str, text: str) -> str:
    """What is embedded for a message: its text, after its speaker when it has one."""
    return f"{speaker}: {text}" if speaker else text


def _searcher(options: ArchiveOptions, *, entity_weight: float = 0.0) -> _search.Searcher:
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


def _describe(context: object, message: DemotedMessage) -> tuple[str, str]:
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
