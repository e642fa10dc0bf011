"""Policies: how large the active window may grow, and how it shrinks.

A policy is a pydantic v2 model that round-trips through JSON::

    >>> SlidingWindow.from_json('{"unit": "tokens", "limit": 4000,'
    ...                         ' "eviction": {"kind": "bulk", "overflow": 1000}}')
    SlidingWindow(unit='tokens', limit=4000, eviction=Bulk(kind='bulk', overflow=1000), ...)

Invalid input raises :class:`~demote.errors.ConfigError` naming the field, never a bare
pydantic ``ValidationError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from demote._validate import MAX_COUNT
from demote.errors import ConfigError
from demote.window.clearing import DEFAULT_HEAD_TOKENS
from demote.window.tokens import counter_name, resolve_counter

#: The share of a token limit a :class:`LowWater` note takes by default.
DIGEST_SHARE = 0.15

#: The fewest tokens a default note is given, while :data:`DIGEST_MAX_SHARE` allows.
DIGEST_MIN_TOKENS = 1000

#: The largest share of the limit the default raises the note to.
DIGEST_MAX_SHARE = 0.25

__all__ = [
    "DIGEST_MAX_SHARE",
    "DIGEST_MIN_TOKENS",
    "DIGEST_SHARE",
    "Bulk",
    "ClearToolResults",
    "Compact",
    "Eviction",
    "LowWater",
    "PerItem",
    "SlidingWindow",
    "Unit",
]

Unit = Literal["messages", "turns", "tokens"]


def _config_error(exc: ValidationError, model: str) -> ConfigError:
    parts = []
    for err in exc.errors():
        inner = err.get("ctx", {}).get("error")
        if isinstance(inner, ConfigError):
            if len(exc.errors()) == 1 and not err["loc"]:
                return inner  # already ours (pydantic re-validates through __init__)
            parts.append(str(inner))
            continue
        loc = ".".join(str(p) for p in err["loc"]) or model
        parts.append(f"{loc}: {err['msg']}")
    return ConfigError(f"invalid {model}: " + "; ".join(parts))


class _Model(BaseModel):
    """Frozen, strict-about-extras base that turns validation errors into ConfigError."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _config_error(exc, type(self).__name__) from None

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        """Validate a dict (or model); raises :class:`ConfigError` on bad input."""
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise _config_error(exc, cls.__name__) from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **kwargs: Any) -> Self:
        """Validate JSON text; raises :class:`ConfigError` on bad input."""
        try:
            return super().model_validate_json(json_data, **kwargs)
        except ValidationError as exc:
            raise _config_error(exc, cls.__name__) from None


class PerItem(_Model):
    """Evict the oldest turn group, one at a time, whenever the window is over its limit."""

    kind: Literal["per_item"] = "per_item"


class Bulk(_Model):
    """Let the window grow to ``limit + overflow``, then cut it back to ``limit`` at once.

    Between cuts the start of the window does not move, so the prompt prefix is byte-for-byte
    the same from call to call and provider prompt caches keep hitting.
    """

    kind: Literal["bulk"] = "bulk"
    overflow: Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)]


class Compact(_Model):
    """Summarize the oldest groups instead of dropping them.

    Over ``limit + compact_count`` the oldest groups worth at least ``compact_count`` units
    (never the newest group) become *pending compaction*: a summarizer folds them into the
    running summary off the hot path. Over ``limit + 2 * compact_count`` with no summary
    yet, the window falls back to bulk eviction, so it stays bounded whatever the
    summarizer does.
    """

    kind: Literal["compact"] = "compact"
    compact_count: Annotated[int, Field(ge=1, le=MAX_COUNT, strict=True)]


class LowWater(_Model):
    """Let the window fill up to its limit, then cut it back well below it, at once.

    The default for token windows: it keeps provider prompt caches warm, and "never more
    than the limit" keeps its meaning. Between cuts nothing before the newest step
    changes, so every call reads the window from the cache and writes only what was
    appended; a cut rewrites what it keeps, so it keeps little, and cuts are rare.

    The cut goes back to what cannot be cut (pinned system messages, tools, the opener,
    the newest step) plus ``keep`` of the room the limit leaves above it, or plus
    ``keep_steps`` of it when the cut falls inside the running turn (an agent's steps:
    their identifiers stay in the digest, and the archive keeps them whole). The new
    digest is taken out of that share: with the defaults, a cut inside an agent's turn
    keeps the opener, the digest and the newest step, and the window then fills up again
    from there, appending only.

    In a token window, the steps a cut drops leave a *note* behind
    (:mod:`demote.window.digest`): the requests of the turns it drops, a trail of the
    agent's own calls, and the identifiers their tool results held (paths, ids, names: what
    an agent copies into its next call), each under the call that produced it with its key
    or line, newest first, within ``digest`` of the limit. It is sent where a summary is,
    is made at the cut without a model call, and changes only at the next cut (or gives
    way when the window alone fills the limit). ``digest=0`` turns it off.

    The default (``digest=None``) is :data:`DIGEST_SHARE` of the limit, and at least
    :data:`DIGEST_MIN_TOKENS` while that stays within :data:`DIGEST_MAX_SHARE` of it: a
    note of a few hundred tokens cannot say what the dropped steps held, and the note is
    written once per cut and read from the prompt cache after, so a larger one costs
    little. Measured on the 32 long development sessions (section 7 of the benchmarks): at
    4,000 tokens, 1,000 tokens of note instead of 600 kept 42.0% of what the agent copied
    in context instead of 37.6% (47.9% instead of 42.4% anywhere in the request) for a bill
    of 0.226 instead of 0.201 of sending everything; from 8,000 tokens 15% is already more
    (25% there cost 0.04 of the bill past what the sessions allow). A number is that share
    of the limit, whatever the limit.

    Attributes:
        keep: Share of the room above what cannot be cut kept when whole turns are cut
            (the digest included).
        keep_steps: The same when the cut falls inside the running turn.
        digest: Share of a token limit the note of dropped steps may take (``0``: none;
            ``None``: the default rule above, see :meth:`digest_share`).
    """

    kind: Literal["low_water"] = "low_water"
    keep: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.5
    keep_steps: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    digest: Annotated[float | None, Field(ge=0.0, le=0.5)] = None

    @model_validator(mode="after")
    def _fits(self) -> Self:
        share = DIGEST_SHARE if self.digest is None else self.digest
        if share and max(self.keep, self.keep_steps) + share >= 1.0:
            raise ConfigError(
                f"LowWater: keep ({self.keep}) or keep_steps ({self.keep_steps}) plus digest "
                f"({share}) must stay below 1, or a cut could not get under the limit"
            )
        return self

    def digest_share(self, limit: int) -> float:
        """The share of a ``limit``-token window the note may take.

        ``digest`` when given; by default :data:`DIGEST_SHARE`, raised to
        :data:`DIGEST_MIN_TOKENS` up to :data:`DIGEST_MAX_SHARE` of the limit (and never so
        far that ``keep`` or ``keep_steps`` and the note reach the limit together).
        """
        if self.digest is not None:
            return self.digest
        wanted = min(DIGEST_MIN_TOKENS / limit, DIGEST_MAX_SHARE) if limit > 0 else 0.0
        room = 0.95 - max(self.keep, self.keep_steps)
        return max(DIGEST_SHARE, min(wanted, room))


Eviction = Annotated[PerItem | Bulk | Compact | LowWater, Field(discriminator="kind")]


class ClearToolResults(_Model):
    """Clear the content of old tool results, losslessly: the cheap stage before eviction.

    Once the tool results in the window pass ``trigger`` tokens, the oldest are sent to
    the model as a short placeholder that names the archived key (their content reaches
    the hook first, exactly once). Call ids and structure stay; the inner store is never
    touched. Counted in tokens whatever the window's unit. Only results counted above
    :data:`~demote.window.clearing.PLACEHOLDER_TOKENS` are cleared (a placeholder would not be
    smaller), and ``keep`` counts those.

    Attributes:
        trigger: Tokens of tool results in the window before clearing starts.
        keep: The newest tool results that are never cleared.
        exclude: Names of tools whose results are never cleared.
        clear_at_least: Fewest tokens cleared at a time, so the cached prompt prefix
            breaks rarely.
        max_result_tokens: A single tool result over this many tokens is sent as its head
            and a placeholder (``None``: in a token window, half of what the limit leaves
            beside what every request carries, its system prompt and tool definitions,
            rounded up to 128 tokens (``Demoter.load``'s ``fixed``), and at least two
            heads; half the limit when nothing is reserved. No clipping in other units).
        head_tokens: How much of a clipped result's head the model is sent.
    """

    kind: Literal["clear_tool_results"] = "clear_tool_results"
    trigger: Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)]
    keep: Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)] = 3
    exclude: tuple[str, ...] = ()
    clear_at_least: Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)] = 0
    max_result_tokens: Annotated[int, Field(gt=0, le=MAX_COUNT, strict=True)] | None = None
    head_tokens: Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)] = DEFAULT_HEAD_TOKENS


class SlidingWindow(_Model):
    """A window counted in messages, turns or tokens, with an eviction strategy.

    Attributes:
        unit: ``messages``, ``turns`` (turn groups) or ``tokens``.
        limit: The window's size in ``unit``.
        eviction: :class:`LowWater` (the default for ``unit="tokens"``), :class:`PerItem`
            (the default for messages and turns), :class:`Bulk` or :class:`Compact`.
        pin_system: Leading system messages always stay and do not count.
        counter: Token counter for ``unit="tokens"``: ``"approx"`` (default),
            ``"tiktoken"``, a name given to :func:`~demote.window.tokens.register_counter`, or
            any callable ``str -> int`` (a callable that is not registered cannot be
            written to JSON).
        clearing: :class:`ClearToolResults`, the lossless first stage for agents, or
            ``None`` (no clearing; oversized single results are still clipped in a
            token window).

    When the newest turn alone is over the limit (an agent's long request), the window
    starts at a step boundary inside it and keeps the turn's opening user message in
    front; a call is never split from its results. Only the pinned messages, that opener
    and the newest step may exceed the limit (the plan reports it as ``overhang``). In a
    token window the pinned system messages count toward the limit.
    """

    unit: Unit
    limit: Annotated[int, Field(gt=0, le=MAX_COUNT, strict=True)]
    eviction: Eviction = Field(default_factory=PerItem)

    @model_validator(mode="before")
    @classmethod
    def _default_eviction(cls, data: Any) -> Any:
        # A token window is cache-true unless told otherwise (see LowWater).
        if isinstance(data, dict) and data.get("unit") == "tokens" and data.get("eviction") is None:
            return {**data, "eviction": LowWater()}
        return data

    pin_system: bool = True
    counter: str | Callable[[str], int] = "approx"
    clearing: ClearToolResults | None = None

    @field_validator("counter")
    @classmethod
    def _known_counter(cls, value: str | Callable[[str], int]) -> str | Callable[[str], int]:
        if isinstance(value, str):
            resolve_counter(value)  # raises ConfigError for an unknown name
        return value

    @field_serializer("counter")
    def _counter_to_name(self, value: str | Callable[[str], int]) -> str:
        name = counter_name(value)
        if name is None:
            raise ConfigError(
                "counter: an unregistered callable cannot be written to JSON; "
                "give it a name with demote.window.tokens.register_counter"
            )
        return name

    @classmethod
    def last_messages(
        cls,
        n: int,
        *,
        eviction: PerItem | Bulk | Compact | LowWater | None = None,
        pin_system: bool = True,
    ) -> SlidingWindow:
        """Keep the newest ``n`` messages (whole turn groups)."""
        return cls(unit="messages", limit=n, eviction=eviction or PerItem(), pin_system=pin_system)

    @classmethod
    def last_turns(
        cls,
        n: int,
        *,
        eviction: PerItem | Bulk | Compact | LowWater | None = None,
        pin_system: bool = True,
    ) -> SlidingWindow:
        """Keep the newest ``n`` turn groups."""
        return cls(unit="turns", limit=n, eviction=eviction or PerItem(), pin_system=pin_system)

    @classmethod
    def last_tokens(
        cls,
        n: int,
        *,
        counter: str | Callable[[str], int] = "approx",
        eviction: PerItem | Bulk | Compact | LowWater | None = None,
        pin_system: bool = True,
    ) -> SlidingWindow:
        """Never send more than ``n`` tokens; cut back in cache-friendly batches.

        The default eviction is :class:`LowWater`: the window fills up to ``n``, then is
        cut well below it at once, so between cuts the prompt only grows at its end and
        provider prompt caches keep hitting. ``eviction=PerItem()`` keeps the newest turn
        groups (or steps) that fit at every call instead: the most context per call, but
        the start moves at every call, and a cached prompt is written anew each time.
        """
        return cls(
            unit="tokens",
            limit=n,
            counter=counter,
            eviction=eviction or LowWater(),
            pin_system=pin_system,
        )

    def to_json(self) -> str:
        """This policy as JSON; :meth:`from_json` reads it back."""
        if counter_name(self.counter) is None:
            # Raise our own error before pydantic wraps it in a serialization error.
            self._counter_to_name(self.counter)
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> SlidingWindow:
        """Read a policy written by :meth:`to_json` (or by hand)."""
        return cls.model_validate_json(text)

    def resolved_counter(self) -> Callable[[str], int]:
        """The counter callable this policy counts tokens with."""
        return resolve_counter(self.counter)
