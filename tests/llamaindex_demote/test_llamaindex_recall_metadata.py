"""A LlamaIndex message's own speaker and date reach the archive's index with no ``context=``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from llama_index.core.base.llms.types import ChatMessage

from demote import Demoter, SlidingWindow, SQLiteArchive
from llamaindex_demote import RECALL_PREFIX, DemotingMemory

QUESTION = "What did Melanie paint?"
CHAT = [
    ChatMessage(
        role="user",
        content="Melanie, I love painting sunsets.",
        additional_kwargs={"speaker": "Caroline", "timestamp": datetime(2023, 5, 8, 13, 56)},
    ),
    ChatMessage(role="assistant", content="Trains run on time."),
    ChatMessage(role="user", content="Tell me about trains."),
    ChatMessage(
        role="assistant",
        content="I painted a lake.",
        additional_kwargs={"metadata": {"author": "Melanie", "created_at": 1689882900}},
    ),
    *(
        ChatMessage(role=role, content=text)
        for i in range(12)
        for role, text in (("user", f"Tell me about buses {i}."), ("assistant", f"Buses run {i}."))
    ),
]


def archived(tmp_path: Path, name: str, **options: object) -> tuple[SQLiteArchive, DemotingMemory]:
    """``CHAT`` put in a memory of two messages, its long tail into a new archive."""
    archive = SQLiteArchive(tmp_path / f"{name}.db", **options)  # type: ignore[arg-type]
    demoter = Demoter(SlidingWindow.last_messages(2), archive, hook_wait=None)
    memory = DemotingMemory.from_defaults(
        demoter=demoter, recall=archive, recall_k=1, chat_store_key="chat"
    )
    for message in CHAT:
        memory.put(message)
        memory.get()  # a load: what left the window is delivered
    return archive, memory


def test_the_speaker_and_date_a_message_carries_are_indexed(tmp_path: Path) -> None:
    archive, memory = archived(tmp_path, "default")
    plain, _ = archived(tmp_path, "plain", context=None)  # the text only, as before
    try:
        assert archive.count("chat") == plain.count("chat") == len(CHAT) - 2
        # Caroline's turn names Melanie; Melanie's own turn is the answer.
        assert plain.search("chat", QUESTION, k=1)[0].text.startswith("Melanie, I love")
        assert archive.search("chat", QUESTION, k=1)[0].text == "I painted a lake."
        recalled = [m.content or "" for m in memory.get(input=QUESTION)]
        assert [t for t in recalled if t.startswith(RECALL_PREFIX) and "lake" in t] != []
        # The dates: a datetime object and epoch seconds, indexed in one spelling.
        assert [h.text for h in archive.search("chat", "in July", k=3)] == ["I painted a lake."]
        assert {h.text for h in archive.search("chat", "2023", k=5)} == {
            CHAT[0].content,
            CHAT[3].content,
        }
        assert plain.search("chat", "in July", k=3) == []
    finally:
        archive.close()
        plain.close()
