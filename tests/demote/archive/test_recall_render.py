"""demote.archive.render: what a recall tool answers the model, and the one flow behind it."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from demote.archive.recall_tool import NO_CONVERSATION, RecallOptions, answer, tool_options
from demote.archive.render import (
    CUT_MARK,
    cut_to_tokens,
    hit_body,
    hit_header,
    recalled_from_columns,
    render_fetched,
    render_hits,
    snippet,
)
from demote.archive.sqlite import SQLiteArchive
from demote.backends.flow import drive_async, drive_sync
from demote.errors import ArgumentTypeError, ConfigError, ConversationIdError, StoreError
from demote.records import DemotedMessage, Demotion, Recalled
from demote.window.tokens import approximate_tokens

NOON = datetime(2026, 12, 1, 12, 35, tzinfo=UTC).timestamp()


def words(text: str) -> int:
    """A counter unlike the approximate one: one token per word (and per newline)."""
    return len(text.split()) + text.count("\n")


def hit(index: int, text: str, role: str = "user", **kwargs: Any) -> Recalled:
    return Recalled(role=role, text=text, index=index, key=f"key{index:02d}", **kwargs)


# -- one hit -------------------------------------------------------------------------------


def test_a_hit_shows_its_role_and_archive_time() -> None:
    assert hit_header(hit(0, "hi", at=NOON)) == "[user, 2026-12-01 12:35]"
    assert hit_header(hit(0, "hi")) == "[user]"
    assert hit_header(hit(0, "hi", at=float("nan"))) == "[user]"
    assert hit_header(hit(0, "hi", at=1e300)) == "[user]"  # beyond any date: no time


def test_tool_calls_and_results_read_as_name_arguments_and_result() -> None:
    call = hit(
        3,
        "Checking the config.",
        role="assistant",
        data={
            "role": "assistant",
            "text": "Checking the config.",
            "tool_calls": [
                {"id": "c1", "name": "read_file", "args": {"path": "deploy/staging.yaml"}},
                {"id": "c2", "name": "grep", "args": {"pattern": "tóken", "n": 3}},
            ],
        },
    )
    assert hit_body(call) == (
        'Checking the config. read_file({"path":"deploy/staging.yaml"}) '
        'grep({"pattern":"tóken","n":3})'
    )
    result = hit(
        4,
        "token: ALPHA",
        role="tool",
        data={"role": "tool", "text": "token: ALPHA", "tool": "read_file", "tool_call_id": "c1"},
    )
    assert hit_body(result) == "read_file → token: ALPHA"
    image = hit(5, "", data={"role": "user", "text": "", "blocks": [{"type": "image"}]})
    assert hit_body(image) == "[image]"
    # A text-only row (no data): its text, whatever the role.
    assert hit_body(hit(6, "plain result", role="tool")) == "plain result"
    assert hit_body(hit(7, "", role="assistant")) == "(empty)"


def test_a_malformed_data_object_degrades_to_the_text() -> None:
    odd = hit(1, "the text", data={"tool_calls": "not a list", "blocks": 7, "text": 3})
    assert hit_body(odd) == "the text"


# -- a search answer -----------------------------------------------------------------------


def test_hits_are_chosen_best_first_and_shown_in_conversation_order() -> None:
    hits = [hit(9, "best, newest"), hit(2, "second, oldest"), hit(5, "third")]
    text = render_hits(hits, 200)
    assert text is not None
    lines = text.splitlines()
    assert lines[0].startswith("Archived messages of this conversation")
    assert lines[1:] == ["[user] second, oldest", "[user] third", "[user] best, newest"]


def test_a_long_best_hit_is_cut_and_names_its_key_shorter_ones_still_come() -> None:
    long = hit(1, "deploy token ALPHA-7781 " + "filler " * 400, role="tool")
    short = hit(2, "a short one")
    text = render_hits([long, short], 120)
    assert text is not None
    assert approximate_tokens(text) <= 120
    assert "ALPHA-7781" in text
    assert CUT_MARK.format(key="key01") in text
    # The budget left after the cut hit decides whether the short one fits; here the cut
    # took what was left, so the worst-ranked hit is the one left out.
    assert render_hits([short, long], 120) is not None
    assert "[user] a short one" in (render_hits([short, long], 120) or "")


def test_no_hits_or_nothing_fitting_gives_none() -> None:
    assert render_hits([], 500) is None
    assert render_hits([hit(1, "x" * 4000)], 20) is None  # not even a cut head fits


texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=600)


@settings(max_examples=150, deadline=None)
@given(
    bodies=st.lists(texts, max_size=8),
    budget=st.integers(min_value=48, max_value=1500),
    counter=st.sampled_from([approximate_tokens, words]),
    query=st.sampled_from(["", "token config", "zebra"]),
)
def test_a_search_answer_never_exceeds_its_budget(
    bodies: list[str], budget: int, counter: Any, query: str
) -> None:
    hits = [hit(i, b + "\nconfig token line" * (i % 3), at=NOON + i) for i, b in enumerate(bodies)]
    text = render_hits(hits, budget, counter, query)
    if text is not None:
        assert counter(text) <= budget
        assert text.count("\n[user") >= 1


def settings_file(service: str, value: int) -> str:
    lines = [f"# settings of the {service} service"]
    lines += [f"filler_{j} = {j}" for j in range(200)]
    lines.insert(150, f"max_connections = {value}")
    return "\n".join(lines)


def test_a_long_hit_is_shown_by_the_lines_that_match_the_query() -> None:
    target = hit(7, settings_file("billing", 512), role="tool")
    headed = render_hits([target], 200)
    focused = render_hits([target], 200, query="billing max connections")
    assert headed is not None and focused is not None
    assert "max_connections = 512" not in headed  # line 150 is past the head
    assert "max_connections = 512" in focused
    assert "[tool] # settings of the billing service\n…\nmax_connections = 512" in focused
    assert focused.endswith(CUT_MARK.format(key="key07"))
    assert approximate_tokens(focused) <= 200


def test_several_long_hits_each_get_their_share_of_the_budget() -> None:
    hits = [hit(i, settings_file(s, 100 + i), role="tool") for i, s in enumerate("abcd")]
    text = render_hits(hits, 400, query="max connections")
    assert text is not None and approximate_tokens(text) <= 400
    for i in range(3):  # SHARE hits at least, each with its matching line
        assert f"max_connections = {100 + i}" in text
    # Without the query, the best hit's head takes the whole budget.
    assert (render_hits(hits, 400) or "").count("[tool]") == 1


def test_a_snippet_falls_back_to_the_head() -> None:
    one_line = "word " * 400
    assert snippet(one_line, "word", 50, approximate_tokens, " [cut]").endswith("word [cut]")
    no_match = "alpha\nbeta\n" * 100
    assert snippet(no_match, "zebra", 20, approximate_tokens, " [cut]").startswith("alpha\nbeta")


def test_cut_to_tokens_finds_the_longest_head_that_fits() -> None:
    text = "abcd" * 100
    cut = cut_to_tokens(text, 10, approximate_tokens, "…")
    assert approximate_tokens(cut) <= 10 and cut.endswith("…")
    assert approximate_tokens(text[: len(cut)] + "xxxx") > 10  # one more char would not fit
    assert cut_to_tokens("short", 10, approximate_tokens, "…") == "short"
    assert cut_to_tokens(text, 1, approximate_tokens, "a long suffix") == ""


def test_a_fetched_message_is_whole_or_cut_and_says_how_long_it_was() -> None:
    message = hit(4, "line\n" * 1000, role="tool")
    whole = render_fetched(message, 5000)
    assert whole == "[tool] " + "line\n" * 1000
    cut = render_fetched(message, 100)
    assert approximate_tokens(cut) <= 100
    assert "the message is 1252 tokens; read on with start=" in cut


def test_a_long_fetched_message_is_read_on_page_by_page() -> None:
    body = "".join(f"row {i}: value {i * 7}\n" for i in range(400))
    message = hit(4, body, role="user")
    read, start, pages = "", 0, 0
    while pages < 100:  # bounded: each page moves on
        pages += 1
        page = render_fetched(message, 120, start=start)
        assert approximate_tokens(page) <= 120
        shown = re.sub(r"^\[user\](?: …\(from character \d+ of \d+\))? ", "", page)
        assert shown != page and (start == 0) == ("from character" not in page)
        more = re.search(r" …\[cut: the message is \d+ tokens; read on with start=(\d+)\]$", shown)
        read += shown[: more.start() if more else None]
        if more is None:
            break
        assert int(more.group(1)) > start
        start = int(more.group(1))
    assert pages > 3 and read == body  # every character, once, in order
    assert render_fetched(message, 120, start=len(body)).endswith(
        f"(the message has {len(body)} characters: nothing from {len(body)} on)"
    )


# -- rows read back ------------------------------------------------------------------------


def test_rows_with_and_without_the_whole_message_are_read() -> None:
    data = {"role": "tool", "text": "r", "tool": "grep"}
    base = {"idx": 3, "role": "tool", "text": "r", "key": "k"}
    assert recalled_from_columns({**base, "data": json.dumps(data), "at": NOON}).data == data
    assert recalled_from_columns({**base, "data": data}).data == data
    assert recalled_from_columns({**base, "data": "{not json"}).data is None
    assert recalled_from_columns({**base, "data": "[1, 2]"}).data is None
    assert recalled_from_columns(base) == Recalled("tool", "r", 3, "k")
    assert recalled_from_columns({**base, "at": "2026-12-01T12:35:00+00:00"}).at == NOON
    assert recalled_from_columns({**base, "at": "yesterday"}).at is None
    assert recalled_from_columns({**base, "at": True}).at is None


# -- options -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"k": 0}, "k"),
        ({"k": 5, "max_k": 4}, "max_k"),
        ({"budget_tokens": 10}, "budget_tokens"),
        ({"fetch_budget_tokens": True}, "fetch_budget_tokens"),
        ({"max_budget_tokens": 100}, "max_budget_tokens"),
        ({"counter": "approx"}, "counter"),
    ],
)
def test_bad_options_are_refused_by_name(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=f"^{named}:"):
        RecallOptions(**kwargs)


def test_tool_options_need_an_archive_that_searches_and_fetches() -> None:
    class SearchOnly:
        def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
            return []

    bounds = {
        "k": 5,
        "max_k": 20,
        "budget_tokens": 500,
        "max_budget_tokens": 4000,
        "fetch_budget_tokens": 2000,
        "counter": "approx",
    }
    with pytest.raises(ConfigError, match=r"^archive: .* has no fetch\(\)"):
        tool_options(SearchOnly(), "recall", **bounds)
    with pytest.raises(ConfigError, match=r"^name:"):
        tool_options(FakeArchive(), "", **bounds)
    with pytest.raises(ConfigError, match=r"^counter:"):
        tool_options(FakeArchive(), "recall", **{**bounds, "counter": "no-such-counter"})
    assert tool_options(FakeArchive(), "recall", **bounds).snippets
    assert not tool_options(FakeArchive(), "recall", **bounds, snippets=False).snippets


def test_without_snippets_a_long_hit_is_shown_by_its_head() -> None:
    long = hit(3, settings_file("billing", 512), role="tool")
    archive = FakeArchive(hits=[long])
    with_snippets = run(archive, "a", query="max connections", budget_tokens=100)
    heads = drive_sync(
        answer(
            archive, "a", RecallOptions(snippets=False), query="max connections", budget_tokens=100
        )
    )
    assert "max_connections = 512" in with_snippets
    assert "max_connections = 512" not in heads and "filler_0 = 0" in heads


# -- the flow ------------------------------------------------------------------------------


@dataclass
class FakeArchive:
    """Records what it was asked; answers from ``hits`` / ``stored``; fails when told."""

    hits: list[Recalled] = field(default_factory=list)
    stored: dict[tuple[str, str], Recalled] = field(default_factory=dict)
    fail: bool = False
    asked: list[tuple[Any, ...]] = field(default_factory=list)

    def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
        self.asked.append(("search", conversation_id, query, k))
        if self.fail:
            raise StoreError("cannot search the archive: disk I/O error")
        return self.hits[:k]

    async def asearch(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
        self.asked.append(("asearch", conversation_id, query, k))
        return self.hits[:k]

    def fetch(self, conversation_id: str, key: str) -> Recalled | None:
        self.asked.append(("fetch", conversation_id, key))
        if self.fail:
            raise StoreError("cannot fetch an archived message: disk I/O error")
        return self.stored.get((conversation_id, key))


def run(archive: FakeArchive, cid: str | None, **kwargs: Any) -> str:
    return drive_sync(answer(archive, cid, RecallOptions(), **kwargs))


def test_a_key_fetches_from_the_bound_conversation_only() -> None:
    archive = FakeArchive(stored={("a", "k1"): hit(1, "mine", role="tool")})
    assert run(archive, "a", key=" k1 ", query="ignored") == "[tool] mine"
    assert run(archive, "b", key="k1") == "No archived message with key 'k1' in this conversation."
    assert archive.asked == [("fetch", "a", "k1"), ("fetch", "b", "k1")]


def test_a_query_searches_with_the_models_k_kept_in_bounds() -> None:
    archive = FakeArchive(hits=[hit(i, f"hit {i}") for i in range(30)])
    run(archive, "a", query="q")
    run(archive, "a", query="q", k=1000)
    run(archive, "a", query="q", k=-3)
    run(archive, "a", query="q", k="7")  # not an int: the default
    assert [a[3] for a in archive.asked] == [5, 20, 1, 5]


def test_the_models_budget_is_kept_in_bounds() -> None:
    archive = FakeArchive(hits=[hit(i, "word " * 300) for i in range(20)])
    huge = run(archive, "a", query="word", k=20, budget_tokens=10**9)
    assert approximate_tokens(huge) <= RecallOptions().max_budget_tokens
    tiny = run(archive, "a", query="word", budget_tokens=1)
    assert approximate_tokens(tiny) <= 48 and "[user]" in tiny


def test_what_the_flow_answers_without_a_conversation_query_or_working_archive() -> None:
    archive = FakeArchive(hits=[hit(0, "x")])
    assert run(archive, None, query="x") == NO_CONVERSATION
    assert archive.asked == []  # nothing is read without a conversation
    assert run(archive, "a").startswith("Give the recall tool a query")
    assert run(archive, "a", query="  ").startswith("Give the recall tool a query")
    assert run(FakeArchive(), "a", query="q" * 500).startswith(
        "No archived message of this conversation matches 'qqqq"
    )
    down = FakeArchive(fail=True)
    assert run(down, "a", query="x") == (
        "The archive could not be read just now (StoreError); "
        "continue without it or try again later."
    )
    assert run(down, "a", key="k").startswith("The archive could not be read just now")


def test_the_async_driver_awaits_the_archives_async_twin() -> None:
    archive = FakeArchive(hits=[hit(0, "found")])
    flow = answer(archive, "a", RecallOptions(), query="found")
    text = asyncio.run(drive_async(flow))
    assert text.endswith("[user] found")
    assert archive.asked == [("asearch", "a", "found", 5)]


# -- the archives' fetch ---------------------------------------------------------------------


def test_sqlite_fetch_is_scoped_and_reads_a_whole_message_column(tmp_path: Path) -> None:
    path = tmp_path / "archive.db"
    batch = Demotion("a", (DemotedMessage("tool", "the result", 4, "k-a"),))
    with SQLiteArchive(path) as archive:
        archive.deliver(batch)
        archive.deliver(Demotion("b", (DemotedMessage("tool", "b's result", 4, "k-b"),)))
        assert archive.fetch("a", "k-a") == Recalled("tool", "the result", 4, "k-a")
        assert archive.fetch("a", "k-b") is None and archive.fetch("b", "k-a") is None
        assert archive.fetch("a", "' OR 1=1 --") is None
        assert asyncio.run(archive.afetch("b", "k-b")) == Recalled("tool", "b's result", 4, "k-b")
        with pytest.raises(ArgumentTypeError, match=r"^key:"):
            archive.fetch("a", None)  # type: ignore[arg-type]
        with pytest.raises(ConversationIdError):
            archive.fetch("", "k-a")
    # A file whose rows keep the whole message (a later schema's columns) gives it back.
    data = {"role": "tool", "text": "the result", "tool": "read_file", "tool_call_id": "c1"}
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
        for name, kind in (("data", "TEXT"), ("at", "REAL")):
            if name not in columns:  # a schema that keeps them has them already
                db.execute(f"ALTER TABLE messages ADD COLUMN {name} {kind}")
        db.execute(
            "UPDATE messages SET data = ?, at = ? WHERE key = 'k-a'", (json.dumps(data), NOON)
        )
    with SQLiteArchive(path) as archive:
        found = archive.fetch("a", "k-a")
        assert found is not None and found.data == data and found.at == NOON
        assert render_fetched(found, 100) == "[tool, 2026-12-01 12:35] read_file → the result"


async def _afetch_then_close(archive: Any, conversation_id: str, key: str) -> Any:
    # The async pool belongs to this loop: close it on the loop before asyncio.run ends.
    try:
        return await archive.afetch(conversation_id, key)
    finally:
        await archive.aclose()


def test_postgres_fetch_is_scoped_and_reads_a_whole_message_column(postgres_url: str) -> None:
    import psycopg

    from demote.archive.postgres import PostgresArchive
    from tests.demote.archive.pg import drop_archive

    table = f"tools_{uuid.uuid4().hex[:12]}"
    try:
        archive = PostgresArchive(postgres_url, table=table)
        archive.deliver(Demotion("a", (DemotedMessage("tool", "the result", 4, "k-a"),)))
        archive.deliver(Demotion("b", (DemotedMessage("tool", "b's result", 4, "k-b"),)))
        assert archive.fetch("a", "k-a") == Recalled("tool", "the result", 4, "k-a")
        assert archive.fetch("a", "k-b") is None and archive.fetch("b", "k-a") is None
        assert archive.fetch("a", "k-a\x00") is None
        assert asyncio.run(_afetch_then_close(archive, "b", "k-b")) == Recalled(
            "tool", "b's result", 4, "k-b"
        )
        archive = PostgresArchive(postgres_url, table=table)  # closed with its async pool
        with pytest.raises(ArgumentTypeError, match=r"^key:"):
            archive.fetch("a", 3)  # type: ignore[arg-type]
        data = {"role": "tool", "text": "the result", "tool": "grep"}
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS data jsonb")
            conn.execute(
                f"UPDATE {table} SET data = %s::jsonb WHERE key = 'k-a'", (json.dumps(data),)
            )
        found = archive.fetch("a", "k-a")
        assert found is not None and found.data == data
        assert hit_body(found) == "grep → the result"
        archive.close()
    finally:
        drop_archive(postgres_url, table)


@pytest.fixture(scope="module")
def two_tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SQLiteArchive]:
    path = tmp_path_factory.mktemp("tenants") / "archive.db"
    with SQLiteArchive(path) as archive:
        for cid, secret in (("a", "alpha"), ("b", "zulu")):
            messages = tuple(
                DemotedMessage(
                    "tool", f"{cid} {secret}{i} deploy token scope c{i} OR NEAR", i, f"{cid}{i}"
                )
                for i in range(40)
            )
            archive.deliver(Demotion(cid, messages))
        yield archive


TENANT_WORDS = ["zulu1", "alpha2", "deploy", "token", "OR", "NEAR", "scope", "c3", "b", "'", "*"]
queries = st.one_of(st.text(max_size=120), st.lists(st.sampled_from(TENANT_WORDS)).map(" ".join))


@settings(max_examples=200, deadline=None)
@given(query=queries, key=st.one_of(st.none(), st.sampled_from(["a3", "b3", "b3 ", "*"])))
def test_no_query_or_key_reads_another_conversation(
    two_tenants: SQLiteArchive, query: str, key: str | None
) -> None:
    text = drive_sync(answer(two_tenants, "a", RecallOptions(), query=query, key=key))
    blocks = [line for line in text.splitlines() if line.startswith("[")]
    # Each hit's header is its role and, once the archive records it, its time.
    assert all(line.startswith("[tool") and "] a alpha" in line for line in blocks), text
    assert not any("zulu" in line for line in blocks), text
    if key in ("a3",) or (key is None and "alpha2" in query):
        assert blocks  # the conversation's own messages are found


@pytest.mark.parametrize("key", [f"b{i}" for i in range(0, 40, 7)])
def test_every_key_of_another_conversation_is_not_found(
    two_tenants: SQLiteArchive, key: str
) -> None:
    text = drive_sync(answer(two_tenants, "a", RecallOptions(), key=key))
    assert text == f"No archived message with key {key!r} in this conversation."
