"""What provider prompt caching would charge for a sequence of prompts.

Pure and framework-free: a prompt is a sequence of messages, each given as a
``(fingerprint, tokens)`` pair (any hashable id works as the fingerprint). Calls are
priced one after the other; only input tokens are priced, relative to sending every prompt
token at the full input price (no caching = 1.0).

The model
---------
For call ``i`` with a prompt of ``T_i`` tokens:

1. ``lcp_i`` is the token length of the longest common prefix, in whole messages, of
   prompt ``i`` and prompt ``i - 1`` (``0`` for the first call). Only the previous prompt is
   consulted: the cache is assumed warm between consecutive calls (no TTL expiry) and older
   entries are ignored.
2. ``cached_i`` is what the provider serves from cache: ``0`` when ``lcp_i < minimum``,
   else ``minimum + floor((lcp_i - minimum) / increment) * increment``.
3. The uncached rest, ``T_i - cached_i``, is billed at ``write`` if the prompt is long
   enough to be cached itself (``T_i >= minimum``; the whole prompt is written to the
   cache, as with a cache breakpoint at the end of every prompt), else at ``1.0``.
4. ``cost_i = read * cached_i + rate_i * (T_i - cached_i)`` and the relative cost of the
   sequence is ``sum(cost_i) / sum(T_i)``.

Two pricings are predefined:

- :data:`ANTHROPIC`: reads at 0.1x, writes at 1.25x (5-minute cache), minimum 1,024
  tokens, any length beyond it (``increment=1``). Anthropic matches at cache breakpoints
  (with a short lookback) rather than at any prefix; with a breakpoint at the end of every
  prompt the two agree whenever the previous prompt is a prefix of the new one, which is
  the only way the strategies measured here share more than their system prompt.
- :data:`OPENAI`: reads at 0.5x, no write premium, caching only from 1,024 common tokens,
  in 128-token increments beyond that.

:data:`OPENAI_AUTO` is OpenAI's automatic prefix caching at the discount its current
models get (cached input at 0.1x, no write premium, from 1,024 tokens in 128-token
increments); the agent benchmark reports it beside :data:`ANTHROPIC`. It is not in
:data:`PRICINGS`, so the figures priced before it came stay as they were.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "OPENAI_AUTO",
    "PRICINGS",
    "CacheCost",
    "CacheMeter",
    "CallCost",
    "Pricing",
    "Prompt",
    "cache_cost",
    "call_costs",
    "common_prefix_tokens",
]

#: A prompt: its messages in order, as ``(fingerprint, tokens)`` pairs.
Prompt = Sequence[tuple[Hashable, int]]


@dataclass(frozen=True, slots=True)
class Pricing:
    """How a provider bills cached and uncached input tokens (multiples of the base price).

    Attributes:
        name: A short label (``"anthropic"``, ``"openai"``).
        read: Price of a token served from cache.
        write: Price of an uncached token of a prompt that is written to the cache.
        minimum: Shortest common prefix (tokens) that is served from cache, and shortest
            prompt that is written to it.
        increment: Cached lengths beyond ``minimum`` are rounded down to a multiple of this.
    """

    name: str
    read: float
    write: float
    minimum: int = 0
    increment: int = 1

    def __post_init__(self) -> None:
        if self.read < 0 or self.write < 0:
            raise ValueError("read and write prices must be >= 0")
        if self.minimum < 0 or self.increment < 1:
            raise ValueError("minimum must be >= 0 and increment >= 1")

    def cached(self, common_prefix: int) -> int:
        """Tokens served from cache when ``common_prefix`` tokens match the previous call."""
        if common_prefix <= 0 or common_prefix < self.minimum:
            return 0
        extra = common_prefix - self.minimum
        return self.minimum + extra - extra % self.increment

    def cost(self, prompt_tokens: int, cached: int) -> float:
        """Cost of one call of ``prompt_tokens`` tokens, ``cached`` of them from cache."""
        rate = self.write if prompt_tokens >= self.minimum else 1.0
        return self.read * cached + rate * (prompt_tokens - cached)


#: Anthropic: 0.1x reads, 1.25x writes, prompts of 1,024 tokens or more.
ANTHROPIC = Pricing("anthropic", read=0.1, write=1.25, minimum=1024, increment=1)
#: OpenAI: 0.5x reads, no write premium, from 1,024 tokens in 128-token steps.
OPENAI = Pricing("openai", read=0.5, write=1.0, minimum=1024, increment=128)
#: OpenAI's automatic caching on current models: 0.1x reads, no write premium, from 1,024
#: tokens in 128-token steps.
OPENAI_AUTO = Pricing("openai-auto", read=0.1, write=1.0, minimum=1024, increment=128)
#: Both predefined pricings, in report order.
PRICINGS: tuple[Pricing, ...] = (ANTHROPIC, OPENAI)


@dataclass(frozen=True, slots=True)
class CallCost:
    """One priced call.

    Attributes:
        prompt_tokens: Tokens in the prompt.
        common_prefix: Tokens of the longest common message prefix with the previous call.
        cached: Tokens served from cache under the pricing.
        cost: Price of the call, in full-price input tokens.
    """

    prompt_tokens: int
    common_prefix: int
    cached: int
    cost: float


@dataclass(frozen=True, slots=True)
class CacheCost:
    """A priced sequence of calls under one pricing.

    Attributes:
        pricing: The pricing's name.
        calls: Number of calls.
        relative_cost: Total cost divided by the cost without caching (``1.0`` = no saving).
        mean_prompt_tokens: Mean prompt size.
        min_prompt_tokens: Smallest prompt.
        max_prompt_tokens: Largest prompt.
        hit_rate: Fraction of calls that read anything from cache.
        cached_fraction: Fraction of all prompt tokens served from cache.
    """

    pricing: str
    calls: int
    relative_cost: float
    mean_prompt_tokens: float
    min_prompt_tokens: int
    max_prompt_tokens: int
    hit_rate: float
    cached_fraction: float


def common_prefix_tokens(previous: Prompt, current: Prompt) -> int:
    """Tokens of the longest run of identical leading messages of two prompts.

    Messages are compared by fingerprint (and token count); the prefix stops at the first
    message that differs.
    """
    total = 0
    for a, b in zip(previous, current, strict=False):
        if a is not b and a != b:
            break
        total += b[1]
    return total


class CacheMeter:
    """Prices prompts one at a time, keeping only the previous prompt.

    Use it when the prompts are produced on the fly (a long replay) and should not all be
    kept in memory; :func:`cache_cost` is the one-shot form.

    Args:
        pricings: The pricings to accumulate (default: :data:`PRICINGS`).
    """

    __slots__ = (
        "_cached",
        "_calls",
        "_costs",
        "_hits",
        "_max",
        "_min",
        "_previous",
        "_tokens",
        "pricings",
    )

    def __init__(self, pricings: Iterable[Pricing] = PRICINGS) -> None:
        self.pricings = tuple(pricings)
        self._previous: Prompt = ()
        self._calls = 0
        self._tokens = 0
        self._min = 0
        self._max = 0
        self._costs = [0.0] * len(self.pricings)
        self._cached = [0] * len(self.pricings)
        self._hits = [0] * len(self.pricings)

    def add(self, prompt: Prompt, *, count: bool = True) -> list[CallCost]:
        """Price one call; returns its cost under each pricing, in order.

        Args:
            prompt: The call's prompt.
            count: ``False`` only remembers the prompt as the previous one (it warms the
                cache for the next call but is left out of the totals); returns ``[]``.
        """
        if not count:
            self._previous = prompt
            return []
        tokens = sum(t for _, t in prompt)
        lcp = common_prefix_tokens(self._previous, prompt)
        self._previous = prompt
        self._min = tokens if self._calls == 0 else min(self._min, tokens)
        self._max = max(self._max, tokens)
        self._calls += 1
        self._tokens += tokens
        out = []
        for i, pricing in enumerate(self.pricings):
            cached = pricing.cached(lcp)
            cost = pricing.cost(tokens, cached)
            self._costs[i] += cost
            self._cached[i] += cached
            self._hits[i] += cached > 0
            out.append(CallCost(tokens, lcp, cached, cost))
        return out

    def results(self) -> tuple[CacheCost, ...]:
        """The totals so far, one :class:`CacheCost` per pricing."""
        n, tokens = self._calls, self._tokens
        return tuple(
            CacheCost(
                pricing=pricing.name,
                calls=n,
                relative_cost=self._costs[i] / tokens if tokens else 1.0,
                mean_prompt_tokens=tokens / n if n else 0.0,
                min_prompt_tokens=self._min,
                max_prompt_tokens=self._max,
                hit_rate=self._hits[i] / n if n else 0.0,
                cached_fraction=self._cached[i] / tokens if tokens else 0.0,
            )
            for i, pricing in enumerate(self.pricings)
        )


def call_costs(prompts: Iterable[Prompt], pricing: Pricing) -> list[CallCost]:
    """Price each call of a sequence of prompts under ``pricing``."""
    meter = CacheMeter((pricing,))
    return [meter.add(p)[0] for p in prompts]


def cache_cost(prompts: Iterable[Prompt], pricing: Pricing) -> CacheCost:
    """Price a sequence of prompts under ``pricing`` (see the module docstring)."""
    meter = CacheMeter((pricing,))
    for p in prompts:
        meter.add(p)
    return meter.results()[0]
