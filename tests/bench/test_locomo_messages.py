"""The bench's framework-message feeds: each spelling carries what the hand-made context gives."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # ``bench`` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench.locomo_messages import SPELLINGS, Framed  # noqa: E402
from bench.locomo_protocol import speaker_context  # noqa: E402
from demote.archive.context import message_context  # noqa: E402
from demote.archive.options import _describe as describe  # noqa: E402
from demote.records import DemotedMessage, Demotion, Recalled  # noqa: E402

TURNS = [
    ("user", "I adopted a puppy!", "Caroline", "1:56 pm on 8 May, 2023"),
    ("assistant", "So cute.", "Melanie", "12:48 am on 1 February, 2023"),
    ("user", "Late night again.", "Jon", "12:05 pm on 29 January, 2023"),
    ("assistant", "Morning!", "Gina", "9:27 am on 7 February, 2022"),
]


class Kept:
    """A store that keeps what it is delivered."""

    def __init__(self) -> None:
        self.batches: list[Demotion] = []

    def deliver(self, batch: Demotion) -> None:
        self.batches.append(batch)

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        return []

    def close(self) -> None:
        pass


def replayed() -> Demotion:
    return Demotion(
        "conv",
        tuple(
            DemotedMessage(role, text, i, f"k{i}", raw={"speaker": who, "date": when})  # type: ignore[arg-type]
            for i, (role, text, who, when) in enumerate(TURNS)
        ),
    )


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_each_spelling_indexes_what_the_hand_made_context_does(spelling: str) -> None:
    kept = Kept()
    Framed(kept, spelling).deliver(replayed())
    (batch,) = kept.batches
    for sent, by_hand in zip(batch.messages, replayed().messages, strict=True):
        assert not isinstance(sent.raw, dict)  # the framework message, not the replay's row
        assert "Caroline" not in sent.text and sent.data is not None
        assert message_context(sent) == speaker_context(by_hand)
        assert describe(message_context, sent) == describe(speaker_context, by_hand)
