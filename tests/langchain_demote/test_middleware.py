"""DemotingMiddleware on real ``create_agent`` graphs with a scripted tool-calling model.

Every scenario runs sync (``invoke``) and async (``ainvoke``, on one long-lived event loop
so background summaries are not cancelled between turns), on ``InMemorySaver`` and on the
SQLite checkpointer, and checks after every model call what the model was sent (bounded,
one thread only, tool calls paired with their results) and after the run what the hook
received (each demoted message once, under a stable key).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from demote import Backoff, Bulk, Demoter, FanOutHook, SlidingWindow, SQLiteStateStore
from demote.archive.sqlite import SQLiteArchive
from demote.engine import PROGRESS_PREFIX, SUMMARY_PREFIX
from demote.errors import ConfigError, ConversationIdError, DemoteWarning
from demote.records import Demotion, Recalled, make_key
from demote.state.memory import InMemoryStateStore
from langchain_demote.messages import message_text, to_core
from langchain_demote.middleware import (
    RECALL_PREFIX,
    DemotingMiddleware,
    render_recall,
    thread_conversation_id,
)
from tests.conformance._langchain import add, lookup
from tests.langchain_demote.support import ScriptedToolModel

THREADS = ("t1", "t2")
PINNED = "You are the test assistant."
TOPICS = ("hiking", "bread", "tides", "chess", "ferns", "trains", "violins")

# -- a scripted tool-calling model and two tools -------------------------------------------


class ScriptedModel(ScriptedToolModel):
    """Per turn: two parallel tool calls, then one more call, then the answer.

    Every fifth turn (its text says "quick") is answered at once. Tool-call ids derive
    from the turn's text, so the same conversation always produces the same transcript;
    every call has an id of its own, as providers require. It answers once it sees the
    follow-up call's result (the newest step, which every window keeps), not by counting
    the steps it is sent: a window cut inside the turn shows only the newest ones.
    Every list of messages it receives is recorded in ``calls``.
    """

    def reply(self, messages: list[BaseMessage], last: int) -> AIMessage:
        human = messages[last].text
        steps = sum(isinstance(m, AIMessage) for m in messages[last + 1 :])
        tag = hashlib.blake2b(human.encode(), digest_size=4).hexdigest()
        followed_up = any(
            isinstance(m, ToolMessage) and m.tool_call_id == f"{tag}-c"
            for m in messages[last + 1 :]
        )
        if "quick" in human or followed_up:
            reply = AIMessage(f"answer to {human}")
        elif steps == 0:
            reply = AIMessage(
                "",
                tool_calls=[
                    {
                        "name": "lookup",
                        "args": {"topic": human},
                        "id": f"{tag}-a",
                        "type": "tool_call",
                    },
                    {
                        "name": "add",
                        "args": {"a": 2, "b": 3},
                        "id": f"{tag}-b",
                        "type": "tool_call",
                    },
                ],
            )
        else:
            reply = AIMessage(
                "",
                tool_calls=[
                    {
                        "name": "lookup",
                        "args": {"topic": "more " + human},
                        "id": f"{tag}-c",
                        "type": "tool_call",
                    }
                ],
            )
        return reply


def turn_text(thread: str, n: int) -> str:
    kind = "quick" if n % 5 == 4 else "tell me about"
    return f"{thread} turn {n}: {kind} {TOPICS[n % len(TOPICS)]}"


# -- a recording hook ----------------------------------------------------------------------


@dataclass
class Recorder:
    """Records every delivery; idempotent on the key, like the built-in hooks."""

    batches: list[Demotion] = field(default_factory=list)
    store: dict[tuple[str, str], Any] = field(default_factory=dict)
    fail_next: int = 0

    def deliver(self, batch: Demotion) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("sink down")
        self.batches.append(batch)
        for m in batch.messages:
            self.store.setdefault((batch.conversation_id, m.key), m)

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        return {k for k in keys if (conversation_id, k) in self.store}

    def delivered(self, cid: str) -> list[Any]:
        return [m for b in self.batches if b.conversation_id == cid for m in b.messages]


# -- sync and async drivers ----------------------------------------------------------------


class SyncFlavour:
    name = "sync"

    def __init__(self) -> None:
        self._closers: list[Callable[[], None]] = []

    def saver(self, kind: str, path: Path) -> Any:
        if kind == "memory":
            return InMemorySaver()
        conn = sqlite3.connect(path, check_same_thread=False)
        self._closers.append(conn.close)
        return SqliteSaver(conn)

    def invoke(self, agent: Any, payload: dict[str, Any], config: dict[str, Any]) -> Any:
        return agent.invoke(payload, config)

    def messages(self, agent: Any, config: dict[str, Any]) -> list[BaseMessage]:
        return list(agent.get_state(config).values["messages"])

    def drain(self, demoter: Demoter) -> None:
        assert demoter.drain(10)

    def close_savers(self) -> None:
        while self._closers:
            self._closers.pop()()

    def close(self) -> None:
        self.close_savers()


class AsyncFlavour(SyncFlavour):
    name = "async"

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()

    def saver(self, kind: str, path: Path) -> Any:
        if kind == "memory":
            return InMemorySaver()
        cm = AsyncSqliteSaver.from_conn_string(str(path))
        saver = self.runner.run(cm.__aenter__())

        def close() -> None:
            self.runner.run(cm.__aexit__(None, None, None))

        self._closers.append(close)
        return saver

    def invoke(self, agent: Any, payload: dict[str, Any], config: dict[str, Any]) -> Any:
        return self.runner.run(agent.ainvoke(payload, config))

    def messages(self, agent: Any, config: dict[str, Any]) -> list[BaseMessage]:
        return list(self.runner.run(agent.aget_state(config)).values["messages"])

    def drain(self, demoter: Demoter) -> None:
        assert self.runner.run(demoter.adrain(10))

    def close(self) -> None:
        super().close()
        self.runner.close()


Flavour = SyncFlavour


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    f = SyncFlavour() if request.param == "sync" else AsyncFlavour()
    try:
        yield f
    finally:
        f.close()


def config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


# -- checks on what the model was sent -----------------------------------------------------


def check_sent(sent: list[BaseMessage], limit: int, *, pinned: bool = True) -> str:
    """Assert one model call's messages are sound; return the thread they belong to."""
    assert isinstance(sent[0], SystemMessage) and sent[0].text == "agent prompt"
    if pinned:
        assert isinstance(sent[1], SystemMessage) and sent[1].text == PINNED
    newest = max(
        i
        for i, m in enumerate(sent)
        if isinstance(m, HumanMessage) and not m.text.startswith(RECALL_PREFIX)
    )
    thread = sent[newest].text.split()[0]
    others = [t for t in THREADS if t != thread]
    for m in sent:
        for other in others:
            assert f"{other} turn" not in m.text, (thread, m.text)
    # bounded: within the limit, or nothing but the newest turn group
    body = [
        m
        for m in sent
        if not isinstance(m, SystemMessage)
        and not m.text.startswith((RECALL_PREFIX, SUMMARY_PREFIX, PROGRESS_PREFIX))
    ]
    first_human = next(i for i, m in enumerate(body) if isinstance(m, HumanMessage))
    assert first_human == 0, "the window starts on a turn group"
    if len(body) > limit:
        assert sum(isinstance(m, HumanMessage) for m in body) == 1, len(body)
    # tool calls and results paired, both ways
    opened: dict[str, int] = {}
    answered: set[str] = set()
    for i, m in enumerate(sent):
        if isinstance(m, AIMessage):
            for call in m.tool_calls:
                opened[call["id"] or ""] = i
        if isinstance(m, ToolMessage):
            assert m.tool_call_id in opened, "orphan tool result"
            assert opened[m.tool_call_id] < i
            answered.add(m.tool_call_id)
    assert set(opened) == answered, "tool call without its result"
    return thread


def check_archive(
    recorder: Recorder, demoter: Demoter, thread: str, history: list[BaseMessage] | None
) -> None:
    """Each message below the window start was delivered once, under its stable key."""
    state = demoter.state_of(thread)
    got = recorder.delivered(thread)
    keys = [m.key for m in got]
    assert len(keys) == len(set(keys)), "a message was delivered twice"
    assert sorted(m.index for m in got) == list(range(state.pinned, state.delivered))
    assert state.delivered == state.window_start > state.pinned
    for m in got:
        assert f"{thread} turn" in m.text or m.role in ("assistant", "tool")
        if history is not None:
            fp = to_core(history[m.index], demoter.describe).fingerprint
            assert m.key == make_key(thread, m.index, fp)
            assert m.text == message_text(history[m.index])


# -- one scenario, many configurations -----------------------------------------------------


@dataclass
class Run:
    flavour: Flavour
    tmp: Path
    saver_kind: str
    policy: SlidingWindow
    prune: bool = False
    recorder: Recorder = field(default_factory=Recorder)
    model: ScriptedModel = field(default_factory=ScriptedModel)
    demoter: Demoter | None = None
    agent: Any = None
    checked: int = 0
    recall: Any = None
    hook: Any = None
    recall_role: Any = "user"
    bounded: bool = True  # False while the hook is down: the window keeps what it holds

    def start(self, state: Any = None) -> None:
        """(Re)build model, checkpointer, demoter and agent on the same files."""
        if state is None:
            state = (
                SQLiteStateStore(self.tmp / "state.db")
                if self.saver_kind == "sqlite"
                else InMemoryStateStore()
            )
        self.model = ScriptedModel()
        self.checked = 0
        self.demoter = Demoter(
            self.policy, self.hook or self.recorder, state=state, retry=Backoff(0, 0)
        )
        middleware = DemotingMiddleware(
            demoter=self.demoter,
            recall=self.recall,
            prune_state=self.prune,
            recall_role=self.recall_role,
        )
        self.agent = create_agent(
            self.model,
            [lookup, add],
            system_prompt="agent prompt",
            checkpointer=self.flavour.saver(self.saver_kind, self.tmp / "checkpoints.db"),
            middleware=[middleware],
        )

    def turn(self, thread: str, n: int) -> None:
        payload: list[BaseMessage] = [HumanMessage(turn_text(thread, n))]
        if n == 0:
            payload.insert(0, SystemMessage(PINNED))
        self.flavour.invoke(self.agent, {"messages": payload}, config(thread))
        limit = self.policy.limit + (
            self.policy.eviction.overflow if isinstance(self.policy.eviction, Bulk) else 0
        )
        if not self.bounded:
            limit = 10**9
        for sent in self.model.calls[self.checked :]:
            assert check_sent(sent, limit) == thread
        assert len(self.model.calls) > self.checked
        self.checked = len(self.model.calls)

    def turns(self, rng: range) -> None:
        for n in rng:
            for thread in THREADS:
                self.turn(thread, n)

    def history(self, thread: str) -> list[BaseMessage]:
        return self.flavour.messages(self.agent, config(thread))


POLICIES = {
    "per_item": SlidingWindow.last_messages(12),
    "bulk": SlidingWindow.last_messages(10, eviction=Bulk(overflow=8)),
}


@pytest.mark.parametrize("policy", list(POLICIES), ids=list(POLICIES))
def test_agent_in_memory_bounded_exactly_once_per_thread(
    flavour: Flavour, tmp_path: Path, policy: str
) -> None:
    run = Run(flavour, tmp_path, "memory", POLICIES[policy])
    run.start()
    run.turns(range(24))  # 48 agent turns, ~3 model calls each
    assert run.demoter is not None
    for thread in THREADS:
        history = run.history(thread)
        assert len(history) > 100, "non-destructive: the checkpoint keeps everything"
        assert history[0].text == PINNED
        check_archive(run.recorder, run.demoter, thread, history)
    for batch in run.recorder.batches:
        assert batch.conversation_id in THREADS
        assert all(
            f"{batch.conversation_id} turn" in m.text for m in batch.messages if m.role == "user"
        )


def test_tool_loop_delivers_once_although_state_is_reread(tmp_path: Path) -> None:
    """A turn with three model calls re-reads the same state three times."""
    flavour = SyncFlavour()
    run = Run(flavour, tmp_path, "memory", SlidingWindow.last_messages(8))
    run.start()
    run.turns(range(6))
    assert run.demoter is not None
    calls_per_turn = len(run.model.calls) / (6 * len(THREADS))
    assert calls_per_turn > 2.5
    for thread in THREADS:
        check_archive(run.recorder, run.demoter, thread, run.history(thread))


def test_sqlite_checkpointer_across_restart(flavour: Flavour, tmp_path: Path) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    run = Run(flavour, tmp_path, "sqlite", SlidingWindow.last_messages(12))
    run.hook = FanOutHook(run.recorder, archive)
    run.start()
    run.turns(range(12))
    assert run.demoter is not None
    before = {t: run.demoter.state_of(t) for t in THREADS}
    run.demoter.state.close()
    flavour.close_savers()
    # restart: a new model, checkpointer, state store, demoter and agent on the same files
    run.start()
    assert {t: run.demoter.state_of(t) for t in THREADS} == before
    run.turns(range(12, 24))
    for thread in THREADS:
        history = run.history(thread)
        assert len(history) > 100
        check_archive(run.recorder, run.demoter, thread, history)
        stored = archive.messages(thread)
        assert [r.index for r in stored] == list(range(1, run.demoter.state_of(thread).delivered))
    run.demoter.state.close()
    archive.close()


# -- prune_state ---------------------------------------------------------------------------


def _transcript_keys(recorder: Recorder, thread: str) -> list[tuple[int, str, str]]:
    return sorted((m.index, m.key, m.text) for m in recorder.delivered(thread))


@pytest.mark.parametrize("saver_kind", ["memory", "sqlite"])
def test_prune_state_shrinks_checkpoint_keeps_keys(
    flavour: Flavour, tmp_path: Path, saver_kind: str
) -> None:
    policy = SlidingWindow.last_messages(12)
    keep = Run(flavour, tmp_path / "keep", saver_kind, policy)
    prune = Run(flavour, tmp_path / "prune", saver_kind, policy, prune=True)
    for run in (keep, prune):
        run.tmp.mkdir()
        run.start()
    for n in range(20):
        for thread in THREADS:
            keep.turn(thread, n)
            prune.turn(thread, n)
            sizes = len(prune.history(thread))
            assert sizes <= policy.limit + 8 + 1 + 1, "pinned + anchor + window + new turn"
    assert keep.demoter is not None and prune.demoter is not None
    for thread in THREADS:
        history = prune.history(thread)
        assert history[0].text == PINNED, "pinned system messages are never pruned"
        assert len(history) < len(keep.history(thread)) / 4
        # the same conversation, pruned or not: same positions, same keys, delivered once
        assert (
            _transcript_keys(prune.recorder, thread)
            == _transcript_keys(keep.recorder, thread)[: len(prune.recorder.delivered(thread))]
        )
        assert prune.demoter.state_of(thread) == keep.demoter.state_of(thread)
        check_archive(prune.recorder, prune.demoter, thread, None)


def test_prune_waits_for_the_hook(tmp_path: Path) -> None:
    run = Run(SyncFlavour(), tmp_path, "memory", SlidingWindow.last_messages(8), prune=True)
    run.start()
    run.turns(range(3))
    assert run.demoter is not None
    delivered = run.demoter.state_of("t1").delivered
    size = len(run.history("t1"))
    run.recorder.fail_next = 10**6  # the sink is down: nothing more may be pruned
    run.bounded = False
    for n in range(3, 8):
        run.turn("t1", n)
    assert run.demoter.state_of("t1").delivered == delivered
    grown = run.history("t1")
    assert len(grown) > size + 20
    assert all(f"t1 turn {n}:" in " ".join(m.text for m in grown) for n in range(2, 8))
    run.recorder.fail_next = 0
    run.turn("t1", 8)
    assert len(run.history("t1")) < len(grown)
    check_archive(run.recorder, run.demoter, "t1", None)


def test_prune_restart_with_lost_demotion_state_reseeds(tmp_path: Path) -> None:
    """A pruned checkpoint outlives a non-durable state store: nothing is re-delivered."""
    flavour = SyncFlavour()
    run = Run(flavour, tmp_path, "sqlite", SlidingWindow.last_messages(10), prune=True)
    run.start(state=InMemoryStateStore())
    with pytest.warns(DemoteWarning, match="SqliteSaver keeps conversations across restarts"):
        run.turns(range(8))  # (what this pairing risks, and is warned about: demote.restarts)
    flavour.close_savers()
    run.start(state=InMemoryStateStore())  # the demotion state is gone, the checkpoint is not
    run.turns(range(8, 16))
    assert run.demoter is not None
    for thread in THREADS:
        got = run.recorder.delivered(thread)
        assert len({m.key for m in got}) == len(got)
        assert len({m.index for m in got}) == len(got), "no position delivered twice"
        assert sorted(m.index for m in got) == list(
            range(1, run.demoter.state_of(thread).delivered)
        )
    flavour.close()


# -- recall, options, errors ---------------------------------------------------------------


def test_recall_can_be_sent_as_a_system_message(tmp_path: Path) -> None:
    # For providers that take system messages anywhere (OpenAI); Anthropic's refuse it.
    archive = SQLiteArchive(tmp_path / "archive.db")
    run = Run(SyncFlavour(), tmp_path, "memory", SlidingWindow.last_messages(8))
    run.hook = run.recall = archive
    run.recall_role = "system"
    run.start()
    run.turn("t1", 0)
    run.flavour.invoke(
        run.agent,
        {"messages": [HumanMessage("t1 turn 1: quick my locker code is 4417")]},
        config("t1"),
    )
    for n in range(2, 7):
        run.turn("t1", n)
    run.model.calls.clear()
    run.checked = 0
    run.flavour.invoke(
        run.agent,
        {"messages": [HumanMessage("t1 turn 9: quick what is my locker code")]},
        config("t1"),
    )
    (sent,) = run.model.calls
    recalled = [m for m in sent if m.text.startswith(RECALL_PREFIX)]
    assert len(recalled) == 1 and isinstance(recalled[0], SystemMessage)
    assert "4417" in recalled[0].text and sent.index(recalled[0]) == len(sent) - 1
    assert "locker" in sent[-2].text and isinstance(sent[-2], HumanMessage)
    with pytest.raises(ConfigError, match="recall_role"):
        DemotingMiddleware(
            demoter=Demoter(SlidingWindow.last_messages(8)),
            recall=archive,
            recall_role="tool",  # type: ignore[arg-type]
        )
    archive.close()


def test_recall_is_one_user_message_right_after_the_question(tmp_path: Path) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    run = Run(SyncFlavour(), tmp_path, "memory", SlidingWindow.last_messages(8))
    run.hook = archive
    run.recall = archive
    run.start()
    run.flavour.invoke(
        run.agent,
        {
            "messages": [
                SystemMessage(PINNED),
                HumanMessage("t1 turn 0: quick my locker code is 4417"),
            ]
        },
        config("t1"),
    )
    for n in range(1, 6):
        run.turn("t1", n)
    run.model.calls.clear()
    run.checked = 0
    run.flavour.invoke(
        run.agent,
        {"messages": [HumanMessage("t1 turn 9: quick what is my locker code")]},
        config("t1"),
    )
    (sent,) = run.model.calls
    recalled = [m for m in sent if m.text.startswith(RECALL_PREFIX)]
    assert len(recalled) == 1 and "4417" in recalled[0].text
    assert isinstance(recalled[0], HumanMessage)
    at = sent.index(recalled[0])
    assert isinstance(sent[at - 1], HumanMessage) and "locker" in sent[at - 1].text
    assert at + 1 == len(sent)
    # The system block is the prompt and the pinned message, and nothing else.
    assert [i for i, m in enumerate(sent) if isinstance(m, SystemMessage)] == [0, 1]
    assert sent[1].text == PINNED
    # t2 never sees t1's archive
    run.model.calls.clear()
    run.checked = 0
    run.turn("t2", 0)
    run.model.calls.clear()
    run.checked = 0
    run.flavour.invoke(
        run.agent,
        {"messages": [HumanMessage("t2 turn 9: quick what is my locker code")]},
        config("t2"),
    )
    assert not any("4417" in m.text for m in run.model.calls[0])
    archive.close()


class BrokenRecall:
    def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
        raise RuntimeError("index offline")


def test_failing_recall_is_logged_and_skipped(
    flavour: Flavour, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(flavour, tmp_path, "memory", SlidingWindow.last_messages(8))
    run.recall = BrokenRecall()
    run.start()
    with caplog.at_level(logging.WARNING, logger="demote"):
        run.turns(range(2))
    assert "recall failed" in caplog.text
    assert not any(m.text.startswith(RECALL_PREFIX) for c in run.model.calls for m in c)


def test_render_recall_orders_oldest_first() -> None:
    text = render_recall([Recalled("user", "b", 9, "k2"), Recalled("assistant", "a", 3, "k1")])
    assert text == RECALL_PREFIX + "- assistant: a\n- user: b"


def test_custom_conversation_id(tmp_path: Path) -> None:
    demoter = Demoter(SlidingWindow.last_messages(4), Recorder())
    middleware = DemotingMiddleware(
        demoter=demoter,
        conversation_id=lambda rt: f"{thread_conversation_id(rt)}/researcher",
    )
    agent = create_agent(
        ScriptedModel(), [lookup, add], checkpointer=InMemorySaver(), middleware=[middleware]
    )
    for n in range(3):
        agent.invoke({"messages": [HumanMessage(turn_text("t1", n))]}, config("t1"))
    assert demoter.state_of("t1/researcher").window_start > 0
    assert demoter.tracked_conversations() == 1


def test_prune_state_without_thread_id_is_a_clear_error() -> None:
    # Without a thread id the state ends with the call: a pruned count could not be kept.
    recorder = Recorder()
    demoter = Demoter(SlidingWindow.last_messages(4), recorder)
    middleware = DemotingMiddleware(demoter=demoter, prune_state=True)
    agent = create_agent(ScriptedModel(), [lookup], middleware=[middleware])
    with pytest.raises(ConversationIdError, match=r"prune_state=True\) needs a thread id"):
        agent.invoke({"messages": [HumanMessage("t1 turn 0: quick hi")]})
    assert demoter.tracked_conversations() == 0 and recorder.batches == []


def test_thread_conversation_id_needs_a_thread() -> None:
    seen: list[str] = []

    def name(rt: Any) -> str:
        try:
            return thread_conversation_id(rt)
        except ConversationIdError as exc:
            seen.append(str(exc))
            raise

    demoter = Demoter(SlidingWindow.last_messages(4))
    middleware = DemotingMiddleware(demoter=demoter, conversation_id=name)
    agent = create_agent(ScriptedModel(), [lookup], middleware=[middleware])
    with pytest.raises(ConversationIdError, match="thread_id"):
        agent.invoke({"messages": [HumanMessage("t1 turn 0: quick hi")]})
    assert seen and "without a thread id" in seen[0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"demoter": object()}, "demoter"),
        ({"recall": object()}, "recall"),
        ({"recall_k": 0}, "recall_k"),
        ({"conversation_id": "t1"}, "conversation_id"),
    ],
)
def test_bad_options(kwargs: dict[str, Any], match: str) -> None:
    options: dict[str, Any] = {"demoter": Demoter(SlidingWindow.last_messages(4))}
    options.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        DemotingMiddleware(**options)


def test_state_schema_keeps_pruning_record_private(tmp_path: Path) -> None:
    run = Run(SyncFlavour(), tmp_path, "memory", SlidingWindow.last_messages(6), prune=True)
    run.start()
    run.turns(range(4))
    out = run.flavour.invoke(
        run.agent, {"messages": [HumanMessage(turn_text("t1", 4))]}, config("t1")
    )
    assert "demote_pruned" not in out, "private: not part of the agent's output"
    assert run.demoter is not None
    state = run.demoter.state_of("t1")
    values = run.agent.get_state(config("t1")).values
    # pruned up to the watermark, keeping the pinned message and the engine's anchor
    assert values["demote_pruned"] == {"pinned": 1, "removed": state.delivered - 2}
    anchor = values["messages"][1]
    assert to_core(anchor, run.demoter.describe).fingerprint == state.anchor
