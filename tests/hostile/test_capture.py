"""The catalogue, capture: RetryPolicy, SQLiteOutbox, Recorder and AsyncRecorder.

Every probe is one public call with one hostile value (see tests/hostile/harness.py): it
succeeds with a right result, or raises a DemoteError naming the argument and leaves the
outbox file byte-for-byte as it was. Sinks that misbehave are probes too: whatever a sink
raises or returns, the worker lives on and delivers the next item.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from demote.capture import AsyncRecorder, Recorder, RetryPolicy, SQLiteOutbox, dedup_key
from demote.records import CapturedTurn, DemotedMessage, Demotion, storable_text
from tests.hostile.harness import (
    BAD_COUNTS,
    BAD_IDS,
    BAD_NUMBERS,
    FOREIGN_KINDS,
    Env,
    Probe,
    check,
    make_foreign,
    probes_for,
    wait_for,
)

FAST = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.01)
BAD_KEYS: list[object] = [3, "", b"key", "nul\x00inside", "\ud800", "k" * 20_000, ["k"]]
BAD_ITEMS: list[object] = [object(), {1, 2}, float("nan"), {"a": float("inf")}, b"bytes"]
BAD_PATHS: list[object] = [None, 3, b"outbox.db", "", "nul\x00inside.db", ["o.db"]]


def outbox(env: Env, **options: Any) -> SQLiteOutbox:
    box = SQLiteOutbox(env.root / "outbox.db", retry=FAST, **options)
    env.objects["outbox"] = box
    env.closers.append(box.close)
    return box


def recorder(env: Env) -> None:
    """A started Recorder over an outbox holding one item of another conversation."""
    got: list[Any] = []
    r = Recorder(got.append, flush_timeout=5, outbox=outbox(env))
    r.enqueue(turn("other", "kept"))
    assert wait_for(lambda: len(got) == 1)
    env.objects.update(recorder=r, got=got)
    env.closers.insert(0, r.close)


def turn(cid: str, text: str, index: int = 0) -> CapturedTurn:
    return CapturedTurn(cid, "user", text, index, f"{cid}:{index}")


def box(env: Env) -> SQLiteOutbox:
    b: SQLiteOutbox = env.objects["outbox"]
    return b


def rec(env: Env) -> Recorder:
    r: Recorder = env.objects["recorder"]
    return r


PROBES: list[Probe] = []

# -- RetryPolicy ---------------------------------------------------------------------------

PROBES += probes_for("RetryPolicy", "max_attempts", BAD_COUNTS, lambda e, v: RetryPolicy(v))
PROBES += probes_for(
    "RetryPolicy", "base_delay", BAD_NUMBERS, lambda e, v: RetryPolicy(base_delay=v)
)
PROBES += probes_for(
    "RetryPolicy", "max_delay", [*BAD_NUMBERS, 0.1], lambda e, v: RetryPolicy(max_delay=v)
)
PROBES.append(
    Probe(
        "RetryPolicy(max_attempts=2**31-1).delay(2**31-2)",
        "delay",
        lambda e: RetryPolicy(2**31 - 1, 1, 60).delay(2**31 - 2),
        True,
        lambda result, e: result == 60.0,
    )
)

# -- SQLiteOutbox: options, paths, foreign files ------------------------------------------

for option, values in {
    "checkpoint_every": BAD_COUNTS,
    "wal_limit": BAD_COUNTS,
    "timeout": BAD_NUMBERS,
    "synchronous": ["OFF", None, 3, "normal; DROP TABLE outbox"],
    "retry": [5, "fast", object()],
}.items():
    PROBES += probes_for(
        "SQLiteOutbox",
        option,
        values,
        lambda env, v, option=option: SQLiteOutbox(env.root / "o.db", **{option: v}),
    )
PROBES += probes_for("SQLiteOutbox", "path", BAD_PATHS, lambda env, v: SQLiteOutbox(v))
for kind in FOREIGN_KINDS:
    if kind != "outbox":
        PROBES.append(
            Probe(
                f"SQLiteOutbox(path={kind} file)",
                "outbox.db",
                lambda env: SQLiteOutbox(env.root / "outbox.db"),
                setup=lambda env, kind=kind: make_foreign(env.root / "outbox.db", kind),
            )
        )

# -- SQLiteOutbox and Recorder calls on a running outbox -----------------------------------

PROBES += probes_for(
    "SQLiteOutbox.erase", "conversation_id", BAD_IDS, lambda e, v: box(e).erase(v), outbox
)
PROBES += probes_for(
    "SQLiteOutbox.erase",
    "fence",
    [-1, "3", 2.5, 10**400, True],
    lambda e, v: box(e).erase("c", fence=v),
    outbox,
)
PROBES += probes_for(
    "SQLiteOutbox.put",
    "fence",
    [-1, "3", 2.5, 10**400],
    lambda e, v: box(e).put("k", "{}", conversation="c", fence=v),
    outbox,
)
PROBES += probes_for(
    "SQLiteOutbox.put", "key", [None, *BAD_KEYS], lambda e, v: box(e).put(v, "{}"), outbox
)
PROBES += probes_for(
    "SQLiteOutbox.put", "payload", [None, b"{}", 3], lambda e, v: box(e).put("k", v), outbox
)
PROBES += probes_for(
    "SQLiteOutbox.put",
    "conversation",
    BAD_IDS[1:],
    lambda e, v: box(e).put("k", "{}", conversation=v),
    outbox,
)
PROBES += probes_for(
    "Recorder.enqueue",
    "conversation",
    BAD_IDS[1:],
    lambda e, v: rec(e).enqueue(CapturedTurn(v, "user", "hi", 0, "k")),
    recorder,
)
PROBES += probes_for(
    "Recorder.enqueue", "key", BAD_KEYS, lambda e, v: rec(e).enqueue({"a": 1}, key=v), recorder
)
PROBES += probes_for(
    "Recorder.enqueue", "item", BAD_ITEMS, lambda e, v: rec(e).enqueue(v), recorder
)
PROBES += probes_for(
    "Recorder.enqueue",
    "fence",
    [-1, 10**400, "7"],
    lambda e, v: rec(e).enqueue(Demotion("c", (DemotedMessage("user", "hi", 0, "k"),), v)),
    recorder,
)
PROBES += probes_for(
    "Recorder.erase", "conversation_id", BAD_IDS, lambda e, v: rec(e).erase(v), recorder
)
PROBES += probes_for(
    "Recorder.aerase",
    "conversation_id",
    BAD_IDS,
    lambda e, v: asyncio.run(rec(e).aerase(v)),
    recorder,
)
PROBES += probes_for("dedup_key", "key", BAD_KEYS, lambda e, v: dedup_key({"a": 1}, v))

# -- Recorder and AsyncRecorder constructors -----------------------------------------------

for cls in (Recorder, AsyncRecorder):
    name = cls.__name__
    PROBES += probes_for(name, "sink", [None, 3, "print"], lambda e, v, cls=cls: cls(v))
    PROBES += probes_for(
        name, "flush_timeout", BAD_NUMBERS, lambda e, v, cls=cls: cls(print, flush_timeout=v)
    )
    PROBES += probes_for(
        name, "outbox", ["outbox.db", 3, object()], lambda e, v, cls=cls: cls(print, outbox=v)
    )
    PROBES += probes_for(
        name, "max_queued", BAD_COUNTS, lambda e, v, cls=cls: cls(print, max_queued=v)
    )


# -- odd items: stored as the outbox can hold them, delivered, nothing stuck ---------------


def _odd_item(item: Any, expected: Any) -> Probe:
    def run(env: Env) -> object:
        rec(env).enqueue(item)
        wait_for(lambda: len(env.objects["got"]) == 2)
        return env.objects["got"][1:], env.objects["outbox"].pending()

    def check(result: Any, env: Env) -> bool:
        got, pending = result
        return pending == 0 and got == [expected]

    return Probe(f"Recorder.enqueue(item={item!r:.24})", "item", run, True, check, recorder)


PROBES += [
    _odd_item(turn("c", "lone \ud800 surrogate"), turn("c", "lone \ud800 surrogate")),
    _odd_item("nul\x00inside", "nul\x00inside"),
    _odd_item({"k\udfff": ["\ud83d"]}, {"k\udfff": ["\ud83d"]}),
    _odd_item("x" * 10_000_000, "x" * 10_000_000),
]


def test_a_lone_surrogate_is_stored_as_storable_text(tmp_path: Path) -> None:
    """The outbox holds what storable_text makes of the item (the sink, live, the item)."""
    box = SQLiteOutbox(tmp_path / "o.db")
    release = threading.Event()
    r = Recorder(lambda item: release.wait(5), outbox=box)
    r.enqueue(turn("c", "lone \ud800"))
    payloads = [row.payload for row in box.load()]
    release.set()
    r.close()
    box.close()
    assert len(payloads) == 1 and storable_text("lone \ud800") in payloads[0]


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_capture_probe(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def test_the_catalogue_is_large() -> None:
    assert len(PROBES) >= 150
