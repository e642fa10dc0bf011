"""Child process for test_llamaindex_persist: chat some turns, report what was delivered.

Usage: python _persist_child.py DIR FIRST LAST sync|async
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings
from pathlib import Path

from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM

from demote import CallbackHook, Demotion, FanOutHook, SlidingWindow, SQLiteStateStore
from demote.archive.sqlite import SQLiteArchive
from llamaindex_demote import DemotingMemory
from tests.llamaindex_demote.support import FileChatStore

warnings.simplefilter("error")
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"llama_index\..*")


def main() -> None:
    folder, first, last, flavour = (
        Path(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
    )
    delivered: list[int] = []

    def record(batch: Demotion) -> None:
        delivered.extend(m.index for m in batch.messages)

    state = SQLiteStateStore(folder / "state.db")
    archive = SQLiteArchive(folder / "archive.db")
    memory = DemotingMemory.from_defaults(
        policy=SlidingWindow.last_messages(6),
        hook=FanOutHook(CallbackHook(record), archive),
        state=state,
        chat_store=FileChatStore(path=folder / "chat.json"),
        chat_store_key="user-42",
    )
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(max_tokens=4), memory=memory)
    for i in range(first, last):
        if flavour == "sync":
            engine.chat(f"turn {i}")
        else:
            asyncio.run(engine.achat(f"turn {i}"))
    window = memory.get() if flavour == "sync" else asyncio.run(memory.aget())
    result = {
        "delivered": delivered,
        "window": [m.content for m in window],
        "start": memory.demoter.state_of("user-42").window_start,
        "archived": archive.count("user-42"),
        "history": len(memory.get_all()),
    }
    archive.close()
    state.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
