"""A LangChain message's own speaker and date reach the archive's index with no ``context=``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from demote import Demoter, SlidingWindow, SQLiteArchive
from langchain_demote import DemotingChatMessageHistory
from langchain_demote.messages import from_data, to_data

QUESTION = "What did Melanie paint?"
CHAT: list[BaseMessage] = [
    HumanMessage(
        "Melanie, I love painting sunsets.",
        name="Caroline",
        additional_kwargs={"timestamp": datetime(2023, 5, 8, 13, 56, tzinfo=UTC)},
    ),
    AIMessage("Trains run on time."),
    HumanMessage("Tell me about trains."),
    AIMessage(
        "I painted a lake.",
        name="Melanie",
        response_metadata={"created_at": "2023-07-20T19:55:00Z", "model_name": "fake"},
    ),
    *(
        m
        for i in range(12)
        for m in (HumanMessage(f"Tell me about buses {i}."), AIMessage(f"Buses run {i}."))
    ),
]


def archived(tmp_path: Path, name: str, **options: object) -> SQLiteArchive:
    """``CHAT`` through a history of two messages, its long tail into a new archive."""
    archive = SQLiteArchive(tmp_path / f"{name}.db", **options)  # type: ignore[arg-type]
    demoter = Demoter(SlidingWindow.last_messages(2), archive, hook_wait=None)
    history = DemotingChatMessageHistory(InMemoryChatMessageHistory(), demoter, "chat")
    for message in CHAT:
        history.add_messages([message])
        assert len(history.messages) <= 2
    return archive


def test_the_speaker_and_date_a_message_carries_are_indexed(tmp_path: Path) -> None:
    archive = archived(tmp_path, "default")
    plain = archived(tmp_path, "plain", context=None)  # the text only, as before
    try:
        assert archive.count("chat") == plain.count("chat") == len(CHAT) - 2
        # Caroline's turn names Melanie twice; Melanie's own turn is the answer.
        assert plain.search("chat", QUESTION, k=1)[0].text.startswith("Melanie, I love")
        assert archive.search("chat", QUESTION, k=1)[0].text == "I painted a lake."
        # The dates: a datetime object and an ISO string, indexed in one spelling.
        assert [h.text for h in archive.search("chat", "in July", k=3)] == ["I painted a lake."]
        assert plain.search("chat", "in July", k=3) == []
        # What comes back is the message as it was.
        back = from_data(archive.messages("chat")[3].data or {})
        assert back.name == "Melanie" and back.response_metadata == CHAT[3].response_metadata
    finally:
        archive.close()
        plain.close()


@pytest.mark.parametrize(
    "value",
    [
        datetime(2023, 5, 8, 13, 56),
        datetime(2023, 5, 8, 13, 56, tzinfo=UTC).date(),
    ],
)
def test_dates_in_the_neutral_form_are_iso_8601(value: object) -> None:
    data = to_data(HumanMessage("hi", additional_kwargs={"at": value}))
    assert data["extra"]["additional_kwargs"]["at"] == value.isoformat()  # type: ignore[attr-defined]
