"""demote.request: where the note and recall go, how recall is fitted, and when it is searched."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from demote import Demoter, SlidingWindow
from demote.engine import PROGRESS_PREFIX, SUMMARY_PREFIX, Window
from demote.errors import ConfigError
from demote.events import DemoteEvent
from demote.flow import drive_sync
from demote.records import Recalled
from demote.request import (
    RECALL_PREFIX,
    RECALL_SHARE,
    Recalling,
    RecallMemo,
    RecallSettings,
    compose,
    fit_recall,
    note_text,
    question_at,
    recall_flow,
    render_recall,
    visible_hits,
)
from demote.window.tokens import approximate_tokens


@dataclass(frozen=True)
class Msg:
    role: str
    text: str
    calls: tuple[str, ...] = ()


class Plain:
    """A renderer over :class:`Msg` (what an adapter gives :func:`compose`)."""

    def note(self, text: str) -> Msg:
        return Msg("user", text)

    def recall(self, text: str) -> Msg:
        return Msg("user", text)

    def replaced(self, message: Msg, text: str) -> Msg:
        return Msg(message.role, text, message.calls)

    def opens_calls(self, message: Msg) -> bool:
        return bool(message.calls)

    def answer_dangling(self, messages: list[Msg]) -> list[Msg]:
        return messages


@dataclass
class ListRecall:
    hits: list[Recalled]
    asked: list[tuple[str, str, int, dict[str, Any]]] = field(default_factory=list)

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        options = {} if budget_tokens is None else {"budget_tokens": budget_tokens}
        self.asked.append((conversation_id, query, k, options))
        return self.hits[:k]


class Bare:
    """A custom recall that does not know ``budget_tokens``."""

    def __init__(self, hits: list[Recalled]) -> None:
        self.hits = hits
        self.calls = 0

    def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
        self.calls += 1
        return self.hits[:k]


SYSTEM = Msg("system", "rules")
OLD = [Recalled("user", f"old fact {i}", i + 1, f"k{i}", 10.0 - i) for i in range(6)]


def chat(start: int, n: int) -> list[Msg]:
    return [Msg("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(start, start + n)]


def window(**kw: Any) -> Window[Msg]:
    base: dict[str, Any] = {
        "conversation_id": "c",
        "pinned": [SYSTEM],
        "summary": None,
        "messages": chat(10, 4),
        "start": 10,
        "total": 14,
    }
    base.update(kw)
    return Window(**base)


def _role_text(m: Msg) -> tuple[str, str]:
    return m.role, m.text


def _count(text: str) -> int:
    return approximate_tokens(text) + 3


def run(
    settings: RecallSettings, w: Window[Msg], memo: RecallMemo | None = None, **kw: Any
) -> tuple[Recalling | None, tuple[DemoteEvent, ...]]:
    demoter = Demoter(SlidingWindow.last_tokens(4000))
    return drive_sync(
        recall_flow(
            settings,
            demoter,
            w,
            is_user=lambda m: m.role == "user",
            text_of=lambda m: m.text,
            key=_role_text,
            count=_count,
            memo=memo or RecallMemo(),
            **kw,
        )
    )


# -- the order --------------------------------------------------------------------------


def test_the_note_is_a_user_message_after_the_system_block() -> None:
    out = compose(window(summary="gist"), Plain())
    assert out[0] is SYSTEM
    assert out[1] == Msg("user", SUMMARY_PREFIX + "gist")
    assert out[2:] == chat(10, 4)
    assert note_text(window()) is None


def test_inside_a_turn_the_opener_comes_first_then_its_progress_note() -> None:
    opener = Msg("user", "do the job")
    w = window(summary="read 3 pages", opener=opener, opener_index=4, messages=chat(11, 3))
    out = compose(w, Plain())
    assert out[:3] == [SYSTEM, opener, Msg("user", PROGRESS_PREFIX + "read 3 pages")]
    assert [m.role for m in out].count("system") == 1


def test_recall_goes_right_after_the_question() -> None:
    w = window(messages=[*chat(10, 3), Msg("assistant", "call", ("c1",)), Msg("tool", "r")])
    recalling = Recalling("R", (OLD[0],), 12)
    out = compose(w, Plain(), recalling)
    texts = [m.text for m in out]
    assert texts == ["rules", "m10", "m11", "m12", "R", "call", "r"]


def test_recall_after_the_opener_goes_after_its_note() -> None:
    opener = Msg("user", "do the job")
    w = window(summary="s", opener=opener, opener_index=4, messages=chat(11, 2))
    out = compose(w, Plain(), Recalling("R", (OLD[0],), 4))
    assert [m.text for m in out][:4] == ["rules", "do the job", PROGRESS_PREFIX + "s", "R"]


def test_recall_for_an_unstored_question_goes_last_but_never_after_a_call() -> None:
    w = window()
    assert compose(w, Plain(), Recalling("R", (OLD[0],), None))[-1].text == "R"
    pending = window(messages=[*chat(10, 2), Msg("assistant", "call", ("c1",))])
    out = compose(pending, Plain(), Recalling("R", (OLD[0],), None))
    assert [m.text for m in out][-2:] == ["R", "call"]


def test_question_at_is_the_newest_user_message_or_the_opener() -> None:
    assert question_at(window(), lambda m: m.role == "user") == 12
    opener = Msg("user", "task")
    steps = [Msg("assistant", "a", ("c",)), Msg("tool", "r")]
    w = window(messages=steps, start=5, total=7, opener=opener, opener_index=3)
    assert question_at(w, lambda m: m.role == "user") == 3
    assert question_at(window(messages=steps), lambda m: m.role == "user") is None


# -- what recall finds -------------------------------------------------------------------


def test_render_recall_is_oldest_first_with_the_prefix() -> None:
    hits = [Recalled("assistant", "b", 9, "k2"), Recalled("user", "a", 3, "k1")]
    assert render_recall(hits) == RECALL_PREFIX + "- user: a\n- assistant: b"


def test_visible_hits_drop_what_the_model_sees() -> None:
    w = window()
    hits = [
        Recalled("user", "m10", 10, "in-window"),
        Recalled("system", "rules", 0, "pinned"),
        Recalled("assistant", "m11", -1, "no-position-but-shown"),
        OLD[2],
    ]
    assert visible_hits(w, hits, _role_text) == [OLD[2]]


def test_fit_recall_keeps_to_the_budget_as_sent() -> None:
    long = Recalled("user", "x" * 400, 1, "long")
    short = [Recalled("user", f"short {i}", 2 + i, f"s{i}") for i in range(3)]
    budget = _count(render_recall(short[:2]))
    kept = fit_recall([long, *short], 5, budget, _count)
    assert kept == tuple(short[:2]), "the long one does not fit; shorter later ones do"
    assert fit_recall([long, *short], 1, None, _count) == (long,)
    assert fit_recall([long], 5, 5, _count) == ()


def test_settings_reserve_a_share_of_a_token_limit() -> None:
    policy = SlidingWindow.last_tokens(7200)
    s = RecallSettings.make(ListRecall([]), 5, None, "user", policy)
    assert s is not None and s.budget == s.reserve == int(7200 * RECALL_SHARE) == 100
    turns = RecallSettings.make(ListRecall([]), 5, None, "human", SlidingWindow.last_turns(4))
    assert turns is not None and turns.budget is None and turns.reserve == 0
    assert turns.role == "user"
    own = RecallSettings.make(ListRecall([]), 5, 300, "system", policy)
    assert own is not None and (own.budget, own.reserve, own.role) == (300, 300, "system")
    assert RecallSettings.make(None, 5, None, "user", policy) is None


@pytest.mark.parametrize(
    ("recall", "k", "budget", "role", "match"),
    [
        (object(), 5, None, "user", "search"),
        (ListRecall([]), 0, None, "user", "recall_k"),
        (ListRecall([]), 5, 0, "user", "recall_budget_tokens"),
        (ListRecall([]), 5, 4000, "user", "no room"),
        (ListRecall([]), 5, None, "tool", "recall_role"),
    ],
)
def test_settings_refuse_what_cannot_work(
    recall: Any, k: int, budget: int | None, role: str, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        RecallSettings.make(recall, k, budget, role, SlidingWindow.last_tokens(4000))


def test_a_recall_without_budget_tokens_is_asked_without_it() -> None:
    bare = Bare(OLD)
    s = RecallSettings.make(bare, 2, None, "user", SlidingWindow.last_tokens(7200))
    assert s is not None and not s.asks_budget and s.search_options() == {}
    recalling, _ = run(s, window())
    assert bare.calls == 1 and recalling is not None and len(recalling.hits) <= 2
    typed = RecallSettings.make(ListRecall(OLD), 2, None, "user", SlidingWindow.last_tokens(7200))
    assert typed is not None and typed.search_options() == {"budget_tokens": 100}


# -- when recall searches ----------------------------------------------------------------


def test_one_search_per_question_until_a_cut() -> None:
    recall = ListRecall(OLD)
    s = RecallSettings.make(recall, 2, 200, "user", SlidingWindow.last_tokens(4000))
    assert s is not None
    memo = RecallMemo()
    first, events = run(s, window(), memo)
    assert first is not None and first.after == 12 and len(recall.asked) == 1
    assert [e.kind for e in events] == ["recalled"] and events[0].count == len(first.hits)
    # The next model calls of the same turn (steps appended): the same recall, no search.
    steps = [*chat(10, 3), Msg("assistant", "call", ("c1",)), Msg("tool", "r")]
    again, events = run(s, window(messages=steps, total=15), memo)
    assert again == first and events == () and len(recall.asked) == 1
    # A cut (the window starts later) or a new question searches again.
    run(s, window(messages=chat(12, 2), start=12), memo)
    run(s, window(messages=[*chat(10, 4), Msg("user", "new question")], total=15), memo)
    assert len(recall.asked) == 3
    assert recall.asked[0][2] == 4, "twice k: what the window shows is dropped"


def test_no_recalled_event_without_hits() -> None:
    s = RecallSettings.make(ListRecall([]), 2, 200, "user", SlidingWindow.last_tokens(4000))
    assert s is not None
    recalling, events = run(s, window())
    assert recalling is None and events == ()


def test_a_failing_search_gives_no_recall_and_a_degraded_event() -> None:
    class Broken:
        def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
            raise RuntimeError("index offline")

    s = RecallSettings.make(Broken(), 2, 200, "user", SlidingWindow.last_tokens(4000))
    assert s is not None
    recalling, events = run(s, window())
    assert recalling is None and [(e.kind, e.source) for e in events] == [("degraded", "recall")]


def test_a_query_that_is_not_stored_places_recall_last() -> None:
    s = RecallSettings.make(ListRecall(OLD), 2, 200, "user", SlidingWindow.last_tokens(4000))
    assert s is not None
    recalling, _ = run(s, window(), query="what was the old fact?")
    assert recalling is not None and recalling.after is None
    asked = window(messages=chat(10, 3), total=13)  # ends with the stored question, m12
    stored, _ = run(s, asked, RecallMemo(), query="m12")
    assert stored is not None and stored.after == 12, "the same text, stored: after it"
