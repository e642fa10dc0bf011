"""Child process for test_llamaindex_workflows: one phase of a paused-and-resumed workflow.

Usage: python _workflow_child.py DIR PHASE SERIALIZER [--unnamed]

Every phase builds the same process: a Demoter on SQLite state and archive in DIR,
registered as ``"support"`` (``--unnamed``: not registered), and an ``AgentWorkflow``
whose tool waits for a human. Phases:

- ``pause``: five turns, then a turn whose tool asks for input; saves
  ``Context.to_dict(serializer)`` to DIR/ctx.json when the InputRequiredEvent arrives.
- ``resume``: ``Context.from_dict`` from DIR/ctx.json, sends the human's answer, finishes
  the run, then three more turns on the same context.
- ``pickle``: five turns, then pickles the memory to DIR/memory.pickle.
- ``unpickle``: unpickles it and chats three more turns through a FunctionAgent.

Prints one JSON line: what this process delivered to the hook, the demotion state, the
history, and what the restored memory is attached to.
"""

# No ``from __future__ import annotations``: LlamaIndex finds the tool's ``ctx: Context``
# parameter by its evaluated annotation.
import asyncio
import json
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.workflow import Context, HumanResponseEvent, InputRequiredEvent
from workflows.context.serializers import BaseSerializer, JsonSerializer, PickleSerializer

from demote import CallbackHook, Demoter, Demotion, FanOutHook, SlidingWindow, SQLiteStateStore
from demote.archive.sqlite import SQLiteArchive
from demote.registry import register
from llamaindex_demote import DemotingMemory
from llamaindex_demote.messages import RECALL_PREFIX, text_of

warnings.simplefilter("error")
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"llama_index\..*")
warnings.filterwarnings("ignore", module="inspect", message=".*deprecated.*")

KEY = "conv"


def respond(messages: list[ChatMessage], **kwargs: Any) -> ChatMessage:
    """A user turn asking for something dangerous gets a tool call; a tool result, an answer.

    The newest message other than recall is what it answers (recall follows the question).
    """
    last = next(m for m in reversed(messages) if not text_of(m).startswith(RECALL_PREFIX))
    if last.role == MessageRole.TOOL:
        return ChatMessage(role="assistant", content=f"done: {text_of(last)}")
    if "dangerous" in text_of(last):
        call = ToolCallBlock(tool_call_id="c1", tool_name="dangerous_task", tool_kwargs={})
        return ChatMessage(role="assistant", blocks=[call])
    return ChatMessage(role="assistant", content=f"echo {text_of(last)}")


async def dangerous_task(ctx: Context) -> str:
    """A task that needs a human's confirmation first."""
    answer = await ctx.wait_for_event(
        HumanResponseEvent,
        waiter_id="confirm",
        waiter_event=InputRequiredEvent(prefix="are you sure?"),
    )
    return f"confirmed={answer.response}"


class Process:
    def __init__(self, folder: Path, serializer: str, named: bool) -> None:
        self.folder = folder
        self.delivered: list[int] = []
        self.archive = SQLiteArchive(folder / "archive.db")
        hook = FanOutHook(CallbackHook(self.record), self.archive)
        demoter = Demoter(
            SlidingWindow.last_messages(6), hook, state=SQLiteStateStore(folder / "state.db")
        )
        self.demoter = register("support", demoter) if named else demoter
        if named:
            register("support-archive", self.archive)
        self.serializer: BaseSerializer = (
            PickleSerializer() if serializer == "pickle" else JsonSerializer()
        )
        llm = MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)
        agent = FunctionAgent(tools=[dangerous_task], llm=llm, system_prompt="be careful")
        self.workflow = AgentWorkflow(agents=[agent])

    def record(self, batch: Demotion) -> None:
        self.delivered.extend(m.index for m in batch.messages)

    def memory(self) -> DemotingMemory:
        return DemotingMemory.from_defaults(
            demoter=self.demoter, chat_store_key=KEY, recall=self.archive, recall_k=2
        )

    def report(self, memory: Any, **extra: Any) -> None:
        state = self.demoter.state_of(KEY)
        out = {
            "delivered": self.delivered,
            "window_start": state.window_start,
            "archived": self.archive.count(KEY),
            "history": [text_of(m) for m in memory.get_all()] if memory is not None else [],
            "memory": type(memory).__name__,
            "same_demoter": getattr(memory, "demoter", None) is self.demoter,
            **extra,
        }
        print(json.dumps(out))

    async def pause(self) -> None:
        memory = self.memory()
        ctx = Context(self.workflow)
        for i in range(5):
            await self.workflow.run(user_msg=f"turn {i}", memory=memory, ctx=ctx)
        handler = self.workflow.run(user_msg="do the dangerous thing", ctx=ctx)
        data = None
        async for event in handler.stream_events():
            if isinstance(event, InputRequiredEvent):
                data = handler.ctx.to_dict(serializer=self.serializer)
                break
        await handler.cancel_run()
        assert data is not None, "the workflow never asked for input"
        (self.folder / "ctx.json").write_text(json.dumps(data))
        self.report(await handler.ctx.store.get("memory"))

    async def resume(self) -> None:
        data = json.loads((self.folder / "ctx.json").read_text())
        ctx = Context.from_dict(self.workflow, data, serializer=self.serializer)
        handler = self.workflow.run(ctx=ctx)
        handler.ctx.send_event(HumanResponseEvent(response="yes"))
        result = str(await handler)
        for i in range(5, 8):
            await self.workflow.run(user_msg=f"turn {i}", ctx=handler.ctx)
        self.report(await handler.ctx.store.get("memory"), result=result)

    async def pickle(self) -> None:
        memory = self.memory()
        for i in range(5):
            await self.workflow.run(user_msg=f"turn {i}", memory=memory)
        (self.folder / "memory.pickle").write_bytes(pickle.dumps(memory))
        self.report(memory)

    async def unpickle(self) -> None:
        memory = pickle.loads((self.folder / "memory.pickle").read_bytes())
        for i in range(5, 8):
            await self.workflow.run(user_msg=f"turn {i}", memory=memory)
        self.report(memory, recall=memory.get(input="turn 0")[-1].content)


def main() -> None:
    folder, phase, serializer = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    process = Process(folder, serializer, named="--unnamed" not in sys.argv)
    asyncio.run(getattr(process, phase)())


if __name__ == "__main__":
    main()
