"""The default context: the speaker and date a message carries, in every plausible spelling."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from enum import Enum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from demote import ArchiveOptions
from demote.archive import _time
from demote.archive.context import message_context
from demote.records import DemotedMessage
from tests.strategies import examples

MAY_8 = _time.Moment(date(2023, 5, 8), time(13, 56))
EPOCH = datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    "value",
    [
        "1:56 pm on 8 May, 2023",  # LoCoMo's own
        "2023-05-08T13:56:00",
        "2023-05-08T13:56:00Z",
        "2023-05-08T13:56:27.123+02:00",  # the wall clock written, not converted
        "2023-05-08 13:56",
        "20230508T135600",
        int(EPOCH),
        EPOCH + 0.5,
        int(EPOCH * 1000),
        str(int(EPOCH)),
        str(int(EPOCH * 1000)),
        str(int(EPOCH * 1_000_000)),
        str(int(EPOCH * 1_000_000_000)),
        datetime(2023, 5, 8, 13, 56, 41),
        "datetime.datetime(2023, 5, 8, 13, 56, tzinfo=datetime.timezone.utc)",
        "Mon, 08 May 2023 13:56:00 +0000",
        "May 8th, 2023 at 1:56 PM",
        "8th of May 2023, 1:56 p.m.",
        "Monday 8 May 2023 13:56",
        "08-May-2023 13:56",
        "Timestamp('2023-05-08 13:56:00')",
        "2023/05/08 13:56",
    ],
)
def test_every_spelling_of_one_moment_reads_the_same(value: object) -> None:
    assert _time.moment(value) == MAY_8


@pytest.mark.parametrize(
    ("value", "day"),
    [
        ("2023-05-08", date(2023, 5, 8)),
        ("20230508", date(2023, 5, 8)),
        (date(2023, 5, 8), date(2023, 5, 8)),
        ("datetime.date(2023, 5, 8)", date(2023, 5, 8)),
        ("8 May, 2023", date(2023, 5, 8)),
        ("Sept 3, 2023", date(2023, 9, 3)),
        ("08.05.2023", date(2023, 5, 8)),  # dotted: day first
        ("5/8/2023", date(2023, 5, 8)),  # slashed: month first...
        ("25/5/2023", date(2023, 5, 25)),  # ...unless the first cannot be a month
    ],
)
def test_a_day_without_a_time(value: object, day: date) -> None:
    assert _time.moment(value) == _time.Moment(day)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        42,  # too small for an epoch: a count, not a date
        5_000_000_000_000_000_000_000,
        float("nan"),
        float("inf"),
        "",
        "hello",
        "May 2023",  # no day
        "13:56",  # no day
        "2023-02-30",
        "31/31/2023",
        "datetime.datetime(2023, 5, 8, 25, 0)",
        ["2023-05-08"],
        {"date": "2023-05-08"},
        b"2023-05-08",
    ],
)
def test_what_is_no_date(value: object) -> None:
    assert _time.moment(value) is None


@pytest.mark.parametrize(
    ("clock", "written"),
    [
        (time(0, 48), "12:48 am on 8 May, 2023"),
        (time(12, 0), "12:00 pm on 8 May, 2023"),
        (time(9, 5), "9:05 am on 8 May, 2023"),
        (time(23, 59), "11:59 pm on 8 May, 2023"),
        (None, "8 May, 2023"),
    ],
)
def test_a_moment_is_written_as_locomo_writes_it(clock: time | None, written: str) -> None:
    found = _time.Moment(date(2023, 5, 8), clock)
    assert _time.spelled(found) == written
    assert _time.moment(written) == found
    assert _time.message_date(f"Caroline {written}") == date(2023, 5, 8)


def test_clocks_and_dates_in_a_context_string() -> None:
    assert _time.clock("at 1:56 PM") == time(13, 56)
    assert _time.clock("13:56:09") == time(13, 56)
    assert _time.clock("10am") == time(10, 0)
    assert _time.clock("5 amazing things") is None
    assert _time.clock("25:00") is None
    assert _time.message_date("Caroline 2023-05-08") == date(2023, 5, 8)  # a user's own
    assert _time.message_date("Caroline") is None


# -- the default context --------------------------------------------------------------


def form(role: str = "user", **fields: Any) -> DemotedMessage:
    return DemotedMessage(role=role, text="t", index=0, key="k", data={"role": role, **fields})  # type: ignore[arg-type]


WHEN = "1:56 pm on 8 May, 2023"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        # LangChain's form: name, additional_kwargs, response_metadata.
        (
            form(name="Caroline", extra={"additional_kwargs": {"timestamp": "2023-05-08T13:56"}}),
            {"speaker": "Caroline", "date": WHEN},
        ),
        (
            form("assistant", name="Mel", extra={"response_metadata": {"created_at": EPOCH}}),
            {"speaker": "Mel", "date": WHEN},
        ),
        # LlamaIndex's form: additional_kwargs, any key spelling.
        (
            form(extra={"additional_kwargs": {"Speaker": "Caroline", "date_time": WHEN}}),
            {"speaker": "Caroline", "date": WHEN},
        ),
        (
            form(extra={"additional_kwargs": {"sentAt": "2023-05-08T13:56:00Z", "from": "Jo"}}),
            {"speaker": "Jo", "date": WHEN},
        ),
        (
            form(extra={"additional_kwargs": {"metadata": {"author": {"name": "Mel", "id": 3}}}}),
            {"speaker": "Mel"},
        ),
        (
            form(extra={"additional_kwargs": {"meta": {"session_date": "8 May, 2023"}}}),
            {"date": "8 May, 2023"},
        ),
        # A day and a time kept apart; a duration is not a date.
        (
            form(
                extra={
                    "additional_kwargs": {
                        "total_duration": int(EPOCH),
                        "date": "2023-05-08",
                        "time": "1:56 pm",
                    }
                }
            ),
            {"date": WHEN},
        ),
        # Keys of other names: any naming a speaker or a date, any value written as a date.
        (
            form(extra={"additional_kwargs": {"sender_display_name": "Jo", "dt": int(EPOCH)}}),
            {"speaker": "Jo", "date": WHEN},
        ),
        (
            form(extra={"additional_kwargs": {"session": WHEN, "message_author": "Mel"}}),
            {"speaker": "Mel", "date": WHEN},
        ),
        (
            form(
                extra={
                    "additional_kwargs": {
                        "author_id": "u-7",
                        "sender_type": "human",
                        "version": "3.1.2024",  # digits alone: no date under such a key
                        "count": int(EPOCH),
                        "note": "I was born on 8 May 2023 and have lived here ever since",
                    }
                }
            ),
            None,
        ),
        # A legacy function call's name is the function's; usage is not metadata.
        (
            form(
                "assistant",
                extra={
                    "additional_kwargs": {
                        "function_call": {"name": "get_weather", "created_at": int(EPOCH)},
                        "meta": {"name": "Ann"},
                    },
                    "response_metadata": {"usage": {"speaker": "x", "date": "2023-05-08"}},
                },
            ),
            None,
        ),
        # A provider's response metadata names its model, not the message's date.
        (
            form(
                "assistant",
                extra={
                    "response_metadata": {
                        "model_name": "gpt-4o-2024-08-06",
                        "model": "claude-3-5-sonnet-20241022",
                        "system_fingerprint": "fp_2024-08-06",
                        "finish_reason": "stop",
                        "token_usage": {"total_tokens": 1683554160},
                        "release": "v1 2024-08-06",
                    }
                },
            ),
            None,
        ),
        (
            form(extra={"additional_kwargs": {"note": "Monday 8 May 2023 at 1:56 pm"}}),
            {"date": WHEN},
        ),
        # A name as OpenAI allows it.
        (form(name="Caroline_Smith"), {"speaker": "Caroline Smith"}),
        # The more specific key wins over the message's name.
        (
            form(name="agent", extra={"additional_kwargs": {"speaker": "Caroline"}}),
            {"speaker": "Caroline"},
        ),
        # A ChatMessage whose role is a name; LlamaIndex's own roles are no one.
        (form("assistant", extra={"type": "chat", "role": "Caroline"}), {"speaker": "Caroline"}),
        (form("assistant", extra={"role": "chatbot"}), None),
        # A tool result's name is the tool's.
        (
            form(
                "tool",
                tool="search",
                extra={"additional_kwargs": {"name": "search", "timestamp": "2023-05-08"}},
            ),
            {"date": "8 May, 2023"},
        ),
        # Nothing usable.
        (form(), None),
        (form(name="  "), None),
        (form(name="x" * 81), None),
        (form(extra={"additional_kwargs": {"timestamp": "soon", "user": 7}}), None),
        (form(extra="not a mapping"), None),
    ],
)
def test_the_default_context_reads_what_the_message_carries(
    message: DemotedMessage, expected: dict[str, str] | None
) -> None:
    assert message_context(message) == expected


class Role(str, Enum):  # noqa: UP042 (as LlamaIndex's MessageRole is)
    USER = "user"


@dataclass
class Framework:
    """A framework message's fields, as LangChain's and LlamaIndex's objects hold them."""

    role: Any = Role.USER
    name: str | None = None
    additional_kwargs: dict[str, Any] = field(default_factory=dict)
    response_metadata: dict[str, Any] = field(default_factory=dict)


def test_a_message_without_its_form_is_read_from_its_raw_object() -> None:
    at = datetime(2023, 5, 8, 13, 56, tzinfo=timezone(timedelta(hours=2)))
    raw = Framework(name="Caroline", additional_kwargs={"timestamp": at})
    message = DemotedMessage(role="user", text="t", index=0, key="k", raw=raw)
    assert message_context(message) == {"speaker": "Caroline", "date": WHEN}
    named = DemotedMessage(role="assistant", text="t", index=0, key="k", raw=Framework(name="Mel"))
    assert message_context(named) == {"speaker": "Mel"}
    for raw_ in (None, {"speaker": "Caroline"}, "Caroline"):  # not a framework message
        assert message_context(DemotedMessage("user", "t", 0, "k", raw=raw_)) is None


def test_it_is_the_archives_default_and_none_turns_it_off() -> None:
    assert ArchiveOptions().context is message_context
    assert ArchiveOptions(context=None).context is None


# -- hostile forms --------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=40)
    | st.sampled_from([WHEN, "2023-05-08", str(int(EPOCH)), "13:56", "Caroline"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["name", "speaker", "date", "timestamp", "metadata", "created_at", "x"])
            | st.text(max_size=12),
            inner,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=examples(200), deadline=None)
@given(
    role=st.sampled_from(["user", "assistant", "tool", "system"]),
    data=st.fixed_dictionaries(
        {},
        optional={
            "name": JSON,
            "extra": st.fixed_dictionaries(
                {},
                optional={"additional_kwargs": JSON, "response_metadata": JSON, "role": JSON},
            )
            | JSON,
        },
    ),
)
def test_any_form_gives_a_context_or_none_and_never_raises(role: str, data: dict[str, Any]) -> None:
    message = DemotedMessage(role=role, text="t", index=0, key="k", data=data)  # type: ignore[arg-type]
    found = message_context(message)
    assert found is None or (
        found
        and set(found) <= {"speaker", "date"}
        and all(isinstance(v, str) and v for v in found.values())
    )
    if found and "date" in found:
        assert _time.message_date(found["date"]) is not None  # written as it is read
    if role == "tool":
        assert found is None or "speaker" not in found
