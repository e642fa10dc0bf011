"""Hypothesis fuzzing of the public surface with hostile ids and text.

Random sequences of load / clear / erase (sync or async) over a Demoter on
SQLiteStateStore and an SQLite archive, each example in a fresh folder:

* a call either succeeds or raises a DemoteError (for an unusable id, and then the stores
  are unchanged); never anything untyped;
* the window never holds more than the policy allows and ends at the history's end;
* every message is in the window or delivered (the archive never fails, so nothing stays
  pending), and the archive holds exactly the messages delivered for that conversation:
  none of another's (no cross-conversation leak), each once.

And random items and keys through a Recorder with an outbox: typed refusals only, and
every accepted item reaches the sink.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from demote import Demoter, SlidingWindow, SQLiteArchive, SQLiteStateStore
from demote.capture import Recorder, RetryPolicy, SQLiteOutbox
from demote.errors import ConversationIdError, DemoteError
from demote.records import make_key, storable_text
from demote.state.base import validate_conversation_id
from tests.hostile.harness import BAD_IDS, ODD_IDS, ODD_TEXT, wait_for
from tests.strategies import Msg

LIMIT = 2
POLICY = SlidingWindow.last_messages(LIMIT)
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

IDS = st.one_of(
    st.sampled_from(["a", "b", *ODD_IDS]),
    st.sampled_from(BAD_IDS),
    st.text(max_size=12),
)
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from([*ODD_TEXT[:-1], "x" * 100_000, "\udfff\ud800 reversed pair"]),
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("load"), IDS, st.lists(TEXT, max_size=4), st.booleans()),
        st.tuples(st.just("clear"), IDS, st.just([]), st.booleans()),
        st.tuples(st.just("erase"), IDS, st.just([]), st.booleans()),
    ),
    min_size=1,
    max_size=12,
)


def _usable(cid: object) -> bool:
    try:
        validate_conversation_id(cid)
    except ConversationIdError:
        return False
    return True


class Model:
    """What the stores must hold: each conversation's history and its delivered keys."""

    def __init__(self, root: Path) -> None:
        self.state = SQLiteStateStore(root / "state.db")
        self.archive = SQLiteArchive(root / "archive.db")
        self.d = Demoter(POLICY, self.archive, state=self.state)
        self.histories: dict[str, list[Msg]] = {}
        self.delivered: dict[str, set[str]] = {}

    def close(self) -> None:
        self.d.close()
        self.archive.close()
        self.state.close()

    def describe(self, m: Msg) -> Any:
        return self.d.describe(m.role, m.text, opens=m.opens, answers=m.answers)

    def key(self, cid: str, i: int, m: Msg) -> str:
        return make_key(cid, i, self.describe(m).fingerprint)

    def totals(self) -> tuple[int, int]:
        return self.archive.count(), self.state.count()

    def apply(self, op: str, cid: Any, texts: list[str], use_async: bool) -> None:
        before = self.totals()
        try:
            self._call(op, cid, texts, use_async)
        except DemoteError:
            assert not _usable(cid), f"{op}({cid!r:.40}) refused a usable id"
            assert self.totals() == before, "a refused call changed the stores"
            return
        assert _usable(cid), f"{op}({cid!r:.40}) accepted an unusable id"

    def _call(self, op: str, cid: Any, texts: list[str], use_async: bool) -> None:
        d = self.d
        if op == "load":
            history = self.histories.get(cid, []) if isinstance(cid, str) else []
            n = len(history)
            new = [Msg(("user", "assistant")[(n + i) % 2], t) for i, t in enumerate(texts)]
            full = [*history, *new]
            if use_async:
                w = asyncio.run(d.aload(cid, full, self.describe))
            else:
                w = d.load(cid, full, self.describe)
            self.histories[cid] = full
            self._check(cid, w, full)
        elif op == "clear":
            asyncio.run(d.aclear(cid)) if use_async else d.clear(cid)
            self.histories[cid] = []  # as the adapters clear their inner store
        else:
            asyncio.run(d.aerase(cid)) if use_async else d.erase(cid)
            self.histories[cid] = []
            self.delivered[cid] = set()
            assert self.archive.count(cid) == 0

    def _check(self, cid: str, w: Any, full: list[Msg]) -> None:
        assert w.total == len(full)
        assert len(w.messages) <= LIMIT, "the window outgrew the policy"
        assert w.start + len(w.messages) == len(full), "the window does not end the history"
        assert [m.text for m in w.messages] == [m.text for m in full[w.start :]]
        assert w.pending == 0 and w.delivered == w.start, "a message is neither kept nor sent"
        keys = self.delivered.setdefault(cid, set())
        keys |= {self.key(cid, i, m) for i, m in enumerate(full[: w.start])}
        stored = self.archive.messages(cid)
        assert {r.key for r in stored} == keys, "the archive is not what was delivered"
        assert len(stored) == len(keys), "a message was archived twice"
        current = {self.key(cid, i, m): m for i, m in enumerate(full[: w.start])}
        for r in stored:
            if r.key in current:
                assert r.text == storable_text(current[r.key].text)


@FUZZ
@given(ops=OPS)
def test_random_loads_clears_and_erases_keep_every_invariant(ops: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as root:
        model = Model(Path(root))
        try:
            for op in ops:
                model.apply(*op)
            total = sum(len(keys) for keys in model.delivered.values())
            assert model.archive.count() == total, "messages of no conversation were stored"
        finally:
            model.close()


ITEMS = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=20),
        st.sampled_from(ODD_TEXT[:-1]),
        st.binary(max_size=4),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
KEYS = st.one_of(st.none(), st.text(max_size=10), st.sampled_from(BAD_IDS))


@FUZZ
@given(batch=st.lists(st.tuples(ITEMS, KEYS), min_size=1, max_size=8))
def test_random_items_and_keys_through_a_durable_recorder(batch: list[Any]) -> None:
    got: list[Any] = []
    with tempfile.TemporaryDirectory() as root:
        box = SQLiteOutbox(Path(root) / "o.db", retry=RetryPolicy(2, 0.0, 0.0))
        r = Recorder(got.append, flush_timeout=5, outbox=box)
        accepted = 0
        try:
            for item, key in batch:
                try:
                    r.enqueue(item, key=key)
                except DemoteError:
                    continue
                accepted += 1
            assert wait_for(lambda: r.stats.delivered + r.stats.dropped == accepted)
        finally:
            r.close()
            pending = box.pending()
            box.close()
        assert pending == 0
        assert r.stats.failed == 0 and len(got) == r.stats.delivered
