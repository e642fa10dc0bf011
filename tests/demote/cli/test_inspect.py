"""``demote inspect``: pending messages per conversation and where the last error is.

Runs :func:`demote.cli.commands.inspect_stores` in process on stores written here: a
conversation whose hook failed shows its pending messages, the output says the state
store does not keep the error (and where it is), and an outbox's dead letters are listed
with their conversation and last error.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

from demote import Backoff, Demoter, Demotion, SlidingWindow, SQLiteStateStore
from demote.capture import Recorder, SQLiteOutbox
from demote.capture.outbox import RetryPolicy
from demote.cli.commands import inspect_stores
from demote.records import CapturedTurn
from tests.strategies import Msg, describer

CHAT = [Msg("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(20)]


def failing(batch: Demotion) -> None:
    raise RuntimeError("archive offline")


class Down:
    def deliver(self, batch: Demotion) -> None:
        failing(batch)


def write_state(path: Path) -> None:
    store = SQLiteStateStore(path)
    demoter = Demoter(SlidingWindow.last_messages(4), Down(), state=store, retry=Backoff(0, 0))
    demoter.load("stuck", CHAT[:10], describer(demoter))  # 6 pending
    healthy = Demoter(SlidingWindow.last_messages(4), state=store)
    healthy.load("fine", CHAT[:10], describer(healthy))
    assert demoter.conversation_stats("stuck").last_error == "RuntimeError('archive offline')"
    demoter.close()
    healthy.close()
    store.close()


def test_inspect_shows_pending_and_says_where_the_last_error_is(tmp_path: Path) -> None:
    write_state(tmp_path / "state.db")
    out = io.StringIO()
    inspect_stores(out, state=tmp_path / "state.db")
    said, table = out.getvalue().split("\n\n", 1)
    assert said == f"state: {tmp_path / 'state.db'} (SQLite file)"  # what it reads, first
    lines = table.splitlines()
    header = lines[0].split()
    assert header[:5] == ["conversation", "window", "start", "watermark", "pending"]
    rows = {line.split()[0]: line.split() for line in lines[1:3]}
    assert rows["stuck"][1:4] == ["6", "0", "6"]  # window start, watermark, pending
    assert rows["fine"][1:4] == ["6", "6", "0"]
    text = out.getvalue()
    assert "6 messages pending in 1 conversations ('stuck')" in text
    assert "does not keep the delivery error" in text and "conversation_stats" in text


def test_inspect_lists_dead_letters_with_their_conversation(tmp_path: Path) -> None:
    write_state(tmp_path / "state.db")
    fast = RetryPolicy(max_attempts=1, base_delay=0.01, max_delay=0.01)
    with (
        SQLiteOutbox(tmp_path / "outbox.db", retry=fast) as outbox,
        Recorder(failing, outbox=outbox) as recorder,
    ):
        recorder.enqueue(CapturedTurn("stuck", "user", "hello", 0, "k-stuck"))
        recorder.enqueue(CapturedTurn("fine", "user", "hi", 0, "k-fine"))
        deadline = time.monotonic() + 10
        while len(outbox.dead_letters()) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    out = io.StringIO()
    inspect_stores(out, state=tmp_path / "state.db", outbox=tmp_path / "outbox.db",
                   conversation="stuck")  # fmt: skip
    text = out.getvalue()
    assert "1 dead letters" in text
    [line] = [x for x in text.splitlines() if "k-stuck" in x]
    assert line.split()[0] == "stuck" and "RuntimeError: archive offline" in line
    assert "k-fine" not in text
