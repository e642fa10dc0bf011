"""The catalogue, archive: SQLiteArchive's constructor, hook, recall and housekeeping.

Every probe is one public call with one hostile value (see tests/hostile/harness.py):
it succeeds with a right result, or raises a DemoteError naming the argument and leaves
every store file byte-for-byte as it was. Two conversations are stored before each call
probe, and a search of one never returns the other's text.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from demote import SQLiteArchive, SQLiteStateStore
from demote.records import DemotedMessage, Demotion, Recalled, fingerprint, make_key
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

#: What each stored conversation says: no word is shared between the two.
TEXTS = {
    "A": ["the garden has tomatoes", "we planted basil near the fence", "zebra crossing"],
    "B": ["my bicycle tyre burst", "the mechanic fixed the brakes", "giraffe spotted"],
}
#: Values that are not a search's ``k`` (``0`` finds nothing and is accepted).
BAD_K: list[object] = [v for v in BAD_COUNTS if v != 0] + [10**20]


def demotion(cid: object, texts: list[str], start: int = 0, fence: object = None) -> Demotion:
    messages = tuple(
        DemotedMessage("user", t, start + i, make_key(str(cid), start + i, fingerprint("user", t)))
        for i, t in enumerate(texts)
    )
    return Demotion(cid, messages, fence)  # type: ignore[arg-type]


def filled(env: Env) -> None:
    """An archive file with conversations A and B stored."""
    archive = SQLiteArchive(env.root / "archive.db")
    env.closers.append(archive.close)
    for cid, texts in TEXTS.items():
        archive.deliver(demotion(cid, texts))
    env.objects["archive"] = archive


def ar(env: Env) -> SQLiteArchive:
    archive: SQLiteArchive = env.objects["archive"]
    return archive


def only_a(result: Any, env: Env) -> bool:
    """A search of A: a list of A's stored messages, never B's."""
    return isinstance(result, list) and all(
        isinstance(r, Recalled) and r.text in TEXTS["A"] for r in result
    )


PROBES: list[Probe] = []

# -- constructor options -------------------------------------------------------------------


def opened(env: Env, **options: Any) -> SQLiteArchive:
    archive = SQLiteArchive(env.root / "new.db", **options)
    env.closers.append(archive.close)
    return archive


for option in ("context_weight", "adjacent_weight", "coverage", "neighbours", "speaker_weight"):
    PROBES += probes_for(
        "SQLiteArchive",
        option,
        [*BAD_NUMBERS, "0.4"],
        lambda env, v, option=option: opened(env, **{option: v}),
    )
for option, values in {
    "dense_weight": [*BAD_NUMBERS, 1.5],
    "pool": [*BAD_COUNTS, 10**20],
    "after": [v for v in BAD_COUNTS if v != 0] + [10**20],
    "timeout": [*BAD_NUMBERS, 0, 1e300],
    "fusion": ["max", None, 3, ["rrf"]],
    "on_model_change": ["ignore", None, 1],
    "counter": [3, None, "words", [1]],
    "stop_words": [3, "the", b"the", [1], [None]],
    "context": [3, "speaker", b"x"],
    "embeddings": [3, "model", object()],
}.items():
    PROBES += probes_for(
        "SQLiteArchive", option, values, lambda env, v, option=option: opened(env, **{option: v})
    )
PROBES += probes_for(
    "SQLiteArchive",
    "path",
    [None, 3, b"archive.db", "", "nul\x00inside.db", ["a.db"]],
    lambda env, v: SQLiteArchive(v),
)

# -- read-only: nothing is ever written --------------------------------------------------------


def read_only(env: Env) -> SQLiteArchive:
    archive = SQLiteArchive(env.root / "archive.db", read_only=True)
    env.closers.append(archive.close)
    return archive


PROBES += probes_for(
    "SQLiteArchive", "read_only", ["yes", 1, None], lambda env, v: opened(env, read_only=v)
)
for method, args in {
    "deliver": (demotion("A", ["late words"], 3),),
    "erase": ("A",),
    "delete": ("B",),
}.items():
    PROBES.append(
        Probe(
            f"SQLiteArchive(read_only=True).{method}",
            "read-only",
            lambda env, method=method, args=args: getattr(read_only(env), method)(*args),
            setup=filled,
        )
    )
PROBES.append(
    Probe("SQLiteArchive(read_only=True, path=missing)", "archive", lambda env: read_only(env))
)
PROBES.append(
    Probe(
        "SQLiteArchive(read_only=True).search",
        "query",
        lambda env: (read_only(env).search("A", "garden basil"), read_only(env).count()),
        True,
        lambda r, env: only_a(r[0], env) and len(r[0]) >= 2 and r[1] == 6,
        filled,
    )
)

# -- a file of another kind ------------------------------------------------------------------


def foreign(kind: str) -> Any:
    def make(env: Env) -> None:
        path = env.root / "archive.db"
        if kind == "state":
            SQLiteStateStore(path).close()
        elif kind == "outbox":
            from demote import SQLiteOutbox

            SQLiteOutbox(path).close()
        elif kind == "program":  # another program's database, rollback journal
            db = sqlite3.connect(path)
            db.execute("CREATE TABLE users (name TEXT)")
            db.execute("INSERT INTO users VALUES ('ann')")
            db.commit()
            db.close()
        elif kind == "truncated":
            with SQLiteArchive(path) as archive:
                archive.deliver(demotion("A", TEXTS["A"] * 200))
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 3])
        elif kind == "corrupt":
            path.write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
        elif kind == "text":
            path.write_text("not a database at all\n" * 100)
        elif kind == "directory":
            path.mkdir()

    return make


def open_and_use(env: Env) -> object:
    with SQLiteArchive(env.root / "archive.db") as archive:
        return archive.search("A", "garden"), archive.count()


for kind in ("state", "outbox", "program", "truncated", "corrupt", "text", "directory"):
    PROBES.append(
        Probe(f"SQLiteArchive(path={kind} file)", "archive", open_and_use, setup=foreign(kind))
    )

# -- recall --------------------------------------------------------------------------------


def search(env: Env, cid: object = "A", query: object = "garden", **kw: Any) -> object:
    return ar(env).search(cid, query, **kw)  # type: ignore[arg-type]


def asearch(env: Env, cid: object = "A", query: object = "garden", **kw: Any) -> object:
    return asyncio.run(ar(env).asearch(cid, query, **kw))  # type: ignore[arg-type]


for name, call in (("search", search), ("asearch", asearch)):
    PROBES += probes_for(
        f"SQLiteArchive.{name}", "query", BAD_TEXT, lambda env, v, c=call: c(env, query=v), filled
    )
    PROBES += probes_for(
        f"SQLiteArchive.{name}", "k", BAD_K, lambda env, v, c=call: c(env, k=v), filled
    )
    PROBES += probes_for(
        f"SQLiteArchive.{name}",
        "budget_tokens",
        [float("nan"), -1, "5", 2.5, True, 10**20, [1]],
        lambda env, v, c=call: c(env, budget_tokens=v),
        filled,
    )
    PROBES += probes_for(
        f"SQLiteArchive.{name}",
        "conversation_id",
        BAD_IDS,
        lambda env, v, c=call: c(env, v),
        filled,
    )
    hostile_queries = [
        *ODD_TEXT,
        "garden" + " x" * 5_000_000,  # 10 MB
        "giraffe bicycle",  # B's words: nothing from A
        '"garden" OR scope:*',
        "garden) OR (giraffe",
        "text:giraffe",
        "*",
    ]
    PROBES += [
        Probe(
            f"SQLiteArchive.{name}(query={show(q)})",
            "query",
            lambda env, q=q, c=call: c(env, query=q),
            True,
            only_a,
            filled,
        )
        for q in hostile_queries
    ]
    PROBES += [
        Probe(
            f"SQLiteArchive.{name}(k={show(k)}, budget_tokens={show(b)})",
            "k",
            lambda env, k=k, b=b, c=call: c(env, query="garden basil", k=k, budget_tokens=b),
            True,
            lambda r, env, n=n: only_a(r, env) and n[0] <= len(r) <= n[1],
            filled,
        )
        # (k, budget, (fewest, most) hits): both matching messages, or their neighbour too
        for k, b, n in (
            (0, None, (0, 0)),
            (1, None, (1, 1)),
            (2**31 - 1, None, (2, 3)),
            (5, 0, (0, 0)),
            (5, 2**31 - 1, (2, 3)),
        )
    ]

# -- hook, reading and housekeeping ----------------------------------------------------------

for method in ("count", "messages", "erase", "delete"):
    PROBES += probes_for(
        f"SQLiteArchive.{method}",
        "conversation_id",
        [v for v in BAD_IDS if v is not None or method != "count"],
        lambda env, v, method=method: getattr(ar(env), method)(v),
        filled,
    )
PROBES += probes_for(
    "SQLiteArchive.aerase",
    "conversation_id",
    BAD_IDS,
    lambda env, v: asyncio.run(ar(env).aerase(v)),
    filled,
)
PROBES += probes_for(
    "SQLiteArchive.has_keys",
    "conversation_id",
    BAD_IDS,
    lambda env, v: ar(env).has_keys(v, ["k"]),
    filled,
)
PROBES += probes_for(
    "SQLiteArchive.has_keys",
    "keys",
    [None, 3, "abc", b"ab", [1], [None], [b"k"], object()],
    lambda env, v: ar(env).has_keys("A", v),
    filled,
)
BAD_FENCES: list[object] = ["x", float("nan"), -1, 2.5, True, 2**64, b"1"]
PROBES += probes_for(
    "SQLiteArchive.erase", "fence", BAD_FENCES, lambda env, v: ar(env).erase("A", fence=v), filled
)
PROBES += probes_for(
    "SQLiteArchive.deliver",
    "fence",
    BAD_FENCES,
    lambda env, v: ar(env).deliver(demotion("A", ["new words"], 3, v)),
    filled,
)
PROBES += probes_for(
    "SQLiteArchive.deliver",
    "batch",
    [None, "batch", 3, {"conversation_id": "A"}, [demotion("A", ["x"])]],
    lambda env, v: ar(env).deliver(v),
    filled,
)
PROBES += probes_for(
    "SQLiteArchive.deliver",
    "conversation_id",
    BAD_IDS,
    lambda env, v: ar(env).deliver(demotion(v, ["hello"])),  # type: ignore[arg-type]
    filled,
)


def closed(env: Env) -> None:
    filled(env)
    ar(env).close()


for method, args in {
    "search": ("A", "garden"),
    "count": (),
    "messages": ("A",),
    "has_keys": ("A", ["k"]),
    "erase": ("A",),
    "conversations": (),
    "deliver": (demotion("A", ["late"], 3),),
}.items():
    PROBES.append(
        Probe(
            f"SQLiteArchive.{method}(after close)",
            "closed",
            lambda env, method=method, args=args: getattr(ar(env), method)(*args),
            setup=closed,
        )
    )

# -- odd ids and text round-trip, never across conversations ---------------------------------


def _odd_id(cid: str) -> Probe:
    def run(env: Env) -> object:
        archive = ar(env)
        archive.deliver(demotion(cid, ["okapi sighting today", "the garden again"]))
        return (
            archive.search(cid, "okapi garden"),
            archive.search("A", "okapi"),
            archive.search("B", "okapi garden"),
            archive.count(cid),
            archive.has_keys(cid, [make_key(cid, 0, fingerprint("user", "okapi sighting today"))]),
        )

    def check(result: Any, env: Env) -> bool:
        own, in_a, in_b, n, keys = result
        return (
            {r.text for r in own} == {"okapi sighting today", "the garden again"}
            and in_a == in_b == []
            and n == 2
            and len(keys) == 1
            and ar(env).erase(cid) == 2
            and ar(env).count() == 6
        )

    return Probe(
        f"SQLiteArchive(conversation_id={show(cid)})", "conversation_id", run, True, check, filled
    )


def _odd_text(text: str) -> Probe:
    def run(env: Env) -> object:
        ar(env).deliver(demotion("A", [text], 3))
        return ar(env).messages("A"), ar(env).search("B", text or "x")

    def check(result: Any, env: Env) -> bool:
        stored, in_b = result
        from demote.records import storable_text

        return stored[-1].text == storable_text(text) and only_b(in_b)

    return Probe(f"SQLiteArchive.deliver(text={show(text)})", "text", run, True, check, filled)


def only_b(result: list[Recalled]) -> bool:
    return all(r.text in TEXTS["B"] for r in result)


PROBES += [_odd_id(cid) for cid in ODD_IDS]
PROBES += [_odd_text(text) for text in ODD_TEXT]


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_archive_probe(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def test_the_catalogue_is_large() -> None:
    assert len(PROBES) >= 300
    assert len({p.name for p in PROBES}) == len(PROBES)
