"""LowWater, the default token window: cut rarely, well below the limit, leave a digest.

The properties a prompt cache needs: between cuts the window only grows at its end (the
start does not move and nothing before the newest step changes), a cut goes back well
below the limit, and the digest of what a cut dropped changes only at cuts. Plus the
digest's own contract: the identifiers an agent copies, newest first, within its budget.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from demote import ConfigError, Demoter, LowWater, PerItem, SlidingWindow
from demote.records import MessageRecord, fingerprint
from demote.state.sqlite import SQLiteStateStore
from demote.window.digest import NOTE_LEAD, identifiers, make_digest
from demote.window.tokens import approximate_tokens
from tests.strategies import Msg, agent_histories, record_of

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the policy ---------------------------------------------------------------------------


def test_token_windows_default_to_low_water_and_others_to_per_item() -> None:
    assert SlidingWindow.last_tokens(4000).eviction == LowWater()
    assert SlidingWindow(unit="tokens", limit=10).eviction == LowWater()
    assert SlidingWindow.from_json('{"unit": "tokens", "limit": 10}').eviction == LowWater()
    assert SlidingWindow.last_tokens(4000, eviction=PerItem()).eviction == PerItem()
    assert SlidingWindow.last_messages(6).eviction == PerItem()
    assert SlidingWindow.last_turns(3).eviction == PerItem()


def test_low_water_round_trips_through_json() -> None:
    policy = SlidingWindow.last_tokens(
        8000, eviction=LowWater(keep=0.4, keep_steps=0.0, digest=0.05)
    )
    assert SlidingWindow.from_json(policy.to_json()) == policy
    assert json.loads(policy.to_json())["eviction"]["kind"] == "low_water"


def test_the_default_note_is_a_share_of_the_limit_raised_to_a_useful_size() -> None:
    """15% of the limit, raised to 1,000 tokens while that is within a quarter of it."""
    default = LowWater()
    assert default.digest is None
    assert SlidingWindow.from_json(SlidingWindow.last_tokens(4000).to_json()).eviction == default
    assert [default.digest_share(n) for n in (2000, 4000, 5000, 8000, 32000)] == [
        0.25,
        0.25,
        0.2,
        0.15,
        0.15,
    ]
    # A number given is that share at any limit; keep and the note stay under the limit.
    assert LowWater(digest=0.1).digest_share(4000) == 0.1
    assert LowWater(digest=0.0).digest_share(4000) == 0.0
    assert LowWater(keep=0.8).digest_share(4000) == 0.15
    assert LowWater(keep=0.75).digest_share(4000) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"keep": 1.0}, "keep"),
        ({"keep_steps": -0.1}, "keep_steps"),
        ({"digest": 0.6}, "digest"),
        ({"keep": 0.95, "digest": 0.1}, "must stay below 1"),
        ({"keep": "half"}, "keep"),
    ],
)
def test_bad_low_water_is_a_config_error_naming_the_field(
    kwargs: dict[str, object], names: str
) -> None:
    with pytest.raises(ConfigError, match=names):
        LowWater(**kwargs)  # type: ignore[arg-type]


# -- the digest ---------------------------------------------------------------------------


def test_identifiers_are_the_pieces_agents_copy() -> None:
    text = (
        'Reservation "RSV-20931" for user_42 at 10:45; see /srv/app/models.py:118 '
        "(build 1.8.2, mail ops@example.com) okay yes plain-words andsoon"
    )
    assert list(identifiers(text)) == [
        "RSV-20931",
        "user_42",
        "/srv/app/models.py",
        "ops@example.com",
        "plain-words",
    ]
    # Short runs, runs without a digit or mark, and blobs are not identifiers.
    assert list(identifiers("abc12 word abcdefgh " + "x1" * 100)) == []


def test_identifiers_split_at_every_separator_of_the_definition() -> None:
    text = "a/b/c1d\tid_0001,ver-2.0;key:val(x_1234)[y_5678]{z_9012}<w_3456>=v_7890|u_1111'q_2222\""
    assert list(identifiers(text)) == [
        "a/b/c1d",
        "id_0001",
        "ver-2.0",
        "x_1234",
        "y_5678",
        "z_9012",
        "w_3456",
        "v_7890",
        "u_1111",
        "q_2222",
    ]


def _tool(text: str) -> MessageRecord:
    return MessageRecord("tool", text, fingerprint("tool", text), approximate_tokens(text))


def _saw(note: str) -> list[str]:
    """The identifiers of a note's result lines, in order (labels and keys left out)."""
    out = []
    for line in note.split("\n"):
        if line.startswith("["):
            out += list(identifiers(line.partition("] ")[2]))
    return out


def test_digest_is_newest_first_deduplicated_and_within_budget() -> None:
    dropped = [
        _tool("opened /a/first.py and id_0001"),
        MessageRecord("assistant", "call /a/skip.py", "f", 3),  # its text is not a result
        _tool("opened /a/second.py and id_0001 again"),
    ]
    digest = make_digest(None, dropped, 200, approximate_tokens)
    assert digest is not None and digest.startswith(NOTE_LEAD)
    assert _saw(digest) == ["/a/second.py", "id_0001", "/a/first.py"]
    again = make_digest(digest, [_tool("wrote /b/third.py")], 200, approximate_tokens)
    assert again is not None
    assert _saw(again)[:2] == ["/b/third.py", "/a/second.py"]


def test_digest_budget_keeps_the_newest_and_nothing_new_keeps_the_old() -> None:
    many = [_tool(f"file /src/module_{i:04d}.py") for i in range(500)]
    digest = make_digest(None, many, 120, approximate_tokens)
    assert digest is not None
    assert approximate_tokens(digest) <= 120
    kept = _saw(digest)
    assert kept[0] == "/src/module_0499.py"
    assert "/src/module_0000.py" not in kept
    assert make_digest(digest, [_tool("no identifiers here at all")], 120, approximate_tokens) == (
        digest
    )
    assert make_digest(None, many, 5, approximate_tokens) is None  # no room for any


# -- the window through the engine --------------------------------------------------------


def _records(msgs: list[Msg]) -> list[MessageRecord]:
    return [record_of(m) for m in msgs]


def _shown(window: object) -> list[tuple[str, str]]:
    w = window  # a Window[MessageRecord]
    out = [(r.role, r.text) for r in w.pinned]  # type: ignore[attr-defined]
    if w.summary is not None:  # type: ignore[attr-defined]
        out.append(("summary", w.summary))  # type: ignore[attr-defined]
    if w.opener is not None:  # type: ignore[attr-defined]
        out.append((w.opener.role, w.opener.text))  # type: ignore[attr-defined]
    for i, r in enumerate(w.messages, w.start):  # type: ignore[attr-defined]
        out.append((r.role, w.replacement(i) or r.text))  # type: ignore[attr-defined]
    return out


@SETTINGS
@given(
    msgs=agent_histories(),
    limit=st.integers(30, 200),
    ev=st.sampled_from([LowWater(), LowWater(keep_steps=0.0, digest=0.0), LowWater(keep=0.8)]),
)
def test_between_cuts_the_window_only_grows_at_its_end(
    msgs: list[Msg], limit: int, ev: LowWater
) -> None:
    """Replayed load by load: a window extends the previous one unless its start moved.

    What the model is sent (pinned, the digest, the opener, the kept messages with their
    placeholders) is byte-identical up to the newest messages between cuts, so a prompt
    cache reads all of it; only a cut (the start moves) changes anything before the end.
    """
    policy = SlidingWindow.last_tokens(limit, eviction=ev)
    records = _records(msgs)
    demoter = Demoter(policy)
    previous: tuple[int, list[tuple[str, str]]] | None = None
    try:
        for end in range(1, len(records) + 1):
            window = demoter.load("c", records[:end], lambda r: r)
            shown = _shown(window)
            if previous is not None and window.start == previous[0]:
                assert shown[: len(previous[1])] == previous[1], "changed between cuts"
            previous = (window.start, shown)
    finally:
        demoter.close()


def test_a_cut_drops_steps_leaves_their_identifiers_and_goes_well_below_the_limit() -> None:
    steps: list[Msg] = [Msg("user", "fix the bug in the parser " * 5)]
    for i in range(40):
        cid = f"call_{i}"
        steps.append(Msg("assistant", f"looking {i}", opens=(cid,)))
        steps.append(Msg("tool", f"found /src/pkg/mod_{i:03d}.py line {i} " * 6, answers=cid))
    records = _records(steps)
    limit = 600
    demoter = Demoter(SlidingWindow.last_tokens(limit))
    starts: list[int] = []
    try:
        for end in range(2, len(records) + 1):
            window = demoter.load("c", records[:end], lambda r: r)
            starts.append(window.start)
        assert window.opener is not None and window.opener.text == records[0].text
        assert window.summary is not None and window.summary.startswith(NOTE_LEAD)
        assert "/src/pkg/mod_000.py" not in [r.text for r in window.messages]
        dropped = [i for i in range(40) if 2 * i + 1 < window.start]
        assert dropped and f"/src/pkg/mod_{dropped[-1]:03d}.py" in window.summary
        moves = sum(1 for a, b in pairwise(starts) if b != a)
        assert 0 < moves <= len(starts) // 4, (moves, len(starts))  # cuts are rare
    finally:
        demoter.close()


def _agent_run(steps: int) -> list[MessageRecord]:
    msgs: list[Msg] = [Msg("user", "fix the bug in the parser " * 5)]
    for i in range(steps):
        cid = f"call_{i}"
        msgs.append(Msg("assistant", f"looking {i}", opens=(cid,)))
        msgs.append(Msg("tool", f"found /src/pkg/mod_{i:03d}.py line {i} " * 6, answers=cid))
    return _records(msgs)


def test_a_restarted_process_sends_the_same_window_and_digest(tmp_path: Path) -> None:
    """The digest is committed with the window start: a new process (a new Demoter on the
    same durable store) sends byte for byte what the old one sent, so the cache holds."""
    records = _agent_run(40)
    policy = SlidingWindow.last_tokens(600)
    first = Demoter(policy, state=SQLiteStateStore(tmp_path / "state.db"))
    try:
        for end in range(2, len(records)):
            before = first.load("c", records[:end], lambda r: r)
    finally:
        first.close()
    assert before.summary is not None and before.summary.startswith(NOTE_LEAD)
    again = Demoter(policy, state=SQLiteStateStore(tmp_path / "state.db"))
    try:
        after = again.load("c", records[: len(records) - 1], lambda r: r)
    finally:
        again.close()
    assert _shown(after) == _shown(before)


def test_a_hostile_tool_result_leaves_a_digest_within_its_budget() -> None:
    """NULs, huge blobs, unpaired surrogates' stand-ins, long unicode runs: the digest is
    still text within its budget, and the window stays within the limit."""
    blob = "x1" * 50_000
    hostile = (
        "\x00id_\x00000001 "
        + blob
        + " /päth/ünï/cödé_1.py \u202e/rtl/override_2 "
        + "💥/emoji/path_3.txt " * 200
    )
    msgs: list[Msg] = [Msg("user", "go")]
    for i in range(30):
        msgs.append(Msg("assistant", f"step {i}", opens=(f"c{i}",)))
        msgs.append(Msg("tool", hostile if i % 3 == 0 else f"ok run_{i:04d}", answers=f"c{i}"))
    records = _records(msgs)
    limit = 800
    demoter = Demoter(SlidingWindow.last_tokens(limit))
    try:
        for end in range(2, len(records) + 1):
            window = demoter.load("c", records[:end], lambda r: r)
            if window.summary is not None:
                assert approximate_tokens(window.summary) <= int(
                    limit * LowWater().digest_share(limit)
                )
                assert blob not in window.summary
        assert window.summary is not None and "/päth/ünï/cödé_1.py" in window.summary
    finally:
        demoter.close()


def test_a_cut_whose_newest_step_fills_the_limit_leaves_the_note_out() -> None:
    """Only what cannot be cut may stand over the limit: the note can be cut."""
    records = _agent_run(60)
    limit = 1000
    demoter = Demoter(SlidingWindow.last_tokens(limit))
    try:
        for end in range(2, len(records) + 1):
            window = demoter.load("c", records[:end], lambda r: r)
        assert window.summary is not None  # cuts left a note
        # A newest step that, with the opener, leaves the note no room.
        big = [
            *records,
            record_of(Msg("assistant", "thinking " * 420, opens=("big",))),
            record_of(Msg("tool", "ok", answers="big")),
        ]
        window = demoter.load("c", big, lambda r: r)
        rest = sum(r.tokens for r in window.messages) + window.opener.tokens  # type: ignore[union-attr]
        assert rest <= limit
        note = 0 if window.summary is None else approximate_tokens(window.summary) + 24
        assert rest + note <= limit + 16, "the note made the request go over"
        # The next call, the same step still newest: nothing changes, nothing goes over.
        again = demoter.load("c", big, lambda r: r)
        assert again.summary == window.summary and again.start == window.start
    finally:
        demoter.close()
