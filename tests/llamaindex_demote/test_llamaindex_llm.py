"""DemotingLLM: every LLM call of a LlamaIndex agent run within the window, through real workflows.

Each test runs llama-index-core's own agent workflow (``FunctionAgent``, ``ReActAgent``,
``CodeActAgent``, ``AgentWorkflow`` with a handoff) with a scripted mock LLM (the model is
the one thing that cannot run here) wrapped in ``DemotingLLM``, over a ``DemotingMemory``
whose Demoter archives into a real SQLite file, and checks what the model is sent at every
call, what reached the archive (once each, in order, under the keys the memory gives the
stored messages), and what happens when the run ends.
"""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.agent.workflow import (
    AgentStream,
    AgentWorkflow,
    CodeActAgent,
    FunctionAgent,
    ReActAgent,
)
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.workflow import Context, HumanResponseEvent, InputRequiredEvent
from workflows.context.serializers import JsonSerializer, PickleSerializer

from demote import Demoter, SlidingWindow
from demote.engine.result import PROGRESS_PREFIX
from demote.records import make_key
from demote.registry import register, unregister
from llamaindex_demote import RECALL_PREFIX, DemotingLLM, DemotingMemory, recall_tool
from llamaindex_demote.messages import text_of, to_core
from tests.llamaindex_demote.agent_support import (
    TASK,
    Collect,
    check_request,
    fetch,
    function_llm,
    newest_page,
    page,
    react_llm,
    request_tokens,
    tool_tokens,
)
from tests.support.counting import CountingArchive

pytestmark = pytest.mark.filterwarnings(
    "ignore::pydantic.warnings.PydanticDeprecationWarning:inspect"
)

LIMIT = 3000
STEPS = 40  # past the trail the state keeps: a shorter copy it cannot tell from a rewrite
SYSTEM = "be thorough"


@pytest.fixture
def events() -> Any:
    root = get_dispatcher()
    collect = Collect()
    root.add_event_handler(collect)
    try:
        yield collect
    finally:
        root.event_handlers.remove(collect)


def setup(tmp_path: Path, key: str = "agent") -> tuple[DemotingMemory, CountingArchive, Demoter]:
    hook = CountingArchive(tmp_path / "archive.db")
    # hook_wait=None: a load waits for its delivery (on a loaded machine one can outlive
    # the default 0.25 s, and a delivery still going when asyncio.run closes its loop is
    # abandoned and made again: a count of two that says nothing about DemotingLLM).
    demoter = Demoter(SlidingWindow.last_tokens(LIMIT), hook, hook_wait=None)
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key=key)
    return memory, hook, demoter


def archived_once_in_order(memory: DemotingMemory, hook: CountingArchive, demoter: Demoter) -> None:
    """Every key once, positions 0..delivered-1, each the key of the stored message there."""
    cid = memory.chat_store_key
    state = demoter.state_of(cid)
    assert state.window_start > 1, "the run cut its own steps"
    assert max(hook.deliveries.values()) == 1
    assert sorted(hook.indexes) == list(range(state.delivered))
    stored = memory.get_all()
    expected = {
        make_key(cid, i, to_core(stored[i], demoter.describe).fingerprint)
        for i in range(state.delivered)
    }
    assert set(hook.deliveries) == expected, "the keys the memory gives the stored steps"


async def run(agent: Any, memory: DemotingMemory, task: str = TASK, most: int = 100) -> Any:
    return await agent.run(task, memory=memory, max_iterations=most)


# -- FunctionAgent: the run bounded at every call -------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
def test_function_agent_every_call_is_within_the_limit(
    tmp_path: Path, events: Collect, streaming: bool
) -> None:
    memory, hook, demoter = setup(tmp_path)
    seen: list[list[ChatMessage]] = []
    agent = FunctionAgent(
        tools=[fetch],
        llm=DemotingLLM(function_llm(seen, STEPS)),
        system_prompt=SYSTEM,
        streaming=streaming,
    )
    answer = asyncio.run(run(agent, memory))
    assert str(answer) == "read it all"
    assert len(seen) == STEPS + 1, "every step once: the newest step is always sent"
    reserved = tool_tokens(demoter, [fetch])
    overhang = max((e.tokens_after or 0 for e in events.kinds("overhang")), default=0)
    for sent in seen:
        check_request(sent)
        assert sent[0].role == MessageRole.SYSTEM and text_of(sent[0]) == SYSTEM
        assert text_of(sent[1]) == TASK, "the opener stays in front of the kept steps"
        assert request_tokens(demoter, sent) + reserved <= LIMIT + overhang
    # Without the wrapper the 31st call was sent every step (41,248 tokens); here, ~2 steps.
    assert len(seen[-1]) < 10
    assert events.kinds("demoted") and events.kinds("delivered")
    # The run put its steps into memory where they were numbered: nothing archived twice.
    assert len(memory.get_all()) == 2 + 2 * STEPS
    archived_once_in_order(memory, hook, demoter)
    asyncio.run(memory.aget())
    archived_once_in_order(memory, hook, demoter)
    assert not events.kinds("resynced")


def test_early_stopping_call_is_windowed_without_a_resync(tmp_path: Path, events: Collect) -> None:
    memory, hook, demoter = setup(tmp_path)
    seen: list[list[ChatMessage]] = []
    agent = FunctionAgent(
        tools=[fetch],
        llm=DemotingLLM(function_llm(seen, 100)),
        system_prompt=SYSTEM,
        early_stopping_method="generate",
    )
    asyncio.run(run(agent, memory, most=STEPS))
    last = seen[-1]
    assert text_of(last[-1]).startswith("You have reached the maximum"), "its instruction last"
    assert last[-1].role == MessageRole.SYSTEM
    assert max(request_tokens(demoter, s) for s in seen) <= LIMIT + 100
    assert not events.kinds("resynced")
    assert max(hook.deliveries.values()) == 1


def test_streaming_run_streams_the_windowed_answer(tmp_path: Path) -> None:
    memory, hook, demoter = setup(tmp_path)
    seen: list[list[ChatMessage]] = []
    agent = FunctionAgent(tools=[fetch], llm=DemotingLLM(function_llm(seen, 12)), streaming=True)

    async def go() -> list[Any]:
        handler = agent.run(TASK, memory=memory, max_iterations=50)
        streamed = [ev async for ev in handler.stream_events() if isinstance(ev, AgentStream)]
        await handler
        return streamed

    streamed = asyncio.run(go())
    assert len(streamed) >= 12 and streamed[-1].response == "read it all"
    assert max(request_tokens(demoter, s) for s in seen) <= LIMIT
    archived_once_in_order(memory, hook, demoter)


def test_a_second_run_starts_from_the_cut_and_archives_once(tmp_path: Path) -> None:
    memory, hook, demoter = setup(tmp_path)
    llm = DemotingLLM(function_llm(seen := [], 8))
    agent = FunctionAgent(tools=[fetch], llm=llm, system_prompt=SYSTEM)
    asyncio.run(run(agent, memory))
    first = dict(hook.deliveries)
    again = FunctionAgent(tools=[fetch], llm=DemotingLLM(function_llm(seen2 := [], 1)))
    asyncio.run(run(again, memory, "And the summary page?"))
    assert all(hook.deliveries[k] == 1 for k in first)
    assert max(request_tokens(demoter, s) for s in seen + seen2) <= LIMIT
    check_request(seen2[0])


def test_recall_tool_finds_what_the_run_archived_while_it_runs(tmp_path: Path) -> None:
    memory, hook, _ = setup(tmp_path)
    recall = recall_tool(hook.archive, memory)
    found: list[str] = []

    def read(n: int) -> str:
        """Fetch page ``n``; at the last page, look page 0 up in the archive."""
        if n == 9:
            found.append(str(recall.call(query="w0x5")))
        return page(n)

    agent = FunctionAgent(
        tools=[read], llm=DemotingLLM(function_llm(seen := [], 10, tool="read")), system_prompt="s"
    )
    asyncio.run(run(agent, memory))
    assert found and "w0x5" in found[0], "page 0 left the window and is in the archive"
    assert all("page 0:" not in text_of(m) for m in seen[-1]), "and not in the request"


def test_recall_goes_after_the_opener_with_what_left_the_window(tmp_path: Path) -> None:
    hook = CountingArchive(tmp_path / "archive.db")
    demoter = Demoter(SlidingWindow.last_tokens(LIMIT), hook, hook_wait=None)
    memory = DemotingMemory.from_defaults(
        demoter=demoter, chat_store_key="agent", recall=hook.archive, recall_k=2
    )
    seen: list[list[ChatMessage]] = []
    agent = FunctionAgent(tools=[fetch], llm=DemotingLLM(function_llm(seen, 8)))
    asyncio.run(run(agent, memory, "Read the report: page w0x5 first, then the rest."))
    recalled = [s for s in seen if any(text_of(m).startswith(RECALL_PREFIX) for m in s)]
    assert recalled, "once page 0 left the window, recall brings it back"
    for sent in recalled:
        at = next(i for i, m in enumerate(sent) if text_of(m).startswith(RECALL_PREFIX))
        assert sent[at].role == MessageRole.USER
        # Right after the question (the run's opener) and the progress note that follows it.
        opener = next(i for i, m in enumerate(sent) if text_of(m).startswith("Read the report"))
        after_note = at == opener + 2 and text_of(sent[at - 1]).startswith(PROGRESS_PREFIX)
        assert at == opener + 1 or after_note
        assert all(m.role != MessageRole.SYSTEM for m in sent[opener:]), "one system block"
        assert request_tokens(demoter, sent) <= LIMIT, "the recall's budget is reserved"
    assert max(hook.deliveries.values()) == 1


# -- the other agent shapes ----------------------------------------------------------------


def test_react_agent_every_call_is_within_the_limit_with_steps_whole(tmp_path: Path) -> None:
    memory, hook, demoter = setup(tmp_path)
    seen: list[list[ChatMessage]] = []
    agent = ReActAgent(tools=[fetch], llm=DemotingLLM(react_llm(seen, 12)), streaming=False)
    answer = asyncio.run(run(agent, memory))
    assert str(answer) == "read it all"
    assert len(seen) == 13
    header = request_tokens(demoter, seen[0][:1])  # ReAct's system header, tools described
    for sent in seen:
        assert sent[0].role == MessageRole.SYSTEM and "fetch" in text_of(sent[0])
        assert text_of(sent[1]) == TASK, "the opener, not an observation, starts the window"
        assert request_tokens(demoter, sent) <= LIMIT, "the header is reserved"
        steps = sent[2:]
        # Every action keeps its observation right after it.
        for i, m in enumerate(steps):
            if text_of(m).startswith("Thought") and "Action:" in text_of(m):
                assert text_of(steps[i + 1]).startswith("Observation:")
    assert header > 0 and len(seen[-1]) < 10
    # The steps that left the window were archived during the run, once each. ReAct then
    # puts the run into memory as one message (all steps' text joined): a history that
    # differs from the one the steps were numbered in, so it is re-synced; no key is
    # delivered again (the archive holds them), and the joined message is one more.
    assert len(hook.deliveries) > 10 and max(hook.deliveries.values()) == 1
    assert [text_of(m)[:7] for m in memory.get_all()] == [TASK[:7], "Thought"]


def test_code_act_agent_is_bounded(tmp_path: Path) -> None:
    memory, _hook, demoter = setup(tmp_path)
    seen: list[list[ChatMessage]] = []

    def respond(messages: Any, **kwargs: Any) -> ChatMessage:
        seen.append(list(messages))
        if len(seen) > 8:
            return ChatMessage(role="assistant", content="read it all")
        return ChatMessage(role="assistant", content=f"<execute>\nfetch({len(seen)})\n</execute>")

    async def execute(code: str) -> dict[str, Any]:
        n = int(code.strip().split("(")[1].rstrip(")"))
        return {"stdout": page(n), "stderr": "", "error": ""}

    llm = DemotingLLM(MockFunctionCallingLLM(response_generator=respond, is_chat_model=True))
    agent = CodeActAgent(code_execute_fn=execute, tools=[fetch], llm=llm, streaming=False)
    asyncio.run(run(agent, memory))
    assert len(seen) == 9
    for sent in seen:
        assert sent[0].role == MessageRole.SYSTEM and text_of(sent[1]) == TASK
    assert max(request_tokens(demoter, s) for s in seen) <= LIMIT
    assert demoter.state_of(memory.chat_store_key).window_start > 1


def test_agent_workflow_handoff_shares_one_memory_and_archives_once(tmp_path: Path) -> None:
    memory, hook, demoter = setup(tmp_path)
    seen_a: list[list[ChatMessage]] = []
    seen_b: list[list[ChatMessage]] = []

    def first(messages: Any, **kwargs: Any) -> ChatMessage:
        seen_a.append(list(messages))
        step = newest_page(messages) + 1
        if step >= 6:
            call = ToolCallBlock(
                tool_call_id=f"hand-{step}",
                tool_name="handoff",
                tool_kwargs={"to_agent": "writer", "reason": "pages read"},
            )
        else:
            call = ToolCallBlock(
                tool_call_id=f"call-{step}", tool_name="fetch", tool_kwargs={"n": step}
            )
        return ChatMessage(role="assistant", blocks=[call])

    reader = FunctionAgent(
        name="reader",
        description="reads pages",
        tools=[fetch],
        llm=DemotingLLM(MockFunctionCallingLLM(response_generator=first, is_chat_model=True)),
        can_handoff_to=["writer"],
    )
    writer = FunctionAgent(
        name="writer",
        description="writes",
        tools=[fetch],
        llm=DemotingLLM(function_llm(seen_b, 12)),
    )
    workflow = AgentWorkflow(agents=[reader, writer], root_agent="reader")

    async def go() -> Any:
        return await workflow.run(user_msg=TASK, memory=memory, max_iterations=100)

    answer = asyncio.run(go())
    assert str(answer) == "read it all"
    assert seen_a and seen_b
    for sent in seen_a + seen_b:
        assert request_tokens(demoter, sent) <= LIMIT + 400  # the handoff tool's schema
        check_request(sent)
    assert max(hook.deliveries.values()) == 1
    asyncio.run(memory.aget())
    assert max(hook.deliveries.values()) == 1


# -- pausing, saving, resuming ---------------------------------------------------------------


async def confirm(ctx: Context, n: int) -> str:
    """Fetch page ``n`` once a human confirms it."""
    answer = await ctx.wait_for_event(
        HumanResponseEvent, waiter_id=f"page-{n}", waiter_event=InputRequiredEvent(prefix=str(n))
    )
    return page(n) + f" ({answer.response})"


# LlamaIndex finds a tool's context parameter by its annotation, which this module's
# ``from __future__ import annotations`` leaves a string.
confirm.__annotations__["ctx"] = Context


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_human_in_the_loop_resume_from_a_saved_context(tmp_path: Path, serializer: str) -> None:
    hook = CountingArchive(tmp_path / "archive.db")
    demoter = register("li-hitl", Demoter(SlidingWindow.last_tokens(LIMIT), hook, hook_wait=None))
    try:
        memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="hitl")
        seen: list[list[ChatMessage]] = []
        llm = DemotingLLM(function_llm(seen, 8, tool="confirm"))
        agent = FunctionAgent(tools=[confirm], llm=llm, system_prompt=SYSTEM)
        chosen = JsonSerializer() if serializer == "json" else PickleSerializer()
        cut: list[int] = []

        async def go() -> Any:
            handler = agent.run(TASK, memory=memory, max_iterations=50)
            saved = None
            async for ev in handler.stream_events():
                if isinstance(ev, InputRequiredEvent):
                    if ev.prefix == "5" and saved is None:
                        saved = handler.ctx.to_dict(serializer=chosen)
                        cut.append(demoter.state_of("hitl").window_start)
                        break
                    handler.ctx.send_event(HumanResponseEvent(response="ok"))
            await handler.cancel_run()
            assert saved is not None
            # Resume from the saved context: its memory is restored (a new object).
            ctx = Context.from_dict(agent, saved, serializer=chosen)
            handler = agent.run(ctx=ctx)
            handler.ctx.send_event(HumanResponseEvent(response="ok"))  # page 5's answer
            async for ev in handler.stream_events():
                if isinstance(ev, InputRequiredEvent):
                    handler.ctx.send_event(HumanResponseEvent(response="ok"))
            result = await handler
            restored = await ctx.store.get("memory")
            return result, restored

        result, restored = asyncio.run(asyncio.wait_for(go(), 120))
        assert str(result) == "read it all"
        assert isinstance(restored, DemotingMemory) and restored is not memory
        assert max(request_tokens(demoter, s) for s in seen) <= LIMIT + 200
        assert cut[0] > 1, "saved after the run cut its own steps"
        assert demoter.state_of("hitl").window_start > cut[0]
        assert max(hook.deliveries.values()) == 1, "nothing archived twice across the resume"
    finally:
        unregister("li-hitl")


def test_wrapped_llm_pickles_and_still_windows(tmp_path: Path) -> None:
    memory, _, demoter = setup(tmp_path)
    restored = pickle.loads(pickle.dumps(DemotingLLM(MockFunctionCallingLLM(is_chat_model=True))))
    assert isinstance(restored, DemotingLLM) and restored.metadata.is_function_calling_model
    assert isinstance(restored.llm, MockFunctionCallingLLM)
    seen: list[list[ChatMessage]] = []
    # A script is a local function (not picklable): the restored mock is given one.
    restored.llm._response_generator = function_llm(seen, 8)._response_generator
    asyncio.run(run(FunctionAgent(tools=[fetch], llm=restored), memory))
    assert len(seen) == 9 and max(request_tokens(demoter, s) for s in seen) <= LIMIT
    assert demoter.state_of(memory.chat_store_key).window_start > 1


# -- the LLM on its own ----------------------------------------------------------------------


def test_a_request_not_built_from_a_memory_read_is_handed_on_as_is() -> None:
    seen: list[list[ChatMessage]] = []
    llm = DemotingLLM(function_llm(seen, 1))
    request = [ChatMessage(role="user", content=page(n)) for n in range(3)]
    llm.chat(request)
    asyncio.run(llm.achat(request))
    assert all(a is b for s in seen for a, b in zip(s, request, strict=True))


def test_sync_chat_windows_a_memory_request(tmp_path: Path) -> None:
    memory, hook, demoter = setup(tmp_path)
    memory.put(ChatMessage(role="user", content=TASK))
    seen: list[list[ChatMessage]] = []
    llm = DemotingLLM(function_llm(seen, 100))
    steps: list[ChatMessage] = []
    for n in range(6):
        steps.append(llm.chat_with_tools([], chat_history=[*memory.get(), *steps]).message)
        steps.append(
            ChatMessage(
                role="tool", content=page(n), additional_kwargs={"tool_call_id": f"call-{n}"}
            )
        )
    assert len(seen) == 6 and max(request_tokens(demoter, s) for s in seen) <= LIMIT
    assert demoter.state_of(memory.chat_store_key).window_start > 1
    assert max(hook.deliveries.values()) == 1


def test_wrapping_checks_its_llm() -> None:
    from demote.errors import ConfigError

    with pytest.raises(ConfigError, match="LlamaIndex LLM"):
        DemotingLLM("gpt")  # type: ignore[arg-type]
    inner = function_llm([], 1)
    assert DemotingLLM(DemotingLLM(inner)).llm is inner
