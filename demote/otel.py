"""OpenTelemetry metrics for a Demoter (extra ``demote[otel]``), enabled with one call.

::

    from demote.otel import instrument

    instrument(demoter)  # the global MeterProvider; or meter_provider=provider

The metrics come from the Demoter's events (an observer, on the Demoter's own event
thread, never on the request path) and, for the observable instruments, from
:meth:`demote.Demoter.stats` when the metrics are collected (the ``conversations`` count
is one state-store query):

==============================  ==============  ============================================
metric                          unit            what
==============================  ==============  ============================================
``demote.loads``                {load}          loads served (observable counter)
``demote.pending``              {message}       messages waiting for delivery (gauge)
``demote.conversations``        {conversation}  conversations in the state store (gauge)
``demote.demoted.messages``     {message}       messages that left the window
``demote.deliveries``           {batch}         hook calls, by ``demote.outcome``
                                                (``delivered`` or ``failed``)
``demote.delivered.messages``   {message}       messages the hook accepted
``demote.hook.duration``        s               one hook call (by ``demote.outcome``)
``demote.resyncs``              {resync}        rewritten histories re-synced
``demote.compactions``          {summary}       by ``demote.outcome`` (``committed``,
                                                ``failed``)
``demote.compaction.duration``  s               one summary being written
``demote.recalls``              {search}        recalls an adapter ran
``demote.recalled.messages``    {message}       recalled messages placed in a prompt
``demote.recall.duration``      s               one recall search
==============================  ==============  ============================================

No attribute names a conversation (that would be one time series per conversation);
``attributes=`` adds fixed ones to every measurement, to tell several Demoters apart.
Importing this module costs nothing and needs no OpenTelemetry; only :func:`instrument`
imports ``opentelemetry-api`` and raises :class:`~demote.errors.MissingExtraError` without
it. An uninstrumented Demoter does no metric work at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from demote.errors import ConfigError, MissingExtraError
from demote.events import DemoteEvent, DemoterStats

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

    from demote.engine.demoter import Demoter

__all__ = ["Instrumentation", "instrument"]


@dataclass(frozen=True, eq=False)
class _Source:
    """One instrumented Demoter, as the observable instruments see it."""

    demoter: Demoter
    attributes: dict[str, Any]


class _Instruments:
    """The instruments of one meter, shared by every Demoter instrumented on it."""

    def __init__(self, meter: Meter) -> None:
        from opentelemetry.metrics import Observation

        self._observation = Observation
        self.sources: list[_Source] = []
        self.lock = threading.Lock()
        c, h = meter.create_counter, meter.create_histogram
        self.demoted = c("demote.demoted.messages", "{message}", "Messages that left the window")
        self.deliveries = c("demote.deliveries", "{batch}", "Hook calls, by outcome")
        self.delivered = c("demote.delivered.messages", "{message}", "Messages the hook accepted")
        self.hook_duration = h("demote.hook.duration", "s", "Duration of one hook call")
        self.resyncs = c("demote.resyncs", "{resync}", "Rewritten histories re-synced")
        self.compactions = c("demote.compactions", "{summary}", "Summaries, by outcome")
        self.compaction_duration = h("demote.compaction.duration", "s", "Writing one summary")
        self.recalls = c("demote.recalls", "{search}", "Recall searches an adapter ran")
        self.recalled = c("demote.recalled.messages", "{message}", "Recalled messages sent")
        self.recall_duration = h("demote.recall.duration", "s", "Duration of one recall")
        meter.create_observable_counter(
            "demote.loads", [self._observe(lambda s: s.loads)], "{load}", "Loads served"
        )
        meter.create_observable_gauge(
            "demote.pending",
            [self._observe(lambda s: s.pending)],
            "{message}",
            "Messages waiting for delivery",
        )
        meter.create_observable_gauge(
            "demote.conversations",
            [self._observe(lambda s: s.conversations)],
            "{conversation}",
            "Conversations with demotion state in the store",
        )

    def _observe(
        self, read: Callable[[DemoterStats], int]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            with self.lock:
                sources = list(self.sources)
            return [self._observation(read(s.demoter.stats()), s.attributes) for s in sources]

        return callback

    def record(self, event: DemoteEvent, attributes: dict[str, Any]) -> None:
        kind = event.kind
        if kind == "demoted":
            self.demoted.add(event.count, attributes)
        elif kind in ("delivered", "delivery_failed"):
            result = "delivered" if kind == "delivered" else "failed"
            outcome = {**attributes, "demote.outcome": result}
            self.deliveries.add(1, outcome)
            if kind == "delivered":
                self.delivered.add(event.count, attributes)
            if event.duration is not None:
                self.hook_duration.record(event.duration, outcome)
        elif kind == "resynced":
            self.resyncs.add(1, attributes)
        elif kind in ("compaction_committed", "compaction_failed"):
            outcome = {**attributes, "demote.outcome": kind.removeprefix("compaction_")}
            self.compactions.add(1, outcome)
            if event.duration is not None:
                self.compaction_duration.record(event.duration, outcome)
        elif kind == "recalled":
            self.recalls.add(1, attributes)
            self.recalled.add(event.count, attributes)
            if event.duration is not None:
                self.recall_duration.record(event.duration, attributes)


_registry_lock = threading.Lock()
_registry: dict[int, tuple[Meter, _Instruments]] = {}


class Instrumentation:
    """An instrumented Demoter; :meth:`uninstrument` stops its metrics."""

    def __init__(self, instruments: _Instruments, source: _Source) -> None:
        self._instruments = instruments
        self._source = source
        self._unsubscribe = source.demoter.observe(self._on_event)

    def _on_event(self, event: DemoteEvent) -> None:
        self._instruments.record(event, self._source.attributes)

    def uninstrument(self) -> None:
        """Stop recording this Demoter's events and observing its stats."""
        self._unsubscribe()
        with self._instruments.lock:
            if self._source in self._instruments.sources:
                self._instruments.sources.remove(self._source)


def instrument(
    demoter: Demoter,
    meter_provider: MeterProvider | None = None,
    *,
    attributes: Mapping[str, str | bool | int | float] | None = None,
) -> Instrumentation:
    """Record ``demoter``'s activity as OpenTelemetry metrics (see the module docstring).

    Args:
        demoter: The Demoter to measure.
        meter_provider: Where the metrics go; OpenTelemetry's global provider if omitted.
        attributes: Fixed attributes added to every measurement (``{"demote.demoter":
            "support"}`` tells several Demoters apart). Never a conversation id.

    Returns:
        An :class:`Instrumentation`; its ``uninstrument()`` stops the metrics.

    Raises:
        MissingExtraError: ``opentelemetry-api`` is not installed (``demote[otel]``).
        ConfigError: ``demoter`` is not a Demoter, or ``attributes`` is not a mapping of
            strings to strings, booleans or numbers.
    """
    try:
        from opentelemetry import metrics
    except ImportError as exc:
        raise MissingExtraError("opentelemetry-api", "otel") from exc
    from demote.engine.demoter import Demoter

    if not isinstance(demoter, Demoter):
        raise ConfigError(f"demoter: expected a Demoter, got {type(demoter).__name__}")
    attrs = dict(attributes or {})
    for key, value in attrs.items():
        if not isinstance(key, str) or not isinstance(value, str | bool | int | float):
            raise ConfigError(f"attributes: {key!r}: {value!r} is not a str, bool or number")
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    meter = provider.get_meter("demote", _version())
    with _registry_lock:
        entry = _registry.get(id(meter))
        if entry is None or entry[0] is not meter:
            entry = _registry[id(meter)] = (meter, _Instruments(meter))
    instruments = entry[1]
    source = _Source(demoter, attrs)
    with instruments.lock:
        instruments.sources.append(source)
    return Instrumentation(instruments, source)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("demote")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"
