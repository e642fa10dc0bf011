"""The catalogue, PostgresArchive: the SQLite archive's argument rules on PostgreSQL.

Constructor probes need no server: every bad option is refused before a connection is
tried (the URL points at a closed port, so a probe that reached it would fail with an
untyped or unnamed error). Call probes need ``DEMOTE_TEST_POSTGRES_URL`` and are skipped,
with that reason, without it; "unchanged" is the archive's rows before and after.
"""

from __future__ import annotations

import asyncio
import math
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from demote import PostgresArchive
from tests.demote.archive.pg import drop_archive
from tests.hostile.harness import (
    BAD_COUNTS,
    BAD_IDS,
    BAD_NUMBERS,
    BAD_TEXT,
    Env,
    Probe,
    check,
    judge,
    probes_for,
)
from tests.hostile.test_archive import BAD_K, TEXTS, demotion

NOWHERE = "postgresql://demote@127.0.0.1:1/nowhere?connect_timeout=1"
OFFLINE: list[Probe] = []


def offline(**options: Any) -> PostgresArchive:
    return PostgresArchive(NOWHERE, **options)


OFFLINE += probes_for(
    "PostgresArchive",
    "table",
    [
        None,
        3,
        "",
        "x; DROP TABLE y",
        "Robert'); --",
        "UPPER",
        "with space",
        "t\x00",
        "é",
        "a" * 100,
    ],
    lambda env, v: offline(table=v),
)
for option in ("context_weight", "adjacent_weight", "coverage", "neighbours", "speaker_weight"):
    OFFLINE += probes_for(
        "PostgresArchive",
        option,
        [*BAD_NUMBERS, "0.4"],
        lambda env, v, option=option: offline(**{option: v}),
    )
for option, values in {
    "candidates": [*BAD_COUNTS, 10**20],
    "after": [v for v in BAD_COUNTS if v != 0],
    "dense_weight": [math.nan, -0.1, 1.5, "0.2"],
    "timeout": BAD_NUMBERS,
    "connect_timeout": BAD_NUMBERS,
    "statement_timeout": BAD_NUMBERS,
    "min_size": [v for v in BAD_COUNTS if v != 0] + [10**20],
    "max_size": [*BAD_COUNTS, 10**20],
    "keepalives_idle": [*BAD_COUNTS, 10**20],
    "fusion": ["max", None],
    "vectors": ["faiss", None, 3],
    "on_model_change": ["ignore", None],
    "counter": [3, "words"],
    "stop_words": [3, "the"],
    "context": [3, "speaker"],
    "read_only": ["yes", None],
    "application_name": [None, 3, "x" * 1000, "nul\x00"],
}.items():
    OFFLINE += probes_for(
        "PostgresArchive", option, values, lambda env, v, option=option: offline(**{option: v})
    )
OFFLINE += probes_for(
    "PostgresArchive", "dsn", [3, b"postgresql://x", ["a"]], lambda env, v: PostgresArchive(v)
)


@pytest.mark.parametrize("probe", OFFLINE, ids=lambda p: p.name)
def test_postgres_archive_option_probe(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


# -- calls on a live archive ------------------------------------------------------------------

ONLINE: list[Probe] = []


def pg(env: Env) -> PostgresArchive:
    found: PostgresArchive = env.objects["archive"]
    return found


for name, call in (
    (
        "search",
        lambda env, **kw: pg(env).search(**{"conversation_id": "A", "query": "garden", **kw}),
    ),
    (
        "asearch",
        lambda env, **kw: asyncio.run(
            pg(env).asearch(**{"conversation_id": "A", "query": "garden", **kw})
        ),
    ),
):
    ONLINE += probes_for(
        f"PostgresArchive.{name}", "query", BAD_TEXT, lambda env, v, c=call: c(env, query=v)
    )
    ONLINE += probes_for(f"PostgresArchive.{name}", "k", BAD_K, lambda env, v, c=call: c(env, k=v))
    ONLINE += probes_for(
        f"PostgresArchive.{name}",
        "budget_tokens",
        [math.nan, -1, "5", 2.5, 10**20],
        lambda env, v, c=call: c(env, budget_tokens=v),
    )
    ONLINE += probes_for(
        f"PostgresArchive.{name}",
        "conversation_id",
        BAD_IDS,
        lambda env, v, c=call: c(env, conversation_id=v),
    )
    ONLINE += [
        Probe(
            f"PostgresArchive.{name}(query={q!r:.20})",
            "query",
            lambda env, q=q, c=call: c(env, query=q),
            True,
            lambda r, env: all(h.text in TEXTS["A"] for h in r),
        )
        for q in [
            "",
            "giraffe bicycle",
            "lone \ud800 garden",
            "nul\x00 garden",
            "garden & !basil | (",
            "'; DROP TABLE x; --",
            "x" * 1_000_000,
        ]
    ]
ONLINE += probes_for(
    "PostgresArchive.has_keys",
    "keys",
    [None, 3, "abc", [1]],
    lambda env, v: pg(env).has_keys("A", v),
)
ONLINE += probes_for(
    "PostgresArchive.erase",
    "fence",
    ["x", math.nan, -1, 2.5, 2**64],
    lambda env, v: pg(env).erase("A", fence=v),
)
ONLINE += probes_for(
    "PostgresArchive.deliver", "batch", [None, "batch", 3], lambda env, v: pg(env).deliver(v)
)
ONLINE += probes_for(
    "PostgresArchive.deliver",
    "fence",
    ["x", math.nan, -1],
    lambda env, v: pg(env).deliver(demotion("A", ["new"], 9, v)),
)
for method in ("count", "messages", "erase", "has_keys"):
    ONLINE += probes_for(
        f"PostgresArchive.{method}",
        "conversation_id",
        [v for v in BAD_IDS if v is not None or method != "count"],
        lambda env, v, method=method: getattr(pg(env), method)(
            *((v, ["k"]) if method == "has_keys" else (v,))
        ),
    )


@pytest.fixture(scope="module")
def live() -> Any:
    url = os.environ.get("DEMOTE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("DEMOTE_TEST_POSTGRES_URL not set: these probes need a running PostgreSQL")
    table = f"h_{uuid.uuid4().hex[:12]}"
    archive = PostgresArchive(url, table=table)
    for cid, texts in TEXTS.items():
        archive.deliver(demotion(cid, texts))
    yield archive
    archive.close()
    drop_archive(url, table)


@pytest.mark.parametrize("probe", ONLINE, ids=lambda p: p.name)
def test_postgres_archive_call_probe(probe: Probe, tmp_path: Path, live: PostgresArchive) -> None:
    env = Env(tmp_path, objects={"archive": live})
    before = [live.messages(cid) for cid in TEXTS]
    outcome = judge(probe, env)
    assert outcome.ok, f"{probe.name}: {outcome.why}"
    if probe.accept is not True:
        assert [live.messages(cid) for cid in TEXTS] == before


def test_the_catalogue_is_large() -> None:
    assert len(OFFLINE) >= 150 and len(ONLINE) >= 100
    assert len({p.name for p in OFFLINE + ONLINE}) == len(OFFLINE) + len(ONLINE)
