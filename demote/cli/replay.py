"""Replay a transcript through a real :class:`~demote.Demoter` and measure the windows.

One *model call* is made per user message: the history up to and including that message
is loaded through the engine, and the prompt is

    system prompt (a stand-in of ``system_prompt_tokens``) + pinned system messages
    + summary (if any) + the active window.

For each call the replay records the window's size (messages and tokens), what the call
demoted, and the prompt as ``(fingerprint, tokens)`` pairs, which
:class:`~demote.cli.cachecost.CacheMeter` prices under provider prompt caching as it goes
(prompts are not kept, so a 100,000-message replay runs in bounded memory). Every message
is described once (the engine caches records by message identity and the replay hands it
the same record objects), so a call costs time in proportion to the window, not the
history.

The *guaranteed context* of a run is the smallest window, in tokens, seen after the window
first stopped holding the whole conversation: what the model can count on once the
conversation is long.

``Compact``: given a ``summarizer`` (such as :class:`~demote.TemplateSummarizer`), the
engine folds the marked groups into a running summary in the background; the replay waits
for that work after every call (:meth:`~demote.Demoter.drain`), as if each summary were
ready before the next turn, so runs are repeatable. Without a summarizer nothing is
summarized: the engine cuts the window back in bulk at ``limit + 2 * compact_count``
(and would warn that ``Compact`` has no summarizer; a replay does this on purpose, so the
warning is silenced here). The replay then prices a stand-in summary message of
``summary_tokens`` tokens after the first demotion, whose content changes every time the
window start moves (as a re-written summary would), so the prompt-cache cost is that of a
compacting memory.

:class:`ReplayMeter` is the same bookkeeping for windows produced by something other than
the engine (the benchmarks feed it LangChain's ``trim_messages`` and LlamaIndex's memory).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from demote.cli.cachecost import PRICINGS, CacheCost, CacheMeter, Pricing, Prompt
from demote.cli.transcript import Transcript
from demote.engine.demoter import Demoter
from demote.engine.result import render_summary
from demote.errors import ConfigError, MissingExtraError
from demote.records import MessageRecord, fingerprint
from demote.window.policy import Bulk, Compact, SlidingWindow

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "SYSTEM_PROMPT_ID",
    "ReplayMeter",
    "ReplayResult",
    "describe_policy",
    "plot_windows",
    "replay",
]

#: Fingerprint of the stand-in system prompt in every replayed prompt.
SYSTEM_PROMPT_ID = "demote.replay:system-prompt"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay measured.

    Attributes:
        label: What was replayed (the policy, or the setup's name).
        messages: Messages in the transcript.
        calls: Model calls made (one per user message).
        demoted: Messages that left the window (for the engine: delivered to the hook, or
            folded into the summary and then delivered).
        demotions: Calls at which something left the window (cuts).
        window_messages: ``(min, max)`` window size in messages over all calls.
        window_tokens: ``(min, max)`` window size in tokens over all calls.
        guaranteed_tokens: Smallest window in tokens after the window first stopped
            holding the whole conversation; ``None`` if it never did.
        mean_prompt_tokens: Mean prompt size (system prompt, summary and window).
        costs: Relative prompt cost under each pricing (see :mod:`demote.cli.cachecost`).
        steady_costs: The same, counting only the calls from the first one whose window
            no longer held the whole conversation (the regime a long chat lives in); the
            cache is still warmed by the calls before it. Empty if that never happened.
        seconds: Wall time of the replay.
        series: Window size in tokens at each call, in order (for plots).
    """

    label: str
    messages: int
    calls: int
    demoted: int
    demotions: int
    window_messages: tuple[int, int]
    window_tokens: tuple[int, int]
    guaranteed_tokens: int | None
    mean_prompt_tokens: float
    costs: tuple[CacheCost, ...]
    steady_costs: tuple[CacheCost, ...]
    seconds: float
    series: tuple[int, ...] = ()

    def cost(self, pricing: str, *, steady: bool = False) -> CacheCost:
        """The :class:`~demote.cli.cachecost.CacheCost` under the pricing named ``pricing``.

        Args:
            pricing: The pricing's name (``"anthropic"``, ``"openai"``).
            steady: From :attr:`steady_costs` instead of :attr:`costs`.

        Raises:
            KeyError: No such pricing (or no steady state).
        """
        for c in self.steady_costs if steady else self.costs:
            if c.pricing == pricing:
                return c
        raise KeyError(pricing)


class ReplayMeter:
    """Accumulates per-call window sizes and prices the prompts as they come.

    Args:
        label: Name of the setup being measured.
        pricings: Pricings to price prompts under.
        keep_series: Keep the window size of every call (for :func:`plot_windows`).
    """

    def __init__(
        self, label: str, pricings: Iterable[Pricing] = PRICINGS, *, keep_series: bool = True
    ) -> None:
        self.label = label
        pricings = tuple(pricings)
        self._cache = CacheMeter(pricings)
        self._steady = CacheMeter(pricings)
        self._keep = keep_series
        self._series: list[int] = []
        self._calls = 0
        self._demoted = 0
        self._demotions = 0
        self._msgs = (0, 0)
        self._tokens = (0, 0)
        self._guaranteed: int | None = None
        self._started = time.perf_counter()

    def record(
        self,
        prompt: Prompt,
        *,
        window_tokens: int,
        window_messages: int,
        full: bool,
        demoted: int = 0,
    ) -> None:
        """Record one call.

        Args:
            prompt: The whole prompt, as ``(fingerprint, tokens)`` pairs.
            window_tokens: Tokens of the conversation messages in the prompt.
            window_messages: How many conversation messages the prompt holds.
            full: The window no longer holds the whole conversation so far.
            demoted: Messages that left the window at this call.
        """
        self._cache.add(prompt)
        self._steady.add(prompt, count=full or self._guaranteed is not None)
        if self._calls == 0:
            self._msgs = (window_messages, window_messages)
            self._tokens = (window_tokens, window_tokens)
        else:
            (m0, m1), (t0, t1) = self._msgs, self._tokens
            self._msgs = (min(m0, window_messages), max(m1, window_messages))
            self._tokens = (min(t0, window_tokens), max(t1, window_tokens))
        self._calls += 1
        if full:
            g = self._guaranteed
            self._guaranteed = window_tokens if g is None else min(g, window_tokens)
        if demoted:
            self._demoted += demoted
            self._demotions += 1
        if self._keep:
            self._series.append(window_tokens)

    def result(self, *, messages: int, seconds: float | None = None) -> ReplayResult:
        """The result so far; ``seconds`` defaults to the time since the meter was made."""
        costs = self._cache.results()
        return ReplayResult(
            label=self.label,
            messages=messages,
            calls=self._calls,
            demoted=self._demoted,
            demotions=self._demotions,
            window_messages=self._msgs,
            window_tokens=self._tokens,
            guaranteed_tokens=self._guaranteed,
            mean_prompt_tokens=costs[0].mean_prompt_tokens if costs else 0.0,
            costs=costs,
            steady_costs=self._steady.results() if self._guaranteed is not None else (),
            seconds=time.perf_counter() - self._started if seconds is None else seconds,
            series=tuple(self._series),
        )


def _identity(record: MessageRecord) -> MessageRecord:
    return record


def describe_policy(policy: SlidingWindow) -> str:
    """A short label for a policy, e.g. ``"tokens<=4000, bulk(+1000)"``."""
    ev = policy.eviction
    how: str = ev.kind
    if isinstance(ev, Bulk):
        how = f"bulk(+{ev.overflow})"
    elif isinstance(ev, Compact):
        how = f"compact({ev.compact_count})"
    return f"{policy.unit}<={policy.limit}, {how}"


def replay(
    transcript: Transcript | Sequence[tuple[str, str]],
    policy: SlidingWindow,
    *,
    system_prompt_tokens: int = 200,
    hook: object | None = None,
    summary_tokens: int = 200,
    summarizer: object | None = None,
    label: str | None = None,
    pricings: Iterable[Pricing] = PRICINGS,
    keep_series: bool = True,
    on_call: Callable[[int, Sequence[MessageRecord]], None] | None = None,
) -> ReplayResult:
    """Replay a transcript through a :class:`~demote.Demoter` with ``policy``.

    Args:
        transcript: A :class:`~demote.cli.transcript.Transcript` or ``(role, text)``
            pairs.
        policy: The window policy to replay with.
        system_prompt_tokens: Size of the stand-in system prompt at the head of every
            prompt (``0`` for none).
        hook: Where demoted messages go (default: nowhere).
        summary_tokens: Size of the stand-in summary for ``Compact`` without a
            summarizer (see the module docstring).
        summarizer: Summarizer for ``Compact`` (passed to the engine).
        label: Name of the run (default: the policy, described).
        pricings: Pricings for the prompt cost.
        keep_series: Keep the per-call window sizes in the result.
        on_call: Called after each model call with the index of the user message and the
            window's records (for custom measurements, such as evidence retained).

    Returns:
        The measurements.

    Raises:
        ConfigError: A negative stand-in size.
    """
    if system_prompt_tokens < 0 or summary_tokens < 0:
        raise ConfigError("system_prompt_tokens and summary_tokens must be >= 0")
    pairs = transcript.messages if isinstance(transcript, Transcript) else transcript
    with warnings.catch_warnings():
        # Compact without a summarizer is what the stand-in summary models (see above).
        warnings.filterwarnings("ignore", message="(?i).*summarizer")
        demoter = Demoter(policy, hook, summarizer=summarizer)
    meter = ReplayMeter(label or describe_policy(policy), pricings, keep_series=keep_series)
    head: list[tuple[Hashable, int]] = []
    if system_prompt_tokens:
        head.append((SYSTEM_PROMPT_ID, system_prompt_tokens))
    stub = isinstance(policy.eviction, Compact) and summarizer is None
    history: list[MessageRecord] = []
    left = 0  # messages that have left the window (demoted or summarized)
    cumulative = [0]  # cumulative[i]: tokens of history[:i]
    began = time.perf_counter()
    for role, text in pairs:
        record = demoter.describe(role, text)
        history.append(record)
        cumulative.append(cumulative[-1] + record.tokens)
        if role != "user":
            continue
        window = demoter.load("replay", history, _identity)
        pinned = len(window.pinned)
        gone = max(0, window.start - pinned)
        prompt: list[tuple[Hashable, int]] = [*head]
        prompt.extend((r.fingerprint, r.tokens) for r in window.pinned)
        if window.summary is not None:
            summary = render_summary(window.summary)
            fp = fingerprint("system", summary)
            prompt.append((fp, demoter.tokens.count(fp, summary)))
        elif stub and window.start > pinned:
            prompt.append((f"demote.replay:summary@{window.start}", summary_tokens))
        prompt.extend((r.fingerprint, r.tokens) for r in window.messages)
        meter.record(
            prompt,
            window_tokens=cumulative[-1] - cumulative[window.start],
            window_messages=len(window.messages),
            full=gone > 0,
            demoted=gone - left,
        )
        left = max(left, gone)
        if on_call is not None:
            on_call(len(history) - 1, window.messages)
        if summarizer is not None:
            demoter.drain()
    return meter.result(messages=len(pairs), seconds=time.perf_counter() - began)


def plot_windows(
    results: Sequence[ReplayResult],
    path: str | os.PathLike[str] | None = None,
    *,
    title: str = "Active window over a replay",
    limit: int | None = None,
    ax: Any = None,
) -> Figure:
    """Plot window size (tokens) over calls, one line per result.

    Args:
        results: Replays to draw (each needs its ``series``).
        path: Save the figure there (the format follows the suffix: .png, .svg, .pdf).
        title: The plot's title.
        limit: Draw the policy limit as a dashed line.
        ax: Draw on this matplotlib ``Axes`` (in a notebook, one from
            ``plt.subplots()``, then ``plt.show()``) instead of a new figure.

    Returns:
        The matplotlib figure (without ``ax``, a new one: no pyplot state is touched).

    Raises:
        MissingExtraError: matplotlib is not installed (``pip install 'demote[plot]'``).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtraError("matplotlib", "plot") from exc
    if ax is None:
        fig = Figure(figsize=(9, 4.5), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    for r in results:
        ax.plot(range(1, len(r.series) + 1), r.series, label=r.label, linewidth=1)
    if limit is not None:
        ax.axhline(limit, color="grey", linestyle="--", linewidth=0.8, label=f"limit {limit}")
    ax.set_xlabel("model call (user turn)")
    ax.set_ylabel("window tokens")
    ax.set_title(title)
    ax.legend(fontsize="small")
    if path is not None:
        fig.savefig(os.fspath(path), dpi=110)
    return fig
