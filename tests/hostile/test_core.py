"""The catalogue, core: the engine, policies, retry options, state stores, simple hooks.

Every probe is one public call with one hostile value (see tests/hostile/harness.py):
it succeeds with a right result, or raises a DemoteError naming the argument and leaves
every store file byte-for-byte as it was.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from demote import (
    Backoff,
    Bulk,
    CallbackHook,
    Compact,
    ConversationState,
    Demoter,
    FanOutHook,
    SlidingWindow,
    SQLiteArchive,
    SQLiteStateStore,
    TemplateSummarizer,
)
from demote.records import storable_text
from tests.hostile.harness import (
    BAD_COUNTS,
    BAD_IDS,
    BAD_NUMBERS,
    BAD_TEXT,
    ODD_IDS,
    ODD_TEXT,
    Env,
    Probe,
    check,
    probes_for,
    show,
)
from tests.strategies import Msg, unique

POLICY = SlidingWindow.last_messages(2)


def chat(n: int, tag: str = "") -> list[Msg]:
    return unique([Msg(("user", "assistant")[i % 2], f"message {i}") for i in range(n)], tag)


def engine(env: Env) -> None:
    """A durable engine with one conversation already demoted into the archive."""
    state = SQLiteStateStore(env.root / "state.db")
    archive = SQLiteArchive(env.root / "archive.db")
    d = Demoter(POLICY, archive, state=state)
    d.load("other", chat(8, "other"), describe(d))
    env.objects.update(state=state, archive=archive, demoter=d)
    env.closers += [state.close, archive.close, d.close]


def describe(d: Demoter) -> Any:
    return lambda m: d.describe(m.role, m.text, opens=m.opens, answers=m.answers)


def demoter(env: Env) -> Demoter:
    d: Demoter = env.objects["demoter"]
    return d


PROBES: list[Probe] = []

# -- Demoter options ---------------------------------------------------------------------

for option, values in {
    "lease_ttl": [*BAD_NUMBERS, 0],
    "hook_timeout": [v for v in BAD_NUMBERS if v is not None] + [0],
    "cached_conversations": BAD_COUNTS,
    "max_batch": BAD_COUNTS,
    "hook_threads": BAD_COUNTS,
    "retry": [5, "1s", (1, 2)],
    "on_hook_error": ["ignore", None, 1],
    "state": [object(), "state.db", 3],
    "summarizer": [object(), "model"],
}.items():
    PROBES += probes_for(
        "Demoter", option, values, lambda env, v, option=option: Demoter(POLICY, **{option: v})
    )
PROBES += probes_for("Demoter", "policy", [None, "last 4", {"unit": "messages"}], Demoter)
PROBES += probes_for("Demoter", "hook", [object(), "archive", 3], lambda env, v: Demoter(POLICY, v))

# -- Demoter calls on a durable engine ---------------------------------------------------

PROBES += probes_for(
    "Demoter.load",
    "conversation_id",
    BAD_IDS,
    lambda env, v: demoter(env).load(v, chat(6), describe(demoter(env))),
    setup=engine,
)
PROBES += probes_for(
    "Demoter.aload",
    "conversation_id",
    BAD_IDS,
    lambda env, v: asyncio.run(demoter(env).aload(v, chat(6), describe(demoter(env)))),
    setup=engine,
)
for method in ("clear", "forget", "erase", "state_of", "conversation_stats"):
    PROBES += probes_for(
        f"Demoter.{method}",
        "conversation_id",
        BAD_IDS,
        lambda env, v, method=method: getattr(demoter(env), method)(v),
        setup=engine,
    )
PROBES += probes_for(
    "Demoter.load",
    "messages",
    [None, "hello", b"hi", 3, (m for m in chat(4)), {"a": 1}],
    lambda env, v: demoter(env).load("c", v, describe(demoter(env))),
    setup=engine,
)
PROBES += probes_for(
    "Demoter.load",
    "describe",
    [None, "describe", 3],
    lambda env, v: demoter(env).load("c", chat(4), v),
    setup=engine,
)
PROBES += probes_for(
    "Demoter.describe", "text", BAD_TEXT, lambda env, v: Demoter(POLICY).describe("user", v)
)
PROBES += probes_for(
    "Demoter.describe",
    "role",
    [None, "robot", 3, ["user"], b"user"],
    lambda env, v: Demoter(POLICY).describe(v, "hi"),
)
PROBES += probes_for(
    "Demoter.describe",
    "opens",
    [[1], "call_1", 5, [None], [b"x"]],
    lambda env, v: Demoter(POLICY).describe("assistant", "hi", opens=v),
)
PROBES += probes_for(
    "Demoter.describe",
    "answers",
    [1, b"x", ["call"]],
    lambda env, v: Demoter(POLICY).describe("tool", "hi", answers=v),
)
PROBES += probes_for(
    "Demoter.seed",
    "state",
    [None, {"window_start": 3}, 3],
    lambda env, v: demoter(env).seed("other", v),
    setup=engine,
)
PROBES += probes_for(
    "Demoter.observe", "observer", [None, 3, "print"], lambda env, v: Demoter(POLICY).observe(v)
)


def _round_trip(cid: str) -> Probe:
    def run(env: Env) -> object:
        d = demoter(env)
        w = d.load(cid, chat(6, cid[:8]), describe(d))
        return (w, d.state_of(cid), d.state_of("other"), env.objects["archive"].count(cid))

    def check(result: Any, env: Env) -> bool:
        w, state, other, archived = result
        return (
            w.conversation_id == cid
            and state.window_start == 4
            and other.window_start == 6
            and archived == 4
            and sorted(os.listdir(env.root))
            == sorted(["state.db", "state.db-wal", "state.db-shm", *_archive_files(env)])
        )

    return Probe(
        f"Demoter.load(conversation_id={show(cid)})", "conversation_id", run, True, check, engine
    )


def _archive_files(env: Env) -> list[str]:
    return [n for n in os.listdir(env.root) if n.startswith("archive.db")]


PROBES += [_round_trip(cid) for cid in ODD_IDS]


def _odd_text(text: str) -> Probe:
    def run(env: Env) -> object:
        d = demoter(env)
        history = [Msg("user", text), Msg("assistant", "ok"), *chat(4, "odd")]
        w = d.load("odd", history, describe(d))
        return w, env.objects["archive"].messages("odd")

    def check(result: Any, env: Env) -> bool:
        w, stored = result
        # Stored as UTF-8 can hold it (a lone surrogate becomes U+FFFD), nothing pending.
        return (w.start, w.pending, len(stored)) == (4, 0, 4) and stored[0].text == (
            storable_text(text)
        )

    return Probe(f"Demoter.load(text={show(text)})", "text", run, True, check, engine)


PROBES += [_odd_text(t) for t in ODD_TEXT]

# -- policies, retry, summarizer ------------------------------------------------------------

for factory in ("last_messages", "last_turns", "last_tokens"):
    PROBES += probes_for(
        f"SlidingWindow.{factory}",
        "limit",
        BAD_COUNTS,
        lambda env, v, factory=factory: getattr(SlidingWindow, factory)(v),
    )
PROBES += probes_for(
    "Bulk", "overflow", [v for v in BAD_COUNTS if v != 0], lambda env, v: Bulk(overflow=v)
)
PROBES += probes_for(
    "Compact", "compact_count", BAD_COUNTS, lambda env, v: Compact(compact_count=v)
)
PROBES += probes_for(
    "SlidingWindow.from_json",
    "SlidingWindow",
    ["", "{", "[]", '{"unit": "moons", "limit": 3}', '{"unit": "messages", "limit": -1}', "null"],
    lambda env, v: SlidingWindow.from_json(v),
)
PROBES += probes_for("Backoff", "initial", BAD_NUMBERS, lambda env, v: Backoff(initial=v))
PROBES += probes_for("Backoff", "maximum", BAD_NUMBERS, lambda env, v: Backoff(maximum=v))
PROBES += probes_for(
    "TemplateSummarizer",
    "max_summary_tokens",
    BAD_COUNTS,
    lambda env, v: TemplateSummarizer(max_summary_tokens=v),
)
PROBES += probes_for("CallbackHook", "fn", [None, 3, "print"], lambda env, v: CallbackHook(v))
PROBES += probes_for("FanOutHook", "hook", [None, 3, "archive"], lambda env, v: FanOutHook(v))

# -- state stores --------------------------------------------------------------------------


def _foreign(kind: str) -> Any:
    def make(env: Env) -> Path:
        path = env.root / "state.db"
        if kind == "archive":
            SQLiteArchive(path).close()
        elif kind == "outbox":
            from demote import SQLiteOutbox

            SQLiteOutbox(path).close()
        elif kind == "corrupt":
            path.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
        elif kind == "text":
            path.write_text("not a database at all\n" * 100)
        elif kind == "directory":
            path.mkdir()
        return path

    return make


for kind in ("archive", "outbox", "corrupt", "text", "directory"):
    PROBES.append(
        Probe(
            f"SQLiteStateStore(path={kind} file)",
            "state",
            lambda env: SQLiteStateStore(env.root / "state.db"),
            setup=_foreign(kind),
        )
    )
PROBES += probes_for(
    "SQLiteStateStore",
    "timeout",
    BAD_NUMBERS,
    lambda env, v: SQLiteStateStore(env.root / "s.db", timeout=v),
)
PROBES += probes_for(
    "SQLiteStateStore.compare_and_set",
    "state",
    [None, {"window_start": 3}, "state"],
    lambda env, v: env.objects["state"].compare_and_set("other", None, v),
    setup=engine,
)
PROBES += probes_for(
    "SQLiteStateStore.get",
    "conversation_id",
    BAD_IDS,
    lambda env, v: env.objects["state"].get(v),
    setup=engine,
)


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_core_probe(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def test_the_catalogue_is_large() -> None:
    assert len(PROBES) >= 250
    assert ConversationState() == ConversationState()
