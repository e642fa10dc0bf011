"""A task pasted whole: the opener in front of the kept steps is clipped, not the live question.

A user pastes a ~7,000-token task (the instruction, a long log, the instruction again at
the end) and the agent makes ten small tool calls under ``last_tokens(4000)`` with a SQLite
archive. The first model call gets the task whole (the live question is never cut). From
the first step on, the window starts inside the turn and shows the task in front of the
kept steps: over ``max_result_tokens`` it is sent as its head and its tail around a marker
naming its archived key, so every later request is within the limit (LangChain's count,
system prompt and tools included), says what the task is, and repeats the same bytes from
call to call. The archive holds the task whole and ``recall_tool`` fetches the middle.
A chat's long question is sent whole: clipping is for the opener of a cut turn alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from demote import ConversationState, Demoter, SlidingWindow, SQLiteArchive
from demote.engine import PROGRESS_PREFIX
from demote.window.planner import plan
from langchain_demote import recall_tool
from langchain_demote.messages import message_text
from langchain_demote.middleware import DemotingMiddleware
from langchain_demote.provider_rules import violations
from tests.langchain_demote.support import ScriptedToolModel
from tests.strategies import Msg, record_of

LIMIT = 4000
SYSTEM = "You fix builds."
STEPS = 10
HEAD = "Fix the import error in src/app/loader.py that the log below shows. "
LOG = "\n".join(f"05:{i // 60:02d}:{i % 60:02d} worker-{i % 9} ok batch={i}" for i in range(1000))
TAIL = " When it passes, run the whole suite and tell me which tests changed."
TASK = HEAD + "\n" + LOG + "\n" + TAIL  # ~7,000 tokens


@tool
def check(n: int) -> str:
    """Run check ``n``."""
    return f"check {n}: passed " + "fine " * 60


class Checker(ScriptedToolModel):
    """Runs checks 1..STEPS, then answers."""

    def reply(self, messages: list[BaseMessage], last_human: int) -> AIMessage:
        calls = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
        n = int(calls[-1].tool_calls[0]["args"]["n"]) + 1 if calls else 1
        if n > STEPS:
            return AIMessage("Done.")
        return AIMessage("", tool_calls=[{"name": "check", "args": {"n": n}, "id": f"c{n}"}])


def _task_shown(sent: list[BaseMessage]) -> str:
    (task,) = [
        message_text(m)
        for m in sent
        if isinstance(m, HumanMessage) and not message_text(m).startswith(PROGRESS_PREFIX)
    ]
    return task


def test_the_pasted_task_is_clipped_in_front_of_the_steps_within_the_limit(
    tmp_path: Path,
) -> None:
    archive = SQLiteArchive(str(tmp_path / "archive.db"))
    model = Checker()
    agent = create_agent(
        model,
        [check],
        system_prompt=SYSTEM,
        checkpointer=InMemorySaver(),
        middleware=[DemotingMiddleware(Demoter(SlidingWindow.last_tokens(LIMIT), archive))],
    )
    config: dict[str, Any] = {"configurable": {"thread_id": "task-7"}}
    result = agent.invoke({"messages": [HumanMessage(TASK)]}, config)
    assert result["messages"][-1].content == "Done."
    assert result["messages"][0].content == TASK  # the state keeps it whole
    assert count_tokens_approximately([HumanMessage(TASK)]) > 6500
    tools = count_tokens_approximately([], tools=[check])

    first = model.calls[0]
    assert _task_shown(first) == TASK, "the live question is sent whole"
    shown: list[str] = []
    for k, sent in enumerate(model.calls[1:], 1):
        assert violations(sent) == [], k
        tokens = count_tokens_approximately(sent) + tools
        assert tokens <= LIMIT, (k, tokens)
        task = _task_shown(sent)
        assert task.startswith(HEAD) and task.endswith(TAIL), k
        assert len(task) < len(TASK) // 3
        shown.append(task)
    assert len(shown) == STEPS
    assert len(set(shown)) == 1, "the same bytes at every call"

    key = re.search(r"archived as key ([0-9a-f]{32})", shown[0])
    assert key is not None
    archived = archive.fetch("task-7", key.group(1))
    assert archived is not None and archived.text == TASK
    middle = LOG[len(LOG) // 2 : len(LOG) // 2 + 800]
    assert middle not in shown[0]
    # The model reads the middle back as the cut answer says: page by page from the key.
    tool, read, start = recall_tool(archive), "", 0
    for _ in range(20):
        page = tool.invoke({"key": key.group(1), "start": start}, config=config)
        assert count_tokens_approximately([HumanMessage(page)]) < 2100
        body = re.sub(r"^\[[^\]]*\](?: …\(from character \d+ of \d+\))? ", "", page)
        more = re.search(r" …\[cut: the message is \d+ tokens; read on with start=(\d+)\]$", body)
        read += body[: more.start() if more else None]
        if more is None:
            break
        start = int(more.group(1))
    assert read == TASK


def test_a_long_question_in_a_chat_is_sent_whole() -> None:
    # A pasted document the user asks about is the live question: counted and sent whole,
    # even over the clipping size (half the limit).
    records = [record_of(Msg("system", SYSTEM)), record_of(Msg("user", TASK[:12_000]))]
    assert records[1].tokens > LIMIT // 2
    p = plan(SlidingWindow.last_tokens(LIMIT), ConversationState(), records)
    assert p.clipped == () and p.window_start == p.pinned == 1 and p.opener is None
    assert p.size == records[0].tokens + records[1].tokens
