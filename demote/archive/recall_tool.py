"""What both adapters' recall tools share: the model's arguments, the bounds, the answer.

Theory of operation
-------------------
An agent's recall tool (``langchain_demote.recall_tool``, ``llamaindex_demote.recall_tool``)
does one of two things for the model: it *searches* the conversation's long tail for a
query, or it *fetches* one archived message by the key a placeholder names
(:func:`demote.window.clearing.placeholder_text`). Both adapters run the same generator,
:func:`answer`: it yields the archive call it needs (a
:class:`demote.flow.Call`: ``search`` or ``fetch``, awaited as ``asearch`` /
``afetch`` on the async path), is sent the result (or the exception) back, and returns
the text the model reads. So the decisions (which action, how the model's ``k`` and
budget are bounded, what a missing conversation or a failing archive answers) are written
once, for sync and async and for both frameworks.

Every answer is a string, never an exception: the model gets a short, clear sentence when
there is no conversation, nothing matches, the key is not this conversation's, or the
archive is down. The conversation is never an argument the model gives: the adapters bind
it from the run (the LangGraph thread) or the memory, and the archive scopes every read to
it, so a key of another conversation is simply not found and a query is only ever text.

The answer's text is rendered by :mod:`demote.archive.render`.

Both adapters' ``recall_tool(archive, conversation_id, **options)`` take the same
options, declared once (:class:`RecallToolOptions`) and checked once (:func:`tool_setup`).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypedDict

from pydantic import BaseModel, Field

from demote.archive.render import MIN_HIT_TOKENS, render_fetched, render_hits
from demote.errors import ArgumentTypeError, ConfigError
from demote.flow import Call
from demote.recall import ArchiveRecall
from demote.window.tokens import Counter, approximate_tokens, resolve_counter

__all__ = [
    "NO_CONVERSATION",
    "TOOL_DESCRIPTION",
    "TOOL_NAME",
    "RecallArgs",
    "RecallOptions",
    "RecallToolOptions",
    "RecallToolSetup",
    "answer",
    "tool_options",
    "tool_setup",
]

logger = logging.getLogger("demote")

#: What the model reads when the run names no conversation (no thread id).
NO_CONVERSATION = (
    "The recall tool cannot tell which conversation this is (the run has no thread id), "
    "so it has nothing to search. Continue without it."
)
#: What the model is told a recall tool does.
TOOL_DESCRIPTION = (
    "Look up earlier messages of this conversation that are no longer in your context "
    "(they were archived). To search, pass `query` (the words of what you need; optionally "
    "`k` hits and `budget_tokens`). To read one archived message back in full, pass `key`: "
    "the key a placeholder such as '[... result cleared: ... archived as key K ...]' names; "
    "a long one is cut, and the cut names the `start` to pass with the key to read on."
)
#: A recall tool's name unless it is given one.
TOOL_NAME = "recall"
_ECHO = 80  # characters of the model's own query or key echoed back


def _echo(value: str) -> str:
    return value if len(value) <= _ECHO else value[: _ECHO - 1] + "…"


class RecallArgs(BaseModel):
    """What the model passes a recall tool: a query to search, or a key to fetch."""

    query: str | None = Field(
        default=None, description="Words to search this conversation's archived messages for."
    )
    key: str | None = Field(
        default=None, description="The archived key a placeholder names, to fetch that message."
    )
    k: int | None = Field(default=None, description="How many hits a search returns at most.")
    budget_tokens: int | None = Field(default=None, description="Most tokens the answer may take.")
    start: int | None = Field(
        default=None,
        description="With key: the character to read the message from (a cut answer names it).",
    )


def _bounded(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name}: must be an int >= {low}, got {value!r:.40}")
    return value


@dataclass(frozen=True, slots=True)
class RecallOptions:
    """A recall tool's bounds: what the model gets unless it asks, and at most.

    Attributes:
        k: Hits a search returns when the model does not say.
        max_k: Most hits the model may ask for.
        budget_tokens: Tokens a search answer may cost when the model does not say.
        max_budget_tokens: Most tokens the model may ask a search or fetch for.
        fetch_budget_tokens: Tokens a fetched message may cost when the model does not say
            (a cleared tool result can be long: it is cut there, and the cut says so).
        counter: Counts the answer's tokens (the policy's counter; approximate by default).
        snippets: Show a long hit by its lines that match the query best, each hit within
            its share of the budget (:func:`render_hits`); ``False``: by its head.
    """

    k: int = 5
    max_k: int = 20
    budget_tokens: int = 500
    max_budget_tokens: int = 4000
    fetch_budget_tokens: int = 2000
    counter: Counter = approximate_tokens
    snippets: bool = True

    def __post_init__(self) -> None:
        _bounded("k", self.k, 1)
        _bounded("max_k", self.max_k, self.k)
        _bounded("budget_tokens", self.budget_tokens, MIN_HIT_TOKENS * 2)
        _bounded("fetch_budget_tokens", self.fetch_budget_tokens, MIN_HIT_TOKENS * 2)
        _bounded(
            "max_budget_tokens",
            self.max_budget_tokens,
            max(self.budget_tokens, self.fetch_budget_tokens),
        )
        if not callable(self.counter):
            raise ConfigError(f"counter: must be a str -> int callable, got {self.counter!r:.40}")

    def clamp_k(self, k: object) -> int:
        """The model's ``k``, kept within ``[1, max_k]`` (the default when it gave none)."""
        if isinstance(k, bool) or not isinstance(k, int):
            return self.k
        return min(max(k, 1), self.max_k)

    def clamp_budget(self, budget: object, default: int) -> int:
        """The model's token budget, kept within ``[MIN_HIT_TOKENS * 2, max_budget_tokens]``."""
        if isinstance(budget, bool) or not isinstance(budget, int):
            return default
        return min(max(budget, MIN_HIT_TOKENS * 2), self.max_budget_tokens)


def tool_options(
    archive: object,
    name: object,
    *,
    k: int,
    max_k: int,
    budget_tokens: int,
    max_budget_tokens: int,
    fetch_budget_tokens: int,
    counter: str | Counter,
    snippets: bool = True,
) -> RecallOptions:
    """Check a recall tool's archive and name, and build its options (both adapters).

    Raises:
        ConfigError: ``archive`` cannot both search and fetch, ``name`` is empty, or an
            option is out of range (the message names it).
    """
    for method in ("search", "fetch"):  # what ArchiveRecall names, checked callable
        if not callable(getattr(archive, method, None)):
            raise ConfigError(f"archive: {archive!r:.60} has no {method}() (an archive has both)")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name: must be a non-empty str, got {name!r:.40}")
    return RecallOptions(
        k=k,
        max_k=max_k,
        budget_tokens=budget_tokens,
        max_budget_tokens=max_budget_tokens,
        fetch_budget_tokens=fetch_budget_tokens,
        counter=resolve_counter(counter),
        snippets=bool(snippets),
    )


class RecallToolOptions(TypedDict, total=False):
    """The options of both adapters' ``recall_tool``, each a keyword argument (all optional).

    ``langchain_demote.recall_tool`` and ``llamaindex_demote.recall_tool`` take the same
    options with the same defaults, checked by :func:`tool_setup`.

    Attributes:
        k: Hits a search returns when the model does not say (5).
        max_k: Most hits the model may ask for (20).
        budget_tokens: Tokens a search answer takes at most when the model does not say
            (500).
        max_budget_tokens: Most tokens the model may ask for (4000).
        fetch_budget_tokens: Tokens a fetched message takes at most when the model does
            not say (2000; longer ones are cut, and the cut says so).
        counter: Counts the answer's tokens: use the policy's counter (``"approx"``, the
            default, ``"tiktoken"`` or a ``str -> int`` callable).
        snippets: Show a long search hit by its lines that match the query best (each
            hit within its share of the budget; the default); ``False``: by its head.
        name: The tool's name (:data:`TOOL_NAME`; the placeholders of cleared results say
            "the recall tool").
        description: What the model is told the tool does (:data:`TOOL_DESCRIPTION`).
    """

    k: int
    max_k: int
    budget_tokens: int
    max_budget_tokens: int
    fetch_budget_tokens: int
    counter: str | Counter
    snippets: bool
    name: str
    description: str


_TOOL_OPTIONS = frozenset(RecallToolOptions.__annotations__)
_DEFAULT = RecallOptions()  # the bounds' defaults


@dataclass(frozen=True, slots=True)
class RecallToolSetup:
    """A recall tool's checked options (:func:`tool_setup`).

    Attributes:
        options: Its bounds.
        name: Its name.
        description: What the model is told it does.
    """

    options: RecallOptions
    name: str
    description: str


def tool_setup(
    archive: object, options: RecallToolOptions, *, tool: str = "recall_tool"
) -> RecallToolSetup:
    """Check a recall tool's archive and :class:`RecallToolOptions` (both adapters).

    An option not given takes its default: the bounds' are :class:`RecallOptions`', the
    name :data:`TOOL_NAME`, the description :data:`TOOL_DESCRIPTION`.

    Args:
        archive: What the tool reads (see :func:`tool_options`).
        options: The options given.
        tool: The function that takes them, named in the error for an unknown option.

    Raises:
        ArgumentTypeError: An option is none of :class:`RecallToolOptions`.
        ConfigError: See :func:`tool_options`.
    """
    unknown = sorted(set(options) - _TOOL_OPTIONS)
    if unknown:
        raise ArgumentTypeError(f"{tool}() got an unexpected keyword argument {unknown[0]!r}")
    name = options.get("name", TOOL_NAME)
    bounds = tool_options(
        archive,
        name,
        k=options.get("k", _DEFAULT.k),
        max_k=options.get("max_k", _DEFAULT.max_k),
        budget_tokens=options.get("budget_tokens", _DEFAULT.budget_tokens),
        max_budget_tokens=options.get("max_budget_tokens", _DEFAULT.max_budget_tokens),
        fetch_budget_tokens=options.get("fetch_budget_tokens", _DEFAULT.fetch_budget_tokens),
        counter=options.get("counter", _DEFAULT.counter),
        snippets=options.get("snippets", _DEFAULT.snippets),
    )
    return RecallToolSetup(bounds, name, options.get("description", TOOL_DESCRIPTION))


def answer(
    archive: ArchiveRecall,
    conversation_id: str | None,
    options: RecallOptions,
    *,
    query: object = None,
    key: object = None,
    k: object = None,
    budget_tokens: object = None,
    start: object = None,
) -> Generator[Call, Any, str]:
    """One recall tool call as a flow: fetch by ``key`` when given, else search ``query``.

    Run by :func:`demote.flow.drive_sync` or :func:`demote.flow.drive_async`.

    Args:
        archive: An :class:`~demote.recall.ArchiveRecall` (``search`` and ``fetch``,
            and optionally their async twins): ``SQLiteArchive``, ``PostgresArchive``.
        conversation_id: The run's conversation, bound by the adapter (``None``: the run
            names none).
        options: The tool's bounds.
        query: The model's search text (any text; it is only ever searched for).
        key: The archived key a placeholder names.
        k: The model's number of hits (bounded by ``options``).
        budget_tokens: The model's token budget (bounded by ``options``).
        start: Where a fetch reads the message from (a character of its readable body;
            anything but a non-negative int reads from its head).

    Returns:
        The text the model reads; never raises for what the model passed or the archive
        did (a failing archive is logged and answered with a sentence).
    """
    if conversation_id is None:
        return NO_CONVERSATION
    count = options.counter
    key_text = key.strip() if isinstance(key, str) else ""
    query_text = query if isinstance(query, str) else ""
    if key_text:
        budget = options.clamp_budget(budget_tokens, options.fetch_budget_tokens)
        try:
            hit = yield Call(archive, "fetch", (conversation_id, key_text), {})
        except Exception as exc:
            return _unavailable(conversation_id, exc)
        if hit is None:
            return f"No archived message with key {_echo(key_text)!r} in this conversation."
        at = start if isinstance(start, int) and not isinstance(start, bool) else 0
        return render_fetched(hit, budget, count, max(0, at))
    if not query_text.strip():
        return (
            "Give the recall tool a query to search this conversation's archived messages, "
            "or the key a cleared result's placeholder names to fetch that message."
        )
    budget = options.clamp_budget(budget_tokens, options.budget_tokens)
    try:
        # No budget for the archive: a long best hit is shown cut (with its key), not
        # dropped for a shorter, worse one.
        hits = yield Call(archive, "search", (conversation_id, query_text, options.clamp_k(k)), {})
    except Exception as exc:
        return _unavailable(conversation_id, exc)
    rendered = render_hits(list(hits), budget, count, query_text if options.snippets else "")
    if rendered is None:
        return f"No archived message of this conversation matches {_echo(query_text)!r}."
    return rendered


def _unavailable(conversation_id: str, exc: Exception) -> str:
    logger.warning("demote: the recall tool failed for conversation %r: %r", conversation_id, exc)
    return (
        f"The archive could not be read just now ({type(exc).__name__}); "
        "continue without it or try again later."
    )
