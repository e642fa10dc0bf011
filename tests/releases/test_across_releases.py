"""Files written by earlier releases of demote, read by the current code.

``data/<wave>/`` holds what one past release (the commit that ended the wave, see
``make_fixtures.py``, which wrote them and is not run here) left behind after a short
scenario: its SQLite state store, its archive hook's file and its capture outbox with
undelivered items, and ``manifest.json``, what the scenario was (each conversation's
history, its committed state, the archived rows, the outbox's items). The tests copy the
files to ``tmp_path`` (the committed ones are never opened) and check that the guarantees
hold across the upgrade: the same state is read back, continuing a conversation delivers
each newly demoted message once and none of the old ones again, old messages are still
recalled, erase removes a conversation from an old file, and an old outbox drains once.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from demote import (
    ConversationState,
    Demoter,
    Demotion,
    SlidingWindow,
    SQLiteArchive,
    SQLiteStateStore,
    StoreError,
)
from demote.archive.sqlite import _schema as archive_schema
from demote.capture import Recorder, SQLiteOutbox
from demote.records import CapturedTurn
from demote.state.sqlite import SCHEMA_VERSION
from langchain_demote import DemotingChatMessageHistory
from langchain_demote.messages import from_recalled
from tests.strategies import Msg, describer

DATA = Path(__file__).parent / "data"
WAVES = ["wave1", "wave2", "wave3", "wave4"]
FILES = ("state.sqlite", "archive.sqlite", "outbox.sqlite")
POLICY = SlidingWindow.last_messages(4)  # the scenario's window, in every wave

#: What each conversation gets after the old release's history: two more turns.
NEW_CORE = [
    Msg("user", "Small talk three."),
    Msg("assistant", "Sure, three."),
    Msg("user", "Small talk four."),
    Msg("assistant", "Sure, four."),
]
NEW_LANGCHAIN = [
    {"role": "user", "text": "Chit chat four."},
    {"role": "assistant", "text": "Okay, four."},
    {"role": "user", "text": "Chit chat five."},
    {"role": "assistant", "text": "Okay, five."},
]


@dataclass
class Old:
    """One wave's files, copied to a test's own directory, and its manifest."""

    wave: str
    dir: Path
    manifest: dict[str, Any]

    def path(self, name: str) -> Path:
        return self.dir / name

    def conversation(self, cid: str) -> dict[str, Any]:
        conversation: dict[str, Any] = self.manifest["conversations"][cid]
        return conversation

    def state(self, cid: str) -> ConversationState:
        """The state the old release committed, with the fields it did not have defaulted."""
        stored = self.conversation(cid)["state"]
        known = {f.name for f in fields(ConversationState)}
        assert set(stored) <= known, f"{self.wave} wrote fields this code does not know"
        return ConversationState(**stored)


@pytest.fixture(params=WAVES)
def old(request: pytest.FixtureRequest, tmp_path: Path) -> Old:
    wave: str = request.param
    source = DATA / wave
    assert (source / "manifest.json").is_file(), f"{source} is missing: run make_fixtures.py"
    for name in FILES:
        assert not Path(f"{source / name}-wal").exists(), "a committed fixture has a WAL"
        shutil.copyfile(source / name, tmp_path / name)
    manifest = json.loads((source / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["wave"] == wave
    return Old(wave, tmp_path, manifest)


class Tap:
    """The archive as the hook, with every batch it is handed recorded."""

    def __init__(self, archive: SQLiteArchive) -> None:
        self.archive = archive
        self.batches: list[Demotion] = []

    def deliver(self, batch: Demotion) -> None:
        self.batches.append(batch)
        self.archive.deliver(batch)

    def has_keys(self, conversation_id: str, keys: Iterable[str]) -> set[str]:
        return self.archive.has_keys(conversation_id, keys)

    def parts(self) -> tuple[object, ...]:
        return (self.archive,)

    def indexes(self, conversation_id: str) -> list[int]:
        return [
            m.index
            for b in self.batches
            if b.conversation_id == conversation_id
            for m in b.messages
        ]


def core_history(old: Old) -> list[Msg]:
    return [
        Msg(m["role"], m["text"], tuple(m["opens"]), m["answers"])
        for m in old.conversation("core-1")["messages"]
    ]


def to_langchain(row: dict[str, Any]) -> BaseMessage:
    if row["role"] == "user":
        return HumanMessage(row["text"])
    if row["role"] == "tool":
        return ToolMessage(row["text"], tool_call_id=row["tool_call_id"], name=row["name"])
    calls = [{**c, "type": "tool_call"} for c in row.get("tool_calls", [])]
    return AIMessage(row["text"], tool_calls=calls)


def langchain_history(old: Old) -> list[BaseMessage]:
    return [to_langchain(row) for row in old.conversation("lc-1")["messages"]]


@pytest.fixture
def stores(old: Old) -> Iterator[tuple[SQLiteStateStore, SQLiteArchive]]:
    state = SQLiteStateStore(old.path("state.sqlite"))
    archive = SQLiteArchive(old.path("archive.sqlite"))
    yield state, archive
    archive.close()
    state.close()


def test_the_fixtures_are_older_than_this_code(old: Old) -> None:
    """What the manifest says each file is, and that it is no newer than this code knows."""
    files = old.manifest["files"]
    assert files["state.sqlite"]["user_version"] <= SCHEMA_VERSION
    assert files["archive.sqlite"]["user_version"] <= archive_schema.VERSION
    for name in FILES:
        size = (DATA / old.wave / name).stat().st_size
        assert size < 100_000, f"{old.wave}/{name} is {size} bytes"


def test_the_state_store_reads_the_states_the_old_release_committed(old: Old) -> None:
    with SQLiteStateStore(old.path("state.sqlite")) as state:
        assert state.conversations() == ["core-1", "lc-1"]
        for cid in ("core-1", "lc-1"):
            assert state.get(cid) == old.state(cid)
    with SQLiteStateStore(old.path("state.sqlite")) as state:  # migrated once: still there
        assert state.get("core-1") == old.state("core-1")
        assert state.count() == 2


def old_archived(old: Old, cid: str) -> list[tuple[int, str, str, str]]:
    return [(a["index"], a["key"], a["role"], a["text"]) for a in old.conversation(cid)["archived"]]


def archived(archive: SQLiteArchive, cid: str) -> list[tuple[int, str, str, str]]:
    return [(r.index, r.key, r.role, r.text) for r in archive.messages(cid)]


def check_continuation(
    old: Old,
    cid: str,
    tap: Tap,
    archive: SQLiteArchive,
    state: SQLiteStateStore,
    load: Callable[[int], Sequence[object]],
    total: int,
) -> None:
    """``load(n)`` loads the history's first ``n`` messages and returns the window's kept
    messages; the history is the old one, then ``total`` messages in all."""
    before = old.state(cid)
    history = len(old.conversation(cid)["messages"])
    kept = load(history)  # the history as the old release left it: nothing to deliver
    assert tap.indexes(cid) == [], f"re-delivered {tap.indexes(cid)} from the old history"
    assert len(kept) == history - before.window_start
    for n in range(history + 1, total + 1):
        load(n)
    delivered = tap.indexes(cid)
    after = state.get(cid)
    assert after is not None and after.window_start > before.window_start
    assert delivered == list(range(before.delivered, after.delivered)), (
        "each newly demoted message once, and none the old release delivered"
    )
    rows = archived(archive, cid)
    assert rows[: len(old_archived(old, cid))] == old_archived(old, cid)
    assert [r[0] for r in rows] == list(range(rows[0][0], after.delivered)), "no duplicate rows"


def test_continuing_a_core_conversation_delivers_only_the_new_demotions(
    old: Old, stores: tuple[SQLiteStateStore, SQLiteArchive]
) -> None:
    state, archive = stores
    tap = Tap(archive)
    demoter = Demoter(POLICY, tap, state=state)
    describe = describer(demoter)
    messages = core_history(old) + NEW_CORE

    def load(n: int) -> Sequence[object]:
        window = demoter.load("core-1", messages[:n], describe)
        assert demoter.drain(10)
        return window.messages

    try:
        check_continuation(old, "core-1", tap, archive, state, load, len(messages))
    finally:
        demoter.close()


def test_continuing_a_langchain_conversation_delivers_only_the_new_demotions(
    old: Old, stores: tuple[SQLiteStateStore, SQLiteArchive]
) -> None:
    state, archive = stores
    tap = Tap(archive)
    demoter = Demoter(POLICY, tap, state=state)
    messages = langchain_history(old) + [to_langchain(row) for row in NEW_LANGCHAIN]
    inner = InMemoryChatMessageHistory()
    history = DemotingChatMessageHistory(inner, demoter, "lc-1")

    def load(n: int) -> Sequence[object]:
        if n > len(inner.messages):
            history.add_messages(messages[len(inner.messages) : n])
        window = history.messages
        assert demoter.drain(10)
        return window

    try:
        check_continuation(old, "lc-1", tap, archive, state, load, len(messages))
    finally:
        demoter.close()


def open_old(old: Old) -> tuple[Tap, SQLiteArchive, SQLiteStateStore, Demoter]:
    state = SQLiteStateStore(old.path("state.sqlite"))
    archive = SQLiteArchive(old.path("archive.sqlite"))
    tap = Tap(archive)
    demoter = Demoter(POLICY, tap, state=state)
    return tap, archive, state, demoter


def test_a_resync_of_an_old_conversation_re_delivers_nothing_the_archive_holds(
    old: Old, caplog: pytest.LogCaptureFixture
) -> None:
    """A demoted message edited in the inner store is a rewrite: re-synced, and only the
    edited message (new content, new key) reaches the hook; the rest is in the archive.

    Waves 1 and 2 fingerprinted an assistant message with tool calls by its call ids
    alone (from wave 3 on the fingerprint covers the calls' names and arguments): the
    archive holds it under the key of that legacy fingerprint, which the hook is asked
    for too."""
    messages = langchain_history(old)
    messages[7] = AIMessage("Okay, one (edited).")  # the message just before the window
    tap, archive, state, demoter = open_old(old)
    try:
        inner = InMemoryChatMessageHistory(messages=messages)
        DemotingChatMessageHistory(inner, demoter, "lc-1").messages  # noqa: B018
        assert demoter.drain(10)
        assert "re-syncing" in caplog.text
        assert tap.indexes("lc-1") == [7]
        assert [r.index for r in archive.messages("lc-1")].count(3) == 1
    finally:
        demoter.close()
        archive.close()
        state.close()


@pytest.mark.parametrize("old", ["wave2", "wave3", "wave4"], indirect=True)
def test_a_stale_copy_ending_at_an_old_tool_call_changes_nothing(old: Old) -> None:
    """A slow request's copy read right after the tool call was added (wave 1 kept no trail,
    so its stale copies are re-synced by design). Wave 2's trail holds the call's legacy
    fingerprint (its ids alone)."""
    messages = langchain_history(old)
    tap, archive, state, demoter = open_old(old)
    try:
        copy = InMemoryChatMessageHistory(messages=messages[:4])
        DemotingChatMessageHistory(copy, demoter, "lc-1").messages  # noqa: B018
        assert demoter.drain(10)
        assert state.get("lc-1") == old.state("lc-1")
        inner = InMemoryChatMessageHistory(messages=messages)
        DemotingChatMessageHistory(inner, demoter, "lc-1").messages  # noqa: B018
        assert demoter.drain(10)
        assert tap.indexes("lc-1") == [] and archive.count("lc-1") == 8
    finally:
        demoter.close()
        archive.close()
        state.close()


def test_the_old_archive_is_upgraded_and_recalls_old_messages(old: Old) -> None:
    with SQLiteArchive(old.path("archive.sqlite")) as archive:
        assert archive.conversations() == ["core-1", "lc-1"]
        for cid in ("core-1", "lc-1"):
            assert archived(archive, cid) == old_archived(old, cid)
            keys = [a["key"] for a in old.conversation(cid)["archived"]]
            assert archive.has_keys(cid, keys) == set(keys)
        (hit,) = archive.search("core-1", "when did we hike?", k=1)
        assert hit.text == "We hiked the Alps in June; the tent leaked."
        (hit,) = archive.search("core-1", "Hörnlihütte", k=1)
        assert hit.role == "tool" and "Übernachtung" in hit.text
        (hit,) = archive.search("lc-1", "where did we kayak?", k=1)
        assert hit.text.startswith("We kayaked the Vltava")
        assert not archive.search("lc-1", "Hörnlihütte"), "one conversation's words only"
    db = sqlite3.connect(old.path("archive.sqlite"))
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == archive_schema.VERSION
    finally:
        db.close()


def test_an_old_tool_call_and_its_result_come_back(old: Old) -> None:
    """Rows of waves 1 and 2 hold text only (the upgrade leaves them so, documented);
    from wave 3 on a row holds the whole message, and the call is found by its name."""
    original = langchain_history(old)
    with SQLiteArchive(old.path("archive.sqlite")) as archive:
        (result,) = archive.search("lc-1", "Sprüngli on Bahnhofstrasse?", k=1)[:1]
        assert result.index in (4, 5)
        rows = {r.index: r for r in archive.messages("lc-1")}
        call, answer = rows[3], rows[4]
        assert (call.role, answer.role) == ("assistant", "tool")
        assert answer.text == original[4].content
        if old.wave in ("wave1", "wave2"):
            assert call.data is None and answer.data is None and call.at is None
            return
        (hit,) = archive.search("lc-1", "find_cafe", k=1)
        assert hit.key == call.key
        back = from_recalled(call)
        assert isinstance(back, AIMessage) and isinstance(original[3], AIMessage)
        assert back.tool_calls == original[3].tool_calls
        tool = from_recalled(answer)
        assert isinstance(tool, ToolMessage) and tool.tool_call_id == "call_cafe_1"
        assert tool.name == "find_cafe"


def leaks(path: Path, secret: str) -> list[str]:
    needle = secret.encode()
    files = [path, Path(f"{path}-wal")]
    return [f.name for f in files if f.exists() and needle in f.read_bytes()]


def test_erase_removes_an_old_conversation_from_the_old_files(old: Old) -> None:
    state = SQLiteStateStore(old.path("state.sqlite"))
    archive = SQLiteArchive(old.path("archive.sqlite"))
    demoter = Demoter(POLICY, archive, state=state)
    try:
        report = demoter.erase("core-1")
        assert report.complete, report
        assert archive.count("core-1") == 0 and archive.messages("core-1") == []
        assert archive.search("core-1", "Hörnlihütte") == []
        assert archived(archive, "lc-1") == old_archived(old, "lc-1"), "the other stays"
        assert state.get("core-1") is None and state.get("lc-1") == old.state("lc-1")
    finally:
        demoter.close()
        archive.close()
        state.close()
    for name in ("archive.sqlite", "state.sqlite"):
        assert leaks(old.path(name), "Hörnlihütte") == [], name


@dataclass
class Sink:
    """Records every item and its count; ``wanted`` is set once ``n`` distinct keys arrived."""

    n: int

    def __post_init__(self) -> None:
        self.items: list[Any] = []
        self.wanted = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, item: Any) -> None:
        with self.lock:
            self.items.append(item)
            if len(self.items) >= self.n:
                self.wanted.set()


def expected_outbox(old: Old) -> list[tuple[str, Any]]:
    """What the old outbox holds, as (kind, identifying content), oldest first."""
    out: list[tuple[str, Any]] = []
    for row in old.manifest["outbox"]["undelivered"]:
        payload = row["payload"]
        if payload["kind"] == "turn":
            out.append(("turn", (payload["key"], payload["text"], payload["index"])))
        elif payload["kind"] == "demotion":
            (m,) = old.manifest["outbox"]["demotion"]["messages"]
            out.append(("demotion", (payload["conversation_id"], m[1], m[2], m[3])))
        else:
            out.append(("json", payload["value"]))
    return out


def seen(item: Any) -> tuple[str, Any]:
    if isinstance(item, CapturedTurn):
        return "turn", (item.key, item.text, item.index)
    if isinstance(item, Demotion):
        (m,) = item.messages
        return "demotion", (item.conversation_id, m.text, m.index, m.key)
    return "json", item


def test_the_old_outbox_drains_its_items_once(old: Old) -> None:
    expected = expected_outbox(old)
    assert len(expected) == 7 and {k for k, _ in expected} == {"turn", "demotion", "json"}
    sink = Sink(len(expected))
    with Recorder(sink, outbox=SQLiteOutbox(old.path("outbox.sqlite"))) as recorder:
        assert sink.wanted.wait(10), f"delivered {len(sink.items)} of {len(expected)}"
    recorder.outbox.close()  # type: ignore[union-attr]
    assert [seen(i) for i in sink.items] == expected, "each item once, oldest first"
    lc = old.conversation("lc-1")["messages"]
    texts = [m["text"] for m in lc if m["role"] == "user"]
    assert [i.text for i in sink.items if isinstance(i, CapturedTurn)] == texts
    again = Sink(1)
    with SQLiteOutbox(old.path("outbox.sqlite")) as outbox:
        assert outbox.pending() == 0 and outbox.dead_letters() == []
        with Recorder(again, outbox=outbox):
            pass
    assert again.items == [], "a second start re-delivers nothing"


def test_erase_finds_an_old_conversations_outbox_items(old: Old) -> None:
    """The old rows carry no conversation column; the upgrade fills it from the payloads."""
    with SQLiteOutbox(old.path("outbox.sqlite")) as outbox:
        assert outbox.erase("lc-1") == 6  # five user turns and the demotion batch
        (left,) = outbox.load()
        assert left.key == old.manifest["outbox"]["json"]["key"]
    assert leaks(old.path("outbox.sqlite"), "Grüezi") == []


@pytest.mark.parametrize("name", ["state.sqlite", "archive.sqlite"])
def test_a_file_from_a_newer_release_is_refused_and_left_as_it_was(old: Old, name: str) -> None:
    """The newest old file, upgraded by this code, then marked one schema past it."""
    path = old.path(name)
    opener: Callable[[Path], Any] = SQLiteStateStore if name == "state.sqlite" else SQLiteArchive
    opener(path).close()
    version = SCHEMA_VERSION if name == "state.sqlite" else archive_schema.VERSION
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {version + 1}")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match=f"{version + 1}"):
        opener(path)
    assert path.read_bytes() == before


def test_a_redis_state_an_old_release_wrote_reads_as_its_state(old: Old, redis_url: str) -> None:
    """Redis keeps a state as the JSON of its fields (sorted keys): an old release's value
    lacks the fields it did not have yet (wave 1 the trail, waves 1-2 the clearing
    watermark); they read as their defaults, and the conversation goes on delivering
    only what is new."""
    import redis

    from demote import RedisStateStore

    raw = redis.Redis.from_url(redis_url)
    try:
        for cid in ("core-1", "lc-1"):
            stored = old.conversation(cid)["state"]
            raw.set(
                f"demote:state:{cid}", json.dumps(stored, sort_keys=True, separators=(",", ":"))
            )
            raw.sadd("demote:ids", cid)
        with RedisStateStore(redis_url) as store:
            assert store.get("core-1") == old.state("core-1")
            assert store.get("lc-1") == old.state("lc-1")
            archive = SQLiteArchive(old.path("archive.sqlite"))
            tap = Tap(archive)
            demoter = Demoter(POLICY, tap, state=store)
            try:
                history = langchain_history(old)
                inner = InMemoryChatMessageHistory(messages=history)
                DemotingChatMessageHistory(inner, demoter, "lc-1").messages  # noqa: B018
                assert demoter.drain(10)
                assert tap.indexes("lc-1") == [], "nothing delivered again"
                assert store.get("lc-1") == old.state("lc-1")
            finally:
                demoter.close()
                archive.close()
    finally:
        raw.flushdb()
        raw.close()
