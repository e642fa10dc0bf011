"""Messages that earlier releases fingerprinted differently are still recognised.

Releases before the whole-message form fingerprinted a message by its role, text, call
ids and answered id; today's fingerprint also covers its calls' names and arguments and
its non-text blocks (``records.parts_digest``). What those releases stored names such a
message by the old form: the anchor and trail of its state, the keys of what it
delivered. Today's code matches that legacy fingerprint too (``MessageRecord.legacy``),
so an upgrade neither re-syncs a conversation nor delivers a message again, and an erase
reaches the old keys. (``tests/releases`` checks the same on files real old releases
wrote; these tests pin each place on its own.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pytest

from demote import ConversationState, Demoter, Demotion, InMemoryStateStore, SlidingWindow
from demote.records import MessageRecord, fingerprint, keys_of, make_key

CALLS = [{"id": "c1", "name": "lookup", "args": {"q": "weather"}}]


class Msg:
    """A message with tool calls, described as an adapter does (calls included)."""

    def __init__(
        self, role: str, text: str, *, opens: Sequence[str] = (), answers: str | None = None
    ):
        self.role, self.text, self.opens, self.answers = role, text, tuple(opens), answers


def describer(d: Demoter) -> Callable[[Msg], MessageRecord]:
    def describe(m: Msg) -> MessageRecord:
        calls = CALLS if m.opens else ()
        return d.describe(m.role, m.text, opens=m.opens, answers=m.answers, calls=calls)

    return describe


def history() -> list[Msg]:
    return [
        Msg("user", "what is the weather?"),
        Msg("assistant", "", opens=("c1",)),
        Msg("tool", "sunny", answers="c1"),
        Msg("assistant", "It is sunny."),
        Msg("user", "thanks"),
        Msg("assistant", "You are welcome."),
    ]


class KeyedHook:
    """Holds what it was given by key; answers has_keys; erases by key."""

    def __init__(self, held: Sequence[str] = ()) -> None:
        self.held = set(held)
        self.delivered: list[int] = []
        self.erased: list[str] = []

    def deliver(self, batch: Demotion) -> None:
        for m in batch.messages:
            self.held.add(m.key)
            self.delivered.append(m.index)

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        return {k for k in keys if k in self.held}

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        self.erased = list(keys or ())
        return len(self.erased)


def test_a_record_with_calls_keeps_its_legacy_fingerprint_and_a_text_only_one_has_none() -> None:
    d = Demoter(SlidingWindow.last_messages(4))
    call = describer(d)(Msg("assistant", "", opens=("c1",)))
    assert call.legacy == fingerprint("assistant", "", ("c1",)) != call.fingerprint
    assert call.known_as(call.legacy) and call.known_as(call.fingerprint)
    assert call.fingerprints == (call.fingerprint, call.legacy)
    assert not call.known_as(None) and not call.known_as("0" * 32)
    text = d.describe("user", "hi")
    assert text.legacy is None and text.known_as(text.fingerprint) and not text.known_as(None)
    assert text.fingerprints == (text.fingerprint,)
    # Not part of what a record is: equal records whatever release named them.
    assert call == MessageRecord(call.role, call.text, call.fingerprint, call.tokens, call.opens)
    assert keys_of("t", [(1, call), (0, text)]) == [
        make_key("t", 1, call.fingerprint),
        make_key("t", 1, call.legacy),
        make_key("t", 0, text.fingerprint),
    ]


def test_a_state_anchored_at_a_legacy_fingerprint_is_not_re_synced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The message before the window is a call left unanswered (the user moved on): an
    old release anchored the state at it by its legacy fingerprint."""
    msgs = [Msg("user", "go"), Msg("assistant", "", opens=("c1",)), Msg("user", "never mind")]
    msgs += [Msg("assistant", "ok")]
    state = InMemoryStateStore()
    legacy = fingerprint("assistant", "", ("c1",))
    state.compare_and_set("t", None, ConversationState(2, 2, 0, legacy))
    hook = KeyedHook()
    d = Demoter(SlidingWindow.last_messages(4), hook, state=state)
    with caplog.at_level(logging.WARNING, logger="demote"):
        w = d.load("t", msgs, describer(d))
    assert "re-syncing" not in caplog.text
    assert w.start == 2 and hook.delivered == []
    assert d.state_of("t").generation == 0


def test_after_a_re_sync_a_message_held_under_its_legacy_key_is_not_delivered_again() -> None:
    msgs = history()
    d0 = Demoter(SlidingWindow.last_messages(4))
    call = describer(d0)(msgs[1])
    assert call.legacy is not None
    # An old release delivered 0..3 (the call under its legacy key), window at 4.
    held = [make_key("t", 0, fingerprint("user", msgs[0].text)), make_key("t", 1, call.legacy)]
    held += [make_key("t", 2, fingerprint("tool", "sunny", (), "c1"))]
    held += [make_key("t", 3, fingerprint("assistant", msgs[3].text))]
    hook = KeyedHook(held)
    state = InMemoryStateStore()
    state.compare_and_set("t", None, ConversationState(4, 4, 0, "stale anchor"))  # a rewrite
    d = Demoter(SlidingWindow.last_messages(2), hook, state=state)
    d.load("t", msgs, describer(d))
    assert d.drain(5)
    assert d.state_of("t").generation == 1  # it did re-sync
    assert hook.delivered == []  # and the hook held every message, one by its legacy key


def test_an_erase_with_the_history_reaches_the_legacy_keys_too() -> None:
    msgs = history()
    hook = KeyedHook()
    d = Demoter(SlidingWindow.last_messages(4), hook)
    describe = describer(d)
    d.erase("t", messages=msgs, describe=describe)
    call = describe(msgs[1])
    assert call.legacy is not None
    assert make_key("t", 1, call.legacy) in hook.erased
    assert make_key("t", 1, call.fingerprint) in hook.erased
    assert len(hook.erased) == len(msgs) + 1
