"""The catalogue, adapters: LangChain's history and middleware, LlamaIndex's memory.

Real langchain-core and llama-index-core objects over a durable engine (SQLiteStateStore
and SQLiteArchive in the probe's folder). A refusal must leave the state and archive
files byte-for-byte as they were (the harness) and the framework's own store (the inner
chat history, the chat store) equal (``guarded``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.storage.chat_store import SimpleChatStore

from demote import Demoter, SlidingWindow, SQLiteArchive, SQLiteStateStore
from langchain_demote import DemotingChatMessageHistory, DemotingMiddleware, with_demotion
from langchain_demote.callbacks import adispatch_events, dispatch_events
from llamaindex_demote import DemotingMemory
from tests.hostile.harness import (
    BAD_COUNTS,
    BAD_IDS,
    BAD_NUMBERS,
    ODD_IDS,
    Env,
    Probe,
    check,
    guarded,
    probes_for,
    show,
)

POLICY = SlidingWindow.last_messages(2)
BAD_WAITS = [v for v in BAD_NUMBERS if v is not None]  # None: the default wait
BAD_BUDGETS = [v for v in BAD_COUNTS if v is not None]  # None: no token budget
NOT_MESSAGES: list[object] = [
    None,
    "hello",
    b"hi",
    3,
    {"role": "user", "content": "hi"},
    [None],
    ["hello"],
    [("user", "hi")],
]


def engine(env: Env) -> Demoter:
    state = SQLiteStateStore(env.root / "state.db")
    archive = SQLiteArchive(env.root / "archive.db")
    d = Demoter(POLICY, archive, state=state)
    env.objects.update(state=state, archive=archive, demoter=d)
    env.closers += [state.close, archive.close, d.close]
    return d


def lc_history(env: Env) -> None:
    """A LangChain history with six messages read once (four of them demoted)."""
    inner = InMemoryChatMessageHistory()
    h = DemotingChatMessageHistory(inner, engine(env), "lc")
    for i in range(3):
        h.add_messages([HumanMessage(f"q{i}"), AIMessage(f"a{i}")])
    assert len(h.messages) == 2
    env.objects.update(history=h, dump=lambda: [m.model_dump() for m in inner.messages])


def li_memory(env: Env) -> None:
    """A LlamaIndex memory with six messages read once (four of them demoted)."""
    store = SimpleChatStore()
    m = DemotingMemory.from_defaults(demoter=engine(env), chat_store=store, chat_store_key="li")
    for i in range(3):
        m.put_messages([ChatMessage(role="user", content=f"q{i}"), ChatMessage(content=f"a{i}")])
    assert len(m.get()) == 2
    env.objects.update(
        memory=m,
        dump=lambda: {k: [(x.role, x.content) for x in v] for k, v in store.store.items()},
    )


def history(env: Env) -> DemotingChatMessageHistory:
    h: DemotingChatMessageHistory = env.objects["history"]
    return h


def memory(env: Env) -> DemotingMemory:
    m: DemotingMemory = env.objects["memory"]
    return m


def demoter(env: Env) -> Demoter:
    d: Demoter = env.objects["demoter"]
    return d


PROBES: list[Probe] = []

# -- LangChain: DemotingChatMessageHistory and with_demotion --------------------------------

PROBES += probes_for(
    "DemotingChatMessageHistory",
    "conversation_id",
    BAD_IDS,
    lambda e, v: DemotingChatMessageHistory(InMemoryChatMessageHistory(), demoter(e), v),
)
PROBES += probes_for(
    "DemotingChatMessageHistory",
    "inner",
    [None, [], "history", InMemoryChatMessageHistory],
    lambda e, v: DemotingChatMessageHistory(v, demoter(e), "c"),
)
PROBES += probes_for(
    "DemotingChatMessageHistory",
    "demoter",
    [None, "demoter", POLICY],
    lambda e, v: DemotingChatMessageHistory(InMemoryChatMessageHistory(), v, "c"),
)
PROBES += probes_for(
    "DemotingChatMessageHistory",
    "capture",
    ["capture", 3, object()],
    lambda e, v: DemotingChatMessageHistory(
        InMemoryChatMessageHistory(), demoter(e), "c", capture=v
    ),
)
for name, call in {
    "add_messages": lambda e, v: history(e).add_messages(v),
    "aadd_messages": lambda e, v: asyncio.run(history(e).aadd_messages(v)),
}.items():
    PROBES += probes_for(f"history.{name}", "messages", NOT_MESSAGES, guarded(call), lc_history)
PROBES += probes_for(
    "history.add_message",
    "message",
    [None, "hello", [HumanMessage("hi")], 3],
    guarded(lambda e, v: history(e).add_message(v)),
    lc_history,
)
PROBES += probes_for(
    "history.erase", "wait", BAD_WAITS, guarded(lambda e, v: history(e).erase(wait=v)), lc_history
)
PROBES += probes_for(
    "with_demotion",
    "factory",
    [None, 3, "factory", dict, print],
    lambda e, v: with_demotion(v, demoter(e))("s"),
)
PROBES += probes_for(
    "with_demotion",
    "demoter",
    [None, "demoter"],
    lambda e, v: with_demotion(lambda s: InMemoryChatMessageHistory(), v),
)
PROBES += probes_for(
    "with_demotion",
    "conversation_id",
    [3, "name", lambda s: None, lambda s: "", lambda s: "\ud800", lambda s: 42],
    lambda e, v: with_demotion(
        lambda s: InMemoryChatMessageHistory(), demoter(e), conversation_id=v
    )("s"),
)
PROBES += probes_for(
    "with_demotion(factory)",
    "inner",
    [None, "history", 3],
    lambda e, v: with_demotion(lambda s: v, demoter(e))("s"),
)


def _lc_odd_id(cid: str) -> Probe:
    def run(env: Env) -> object:
        h = with_demotion(lambda session_id: InMemoryChatMessageHistory(), demoter(env))(cid)
        for i in range(3):
            h.add_messages([HumanMessage(f"{cid[:5]} q{i}"), AIMessage(f"a{i}")])
        return h.conversation_id, len(h.messages), env.objects["archive"].count(cid)

    return Probe(
        f"with_demotion(session_id={show(cid)})",
        "conversation_id",
        run,
        True,
        lambda r, e: r == (cid, 2, 4),
    )


PROBES += [_lc_odd_id(cid) for cid in ODD_IDS]

# -- LangChain: DemotingMiddleware -----------------------------------------------------------

for option, values in {
    "recall_k": BAD_COUNTS,
    "recall_budget_tokens": BAD_BUDGETS,
    "recall": ["archive", 3, object()],
    "conversation_id": ["thread", 3],
    "recall_role": ["assistant", None, 3],
}.items():
    PROBES += probes_for(
        "DemotingMiddleware",
        option,
        values,
        lambda e, v, option=option: DemotingMiddleware(demoter(e), **{option: v}),
    )
PROBES += probes_for(
    "DemotingMiddleware", "demoter", [None, "d", POLICY], lambda e, v: DemotingMiddleware(v)
)
PROBES += probes_for(
    "DemotingMiddleware.erase",
    "thread_id",
    BAD_IDS,
    lambda e, v: DemotingMiddleware(demoter(e)).erase(v),
)

for name, fn in {"dispatch_events": dispatch_events, "adispatch_events": adispatch_events}.items():
    run = (
        (lambda f: lambda e, v: f(v))(fn)
        if name[0] == "d"
        else (lambda f: lambda e, v: asyncio.run(f(v)))(fn)
    )
    PROBES += probes_for(name, "events", [None, "abc", [1], 3, [None]], run)
PROBES += probes_for(
    "dispatch_events", "config", ["config", 3, ["x"]], lambda e, v: dispatch_events([], config=v)
)

# -- LlamaIndex: DemotingMemory ----------------------------------------------------------------

PROBES += probes_for(
    "DemotingMemory.from_defaults",
    "chat_store_key",
    BAD_IDS,
    lambda e, v: DemotingMemory.from_defaults(demoter=demoter(e), chat_store_key=v),
)
PROBES += probes_for(
    "DemotingMemory.from_defaults",
    "session_id",
    BAD_IDS[1:],
    lambda e, v: DemotingMemory.from_defaults(demoter=demoter(e), session_id=v),
)
for option, values in {
    "recall_k": BAD_COUNTS,
    "recall_budget_tokens": BAD_BUDGETS,
    "recall": ["archive", 3],
    "capture": ["capture", 3],
    "chat_store": ["store", {}, 3],
    "chat_history": NOT_MESSAGES[1:],
    "demoter": ["demoter", 3, POLICY],
    "unknown_option": [1],
}.items():
    PROBES += probes_for(
        "DemotingMemory.from_defaults",
        option,
        values,
        lambda e, v, option=option: DemotingMemory.from_defaults(
            **({"demoter": demoter(e)} if option != "demoter" else {}), **{option: v}
        ),
    )
PROBES += probes_for(
    "DemotingMemory.from_defaults",
    "limit",
    BAD_COUNTS,
    lambda e, v: DemotingMemory.from_defaults(token_limit=v),
)
PROBES += probes_for(
    "DemotingMemory.from_defaults",
    "policy",
    ["last 4", 3, {"unit": "messages"}],
    lambda e, v: DemotingMemory.from_defaults(policy=v),
)
for name, call in {
    "put_messages": lambda e, v: memory(e).put_messages(v),
    "aput_messages": lambda e, v: asyncio.run(memory(e).aput_messages(v)),
    "set": lambda e, v: memory(e).set(v),
    "aset": lambda e, v: asyncio.run(memory(e).aset(v)),
}.items():
    PROBES += probes_for(f"memory.{name}", "messages", NOT_MESSAGES, guarded(call), li_memory)
for name, call in {
    "put": lambda e, v: memory(e).put(v),
    "aput": lambda e, v: asyncio.run(memory(e).aput(v)),
}.items():
    PROBES += probes_for(
        f"memory.{name}", "message", [None, "hi", [ChatMessage()], 3], guarded(call), li_memory
    )
for name, call in {
    "get": lambda e, v: memory(e).get(initial_token_count=v),
    "aget": lambda e, v: asyncio.run(memory(e).aget(initial_token_count=v)),
}.items():
    PROBES += probes_for(
        f"memory.{name}", "initial_token_count", BAD_NUMBERS, guarded(call), li_memory
    )
PROBES += probes_for(
    "memory.erase", "wait", BAD_WAITS, guarded(lambda e, v: memory(e).erase(wait=v)), li_memory
)


def _li_odd_id(cid: str) -> Probe:
    def run(env: Env) -> object:
        m = DemotingMemory.from_defaults(demoter=demoter(env), chat_store_key=cid)
        for i in range(3):
            m.put(ChatMessage(role="user", content=f"{cid[:5]} q{i}"))
            m.put(ChatMessage(content=f"a{i}"))
        window = m.get()
        m.reset()
        return len(window), env.objects["archive"].count(cid), m.get_all()

    return Probe(
        f"DemotingMemory(chat_store_key={show(cid)})",
        "chat_store_key",
        run,
        True,
        lambda r, e: r == (2, 4, []),
    )


PROBES += [_li_odd_id(cid) for cid in ODD_IDS]
for _probe in PROBES:  # every probe runs over a durable engine made before the snapshot
    _probe.setup = _probe.setup or engine


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_adapter_probe(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def test_the_catalogue_is_large() -> None:
    assert len(PROBES) >= 250
