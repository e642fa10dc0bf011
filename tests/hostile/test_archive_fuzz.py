"""The catalogue, archive, fuzzed: Hypothesis drives ids, texts, queries and options.

What is written is found by its own words and never by another conversation's search;
every value is either used correctly or refused with a DemoteError naming its argument.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from demote import SQLiteArchive
from demote._validate import MAX_COUNT
from demote.errors import ConversationIdError, DemoteError
from demote.records import Recalled, storable_text
from demote.state.base import validate_conversation_id
from tests.hostile.test_archive import demotion

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Any text, lone surrogates and NUL included.
ANY_TEXT = st.text(
    st.one_of(
        st.characters(codec=None),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        st.sampled_from('\x00"*:^(){}-+'),
    ),
    max_size=60,
)
#: Ids: the odd text above, and values that are not ids at all.
IDS = st.one_of(ANY_TEXT, st.none(), st.integers(), st.binary(max_size=8))
#: Whatever a caller might pass as a number.
NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.text(max_size=4),
)


def usable(cid: object) -> bool:
    try:
        validate_conversation_id(cid)
    except ConversationIdError:
        return False
    return True


def marker(n: int) -> str:
    return f"zqmark{n}word"


@FUZZ
@given(ids=st.lists(IDS, min_size=1, max_size=4), texts=st.lists(ANY_TEXT, max_size=4))
def test_what_is_written_is_found_by_its_words_and_only_in_its_conversation(
    ids: list[object], texts: list[str]
) -> None:
    with SQLiteArchive(":memory:") as archive:
        stored: dict[str, set[str]] = {}
        total = 0
        for n, cid in enumerate(ids):
            batch = demotion(cid, [f"{marker(n)} {t}" for t in [*texts, ""]])
            if not usable(cid):
                try:
                    archive.deliver(batch)
                except ConversationIdError as exc:
                    assert "conversation_id" in str(exc)
                    continue
                raise AssertionError(f"accepted the id {cid!r}")
            assert isinstance(cid, str)
            archive.deliver(batch)
            total += len(batch.messages)
            stored.setdefault(cid, set()).update(storable_text(m.text) for m in batch.messages)
        assert archive.count() == total
        for n, cid in enumerate(ids):
            if not isinstance(cid, str) or cid not in stored:
                continue
            hits = archive.search(cid, marker(n), k=50)
            assert {h.text for h in hits} <= stored[cid]  # never another conversation's
            assert any(marker(n) in h.text for h in hits)  # found by its own word
            for other in stored.keys() - {cid}:
                assert not any(marker(n) in h.text for h in archive.search(other, marker(n)))


@FUZZ
@given(query=st.one_of(ANY_TEXT, st.none(), st.binary(max_size=8), st.integers()), k=NUMBERS)
def test_any_query_and_k_is_answered_or_refused_by_name(query: object, k: object) -> None:
    with SQLiteArchive(":memory:") as archive:
        archive.deliver(demotion("A", ["the garden has tomatoes", "zebra crossing"]))
        archive.deliver(demotion("B", ["giraffe spotted near the garden"]))
        try:
            hits = archive.search("A", query, k=k)  # type: ignore[arg-type]
        except DemoteError as exc:
            named = "query" if not isinstance(query, str) else "k"
            assert named in str(exc), exc
            ok_k = isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= MAX_COUNT
            assert not (isinstance(query, str) and ok_k), f"refused a good call: {exc}"
            return
        assert isinstance(query, str)
        assert isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= MAX_COUNT
        assert all(isinstance(h, Recalled) for h in hits) and len(hits) <= k
        assert {h.text for h in hits} <= {"the garden has tomatoes", "zebra crossing"}


OPTIONS = ["context_weight", "adjacent_weight", "coverage", "neighbours", "speaker_weight"]


@FUZZ
@given(
    option=st.sampled_from([*OPTIONS, "dense_weight", "pool", "after", "timeout"]), value=NUMBERS
)
def test_any_number_for_an_option_is_taken_or_refused_by_name(option: str, value: object) -> None:
    try:
        archive = SQLiteArchive(":memory:", **{option: value})  # type: ignore[arg-type]
    except DemoteError as exc:
        assert option in str(exc), exc
        assert not acceptable(option, value), f"refused a good value: {exc}"
        return
    archive.close()
    assert acceptable(option, value), f"accepted {option}={value!r}"


def acceptable(option: str, value: object) -> bool:
    """The documented range of each option."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if option in ("pool", "after"):
        return isinstance(value, int) and (1 if option == "pool" else 0) <= value <= MAX_COUNT
    if option == "timeout" and isinstance(value, int) and value > 1e9:
        return False
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return False
    if not math.isfinite(number) or number < 0:  # every finite float is a number
        return False
    if option == "dense_weight":
        return number <= 1
    if option == "timeout":
        return 0 < number <= 1e9
    return True
