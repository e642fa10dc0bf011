"""``budget_tokens`` reaches the archive through every adapter's recall option.

A real SQLiteArchive holds a conversation whose demoted turns all match the question; with
a budget, what the model is sent (or the retriever returns) fits it, best hits first, and
without one only ``k`` bounds it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage
from llama_index.core.llms import ChatMessage

from demote import Demoter, SlidingWindow, SQLiteArchive
from demote.errors import ConfigError
from demote.request import RECALL_PREFIX
from demote.window.tokens import approximate_tokens
from langchain_demote import DemotingChatMessageHistory, archive_retriever
from llamaindex_demote import DemotingMemory

FACTS = [f"the hiking trip number {i} went to the alps with a leaky tent" for i in range(12)]


@pytest.fixture
def archive(tmp_path: Path) -> SQLiteArchive:
    archive = SQLiteArchive(tmp_path / "archive.db")
    d = Demoter(SlidingWindow.last_messages(2), archive)
    history = DemotingChatMessageHistory(InMemoryChatMessageHistory(), d, "c")
    for fact in FACTS:
        history.add_messages([HumanMessage(fact), AIMessage("noted")])
        history.messages  # noqa: B018 - a read demotes
    assert archive.count("c") >= 20
    return archive


def _tokens(texts: list[str]) -> int:
    return sum(approximate_tokens(t) for t in texts)


def test_the_retriever_keeps_to_its_budget(archive: SQLiteArchive) -> None:
    free = archive_retriever(archive, "c", k=8).invoke("hiking trip alps tent")
    capped = archive_retriever(archive, "c", k=8, budget_tokens=30).invoke("hiking trip alps tent")
    assert len(free) == 8
    assert 0 < len(capped) < len(free)
    assert [d.page_content for d in capped] == [d.page_content for d in free][: len(capped)]
    with pytest.raises(ConfigError, match="budget_tokens"):
        archive_retriever(archive, "c", budget_tokens=0)


async def test_the_llamaindex_memory_keeps_to_its_budget(tmp_path: Path) -> None:
    archive = SQLiteArchive(tmp_path / "li.db")

    def run(cid: str, budget: int | None) -> DemotingMemory:
        memory = DemotingMemory.from_defaults(
            demoter=Demoter(SlidingWindow.last_messages(2), archive),
            recall=archive,
            recall_k=8,
            recall_budget_tokens=budget,
            chat_store_key=cid,
        )
        for fact in FACTS:
            memory.put_messages(
                [
                    ChatMessage(role="user", content=fact),
                    ChatMessage(role="assistant", content="ok"),
                ]
            )
            memory.get()
        memory.put(ChatMessage(role="user", content="hiking trip alps tent?"))
        return memory

    def recalled(messages: list[ChatMessage]) -> list[str]:
        found = [m for m in messages if (m.content or "").startswith(RECALL_PREFIX)]
        return [line for m in found for line in (m.content or "").splitlines()[1:]]

    # The budget is what the recall message costs as sent: its lead and framing too.
    free, capped = run("free", None), run("capped", 60)
    got_free, got_capped = recalled(free.get()), recalled(await capped.aget())
    assert len(got_free) > len(got_capped) > 0
    assert recalled(capped.get()) == got_capped


def test_the_agents_middleware_passes_its_budget(tmp_path: Path) -> None:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel

    from langchain_demote import DemotingMiddleware

    archive = SQLiteArchive(tmp_path / "lc.db")
    seen: list[list[str]] = []

    class Model(FakeMessagesListChatModel):
        def _generate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def]
            seen.append([str(m.content) for m in messages if m.text.startswith(RECALL_PREFIX)])
            return super()._generate(messages, stop, run_manager, **kwargs)

    history = [m for fact in FACTS for m in (HumanMessage(fact), AIMessage("noted"))]

    def run(cid: str, budget: int | None) -> list[str]:
        seen.clear()
        d = Demoter(SlidingWindow.last_messages(2), archive)
        middleware = DemotingMiddleware(
            demoter=d,
            recall=archive,
            recall_k=8,
            recall_budget_tokens=budget,
            conversation_id=lambda runtime: cid,
        )
        agent = create_agent(Model(responses=[AIMessage("ok")]), [], middleware=[middleware])
        agent.invoke({"messages": [*history, HumanMessage("hiking trip alps tent?")]})
        return [line for block in seen[-1] for line in block.splitlines()[1:]]

    free, capped = run("free", None), run("capped", 60)
    assert len(free) > len(capped) > 0
