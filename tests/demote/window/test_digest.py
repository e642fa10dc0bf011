"""The note a cut leaves (issue 36): what the dropped steps asked, did and saw.

Its contract: identifiers with what they are (the call that produced them, their key,
their line), a trail of the agent's own calls, the requests of earlier turns, credentials
redacted, newest first within its budget, surviving several cuts, and a pure function of
the previous note and what the cut drops (a chat's cut leaves it as it was).
"""

from __future__ import annotations

from demote.records import MessageRecord, fingerprint
from demote.window.digest import (
    DIGEST_LEAD,
    NOTE_LEAD,
    REDACTED,
    DroppedCall,
    identifiers,
    make_digest,
    redact,
)
from demote.window.tokens import approximate_tokens


def _rec(role: str, text: str, **kw: object) -> MessageRecord:
    return MessageRecord(role, text, fingerprint(role, text), approximate_tokens(text), **kw)  # type: ignore[arg-type]


def _step(call_id: str, name: str, args: dict[str, object], result: str) -> tuple:
    call = _rec("assistant", "", opens=(call_id,))
    res = _rec("tool", result, answers=call_id, tool=name)
    return [call, res], [(DroppedCall(call_id, name, args),), ()]


def _steps(*steps: tuple) -> tuple[list[MessageRecord], list[tuple[DroppedCall, ...]]]:
    records: list[MessageRecord] = []
    calls: list[tuple[DroppedCall, ...]] = []
    for recs, cs in steps:
        records += recs
        calls += cs
    return records, calls


def test_sentence_ends_are_not_identifiers_and_marks_still_are() -> None:
    text = "The fix is described above. It loaded. See /srv/app/x.py. Version 1.8.2, done."
    assert list(identifiers(text)) == ["/srv/app/x.py"]
    assert list(identifiers("token-1 user_42. ZFA04Y loaded.")) == ["token-1", "user_42", "ZFA04Y"]


def test_identifiers_come_with_their_source_key_and_line() -> None:
    records, calls = _steps(
        _step(
            "c1",
            "get_booking",
            {"code": "ZFA04Y"},
            '{"reservation_id": "ZFA04Y", "flight": "8JD3KQ", "note": "window seat"}',
        ),
        _step(
            "c2",
            "Read",
            {"file_path": "/srv/app/views.py"},
            "41\tdef show(request):\n42\t    booking = load_booking(request.GET['code'])\n",
        ),
    )
    note = make_digest(None, records, 400, approximate_tokens, calls)
    assert note is not None and note.startswith(NOTE_LEAD)
    lines = note.split("\n")
    saw = lines[lines.index("Saw:") + 1 :]
    # Newest source first; each under the call that produced it, with its line number.
    assert saw[0] == "[Read /srv/app/views.py] 42: load_booking request.GET"
    # A value with its key: which code is the reservation and which the flight.
    assert saw[1] == "[get_booking ZFA04Y] reservation_id=ZFA04Y flight=8JD3KQ"
    # The trail of the agent's own calls, newest first, with their arguments.
    did = lines[lines.index("Did:") + 1 : lines.index("Saw:")]
    assert did == ["- Read file_path=/srv/app/views.py", "- get_booking code=ZFA04Y"]


def test_requests_of_earlier_turns_are_kept_and_the_note_spans_them() -> None:
    first, calls1 = _steps(_step("a", "ls", {"path": "/repo"}, "src/app_v1.py\nsrc/db_v2.py"))
    dropped = [_rec("user", "Build the booking page for flight search"), *first]
    note = make_digest(None, dropped, 800, approximate_tokens, [(), *calls1])
    assert note is not None
    second, calls2 = _steps(_step("b", "Read", {"file_path": "src/app_v1.py"}, "1\timport x_1"))
    again = make_digest(
        note, [_rec("user", "Now add tests"), *second], 800, approximate_tokens, [(), *calls2]
    )
    assert again is not None
    lines = again.split("\n")
    asked = lines[lines.index("Asked:") + 1 : lines.index("Did:")]
    assert asked == ["> Now add tests", "> Build the booking page for flight search"]
    # The first cut's entries survive the second, after the new ones.
    assert "- Read file_path=src/app_v1.py" in lines and "- ls path=/repo" in lines
    assert lines.index("- Read file_path=src/app_v1.py") < lines.index("- ls path=/repo")
    assert "[ls /repo] src/app_v1.py src/db_v2.py" in lines


def test_credentials_are_redacted_not_repeated() -> None:
    records, calls = _steps(
        _step(
            "c",
            "Read",
            {"file_path": "tests/fixtures.js"},
            "3\tconst user = 'senior_user';\n4\tconst password = 'Passw0rd!23';\n"
            '5\theaders: {"Authorization": "Bearer eyJhbGciOi.eyJzdWIiOi.c2lnbmF0dXJl"}\n'
            "6\tapi_key=sk-abcdefghijklmnopqrstuvwx",
        )
    )
    note = make_digest(None, records, 400, approximate_tokens, calls)
    assert note is not None
    for secret in ("Passw0rd!23", "eyJhbGciOi", "sk-abcdefghijklmnopqrstuvwx"):
        assert secret not in note
    assert "senior_user" in note
    assert redact('"password": "hunter22"') == f'"password": "{REDACTED}"'
    assert redact("DB_PASSWORD=hunter22 x") == f"DB_PASSWORD={REDACTED} x"
    # A name that holds the word is not a credential.
    assert redact("test_auth.py::TestPasswordHashing::test_x") == (
        "test_auth.py::TestPasswordHashing::test_x"
    )


def test_a_chat_cut_keeps_the_note_as_it_was() -> None:
    chat = [_rec("user", "hello there 2024-01-01"), _rec("assistant", "hi, see ticket_123")]
    assert make_digest(None, chat, 400, approximate_tokens) is None
    records, calls = _steps(_step("c", "ls", {"path": "/a"}, "file_0001.txt"))
    note = make_digest(None, records, 400, approximate_tokens, calls)
    assert make_digest(note, chat, 400, approximate_tokens) == note


def test_the_note_fits_its_budget_and_leaves_when_nothing_fits() -> None:
    steps = [
        _step(f"c{i}", "Read", {"file_path": f"/src/m_{i:03d}.py"}, f"1\tdef f_{i:04d}(): pass")
        for i in range(200)
    ]
    records, calls = _steps(*steps)
    for budget in (120, 300, 800):
        note = make_digest(None, records, budget, approximate_tokens, calls)
        assert note is not None
        assert approximate_tokens(note) + 24 <= budget
        assert "/src/m_199.py" in note and "/src/m_000.py" not in note
    old = make_digest(None, records, 800, approximate_tokens, calls)
    # Over the limit, the note is what gives way: a smaller budget cuts it, none drops it.
    assert make_digest(old, [], 60, approximate_tokens) is None
    smaller = make_digest(old, [], 200, approximate_tokens)
    assert smaller is not None and approximate_tokens(smaller) + 24 <= 200


def test_an_earlier_release_list_is_read_back_as_the_oldest_entries() -> None:
    legacy = DIGEST_LEAD + "/srv/old_1.py id_0042"
    records, calls = _steps(_step("c", "ls", {"path": "/srv"}, "new_0001.py"))
    note = make_digest(legacy, records, 400, approximate_tokens, calls)
    assert note is not None
    assert note.split("\n")[-1] == "[earlier] /srv/old_1.py id_0042"


def test_the_note_is_a_pure_function() -> None:
    records, calls = _steps(_step("c", "grep", {"pattern": "x"}, "a.py:3: x_1 = 2\nb.py:9: y_22"))
    first = make_digest("prev", records, 300, approximate_tokens, calls)
    assert first == make_digest("prev", list(records), 300, approximate_tokens, list(calls))


def test_a_result_is_labelled_by_the_whole_identifier_it_was_called_on() -> None:
    """A long path is named whole (not cut to a useless head), flags are not a label, and
    the label's identifier is not repeated beside it, unless the result gives it a key."""
    path = (
        "/Users/someone/Documents/projects/eagle-point/TASK-121/repo/src/__tests__/import.test.ts"
    )
    records, calls = _steps(
        _step(
            "e1",
            "Edit",
            {"replace_all": False, "file_path": path, "old_string": "a b", "new_string": "c d"},
            f"The file {path} has been updated. See snippet_42 for the change.",
        ),
        _step(
            "g1",
            "get_order",
            {"order_id": "ORD-8812"},
            '{"order_id": "ORD-8812", "sku": "SKU-7781"}',
        ),
    )
    note = make_digest(None, records, 600, approximate_tokens, calls)
    assert note is not None
    lines = note.split("\n")
    saw = lines[lines.index("Saw:") + 1 :]
    assert saw == [
        "[get_order ORD-8812] order_id=ORD-8812 sku=SKU-7781",
        f"[Edit {path}] snippet_42",
    ]
    did = lines[lines.index("Did:") + 1 : lines.index("Saw:")]
    assert did[1] == f"- Edit replace_all=False file_path={path} old_string=a b new_string=c d"


def test_an_older_line_left_without_items_loses_its_line_numbers() -> None:
    """When a newer result holds an older line's identifiers, its ``N:`` markers go too."""
    old, old_calls = _steps(
        _step("r1", "Read", {"file_path": "/srv/a.py"}, "7\tload_booking()\n9\tsave_booking()\n"),
    )
    first = make_digest(None, old, 600, approximate_tokens, old_calls)
    assert first is not None and "7: load_booking 9: save_booking" in first
    new, new_calls = _steps(_step("g1", "Grep", {"pattern": "booking"}, "a.py: load_booking"))
    second = make_digest(first, new, 600, approximate_tokens, new_calls)
    assert second is not None
    assert "[Read /srv/a.py] 9: save_booking" in second.split("\n")
    assert "7:" not in second
