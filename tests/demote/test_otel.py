"""OpenTelemetry metrics, read back with the SDK's ``InMemoryMetricReader``.

A Demoter whose sink fails once and then recovers must show: loads, the pending gauge
going up then back to 0, one failed and one successful delivery (with their hook
durations), the demoted and delivered message counts, and a recall. Several Demoters on
one provider are told apart by their attributes; ``uninstrument`` stops the metrics; and
without ``opentelemetry-api`` importing demote pulls in nothing and ``instrument`` names
the extra.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from demote import Backoff, DemoteEvent, Demoter, Demotion, SlidingWindow
from demote.errors import ConfigError, MissingExtraError
from demote.otel import instrument
from demote.records import Recalled
from tests.strategies import Msg, describer

CHAT = [Msg("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(40)]


class Sink:
    def __init__(self) -> None:
        self.down = False

    def deliver(self, batch: Demotion) -> None:
        if self.down:
            raise RuntimeError("sink down")


@pytest.fixture
def reader() -> Iterator[tuple[InMemoryMetricReader, MeterProvider]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield reader, provider
    provider.shutdown()


Points = dict[str, list[Any]]


def points(reader: InMemoryMetricReader) -> Points:
    out: Points = {}
    data = reader.get_metrics_data()
    if data is None:
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def value(pts: Points, name: str, **attrs: Any) -> float:
    """The sum (counters, gauges) or count (histograms) of the points with ``attrs``."""
    total = 0.0
    for p in pts.get(name, []):
        if all(p.attributes.get(k) == v for k, v in attrs.items()):
            total += p.count if hasattr(p, "bucket_counts") else p.value
    return total


def eventually(reader: InMemoryMetricReader, check: Callable[[Points], bool]) -> Points:
    """Observers run on the Demoter's event thread: wait until the metrics agree."""
    deadline = time.monotonic() + 10
    while True:
        pts = points(reader)
        if check(pts) or time.monotonic() > deadline:
            return pts
        time.sleep(0.01)


def test_loads_deliveries_failures_pending_and_recall(
    reader: tuple[InMemoryMetricReader, MeterProvider],
) -> None:
    metric_reader, provider = reader
    sink = Sink()
    demoter = Demoter(SlidingWindow.last_messages(4), sink, retry=Backoff(0, 0))
    instrument(demoter, meter_provider=provider, attributes={"demote.demoter": "a"})
    describe = describer(demoter)
    sink.down = True
    demoter.load("c", CHAT[:8], describe)  # demotes 4, the delivery fails
    pts = eventually(metric_reader, lambda p: value(p, "demote.deliveries") == 1)
    assert value(pts, "demote.pending", **{"demote.demoter": "a"}) == 4
    assert value(pts, "demote.deliveries", **{"demote.outcome": "failed"}) == 1
    assert value(pts, "demote.demoted.messages") == 4
    sink.down = False
    demoter.load("c", CHAT[:8], describe)  # the retry delivers them
    demoter.load("c", CHAT[:10], describe)  # 2 more
    demoter.emit(DemoteEvent.recalled("c", [Recalled("user", "x", 1, "k1")], 0.003))
    pts = eventually(metric_reader, lambda p: value(p, "demote.recalls") == 1
                     and value(p, "demote.delivered.messages") == 6)  # fmt: skip
    assert value(pts, "demote.loads", **{"demote.demoter": "a"}) == 3
    assert value(pts, "demote.pending") == 0
    assert value(pts, "demote.deliveries", **{"demote.outcome": "delivered"}) == 2
    assert value(pts, "demote.delivered.messages") == 6
    assert value(pts, "demote.demoted.messages") == 6
    assert value(pts, "demote.hook.duration") == 3  # three hook calls timed
    assert value(pts, "demote.hook.duration", **{"demote.outcome": "failed"}) == 1
    assert value(pts, "demote.recalled.messages") == 1
    assert value(pts, "demote.recall.duration") == 1
    assert value(pts, "demote.conversations") == 1
    # No metric is broken down by conversation.
    assert all("conversation_id" not in p.attributes for ps in pts.values() for p in ps)


def test_two_demoters_on_one_provider_and_uninstrument(
    reader: tuple[InMemoryMetricReader, MeterProvider],
) -> None:
    metric_reader, provider = reader
    sinks = [Sink(), Sink()]
    demoters = [Demoter(SlidingWindow.last_messages(2), s, retry=Backoff(0, 0)) for s in sinks]
    handles = [
        instrument(d, meter_provider=provider, attributes={"demote.demoter": name})
        for d, name in zip(demoters, "ab", strict=True)
    ]
    sinks[1].down = True
    for d in demoters:
        d.load("c", CHAT[:6], describer(d))
    pts = eventually(metric_reader, lambda p: value(p, "demote.deliveries") == 2)
    assert value(pts, "demote.pending", **{"demote.demoter": "a"}) == 0
    assert value(pts, "demote.pending", **{"demote.demoter": "b"}) == 4
    assert (
        value(pts, "demote.deliveries", **{"demote.demoter": "b", "demote.outcome": "failed"}) == 1
    )
    handles[0].uninstrument()
    demoters[0].load("c", CHAT[:8], describer(demoters[0]))
    time.sleep(0.2)
    pts = points(metric_reader)
    assert value(pts, "demote.delivered.messages", **{"demote.demoter": "a"}) == 4  # not 6
    assert value(pts, "demote.pending", **{"demote.demoter": "b"}) == 4
    assert all(p.attributes.get("demote.demoter") != "a" for p in pts["demote.pending"])


def test_bad_arguments_are_refused(reader: tuple[InMemoryMetricReader, MeterProvider]) -> None:
    _, provider = reader
    demoter = Demoter(SlidingWindow.last_messages(2))
    with pytest.raises(ConfigError, match="demoter"):
        instrument(object(), meter_provider=provider)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="attributes"):
        instrument(demoter, meter_provider=provider, attributes={"k": [1]})  # type: ignore[dict-item]


def test_without_the_extra_instrument_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(MissingExtraError, match=r"demote\[otel\]"):
        instrument(Demoter(SlidingWindow.last_messages(2)))


def test_importing_demote_does_not_import_opentelemetry() -> None:
    code = (
        "import sys, demote, demote.engine, demote.otel; "
        "print(any(m.startswith('opentelemetry') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
