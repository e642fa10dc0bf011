"""The note a cut leaves, through a real ``create_agent`` loop (issue 36).

The middleware hands the engine LangChain's own messages; their neutral form gives the
note the trail of the agent's calls (tool names and arguments), and each kept identifier
comes under the call whose result held it.
"""

from __future__ import annotations

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from demote import Demoter, SlidingWindow
from demote.engine import PROGRESS_PREFIX, SUMMARY_PREFIX
from demote.window.digest import NOTE_LEAD
from langchain_demote import DemotingMiddleware
from tests.langchain_demote.support import ScriptedToolModel


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"1\tdef handler_{path[-3:]}(): return load_config('cfg_{path[-3:]}.yaml')"


class Reader(ScriptedToolModel):
    """Reads forty files, one call at a time, then answers."""

    def reply(self, messages: list[BaseMessage], last_human: int) -> AIMessage:
        k = len(self.calls) - 1
        if k >= 40:
            return AIMessage("done")
        call = {"name": "read_file", "args": {"path": f"/srv/app/m{k:03d}"}, "id": f"t{k}"}
        return AIMessage("", tool_calls=[call])


def _note(request: list[BaseMessage]) -> str | None:
    for m in request:
        text = m.text
        for lead in (PROGRESS_PREFIX, SUMMARY_PREFIX):
            if text.startswith(lead + NOTE_LEAD):
                return text[len(lead) :]
    return None


def test_the_note_names_the_calls_and_what_their_results_held() -> None:
    model = Reader()
    demoter = Demoter(SlidingWindow.last_tokens(900))
    agent = create_agent(model, [read_file], middleware=[DemotingMiddleware(demoter)])
    try:
        out = agent.invoke({"messages": [HumanMessage("Fix the handlers")]})
    finally:
        demoter.close()
    assert out["messages"][-1].text == "done"
    notes = [n for n in map(_note, model.calls) if n is not None]
    assert notes, "a cut left a note"
    last = notes[-1]
    did = last.split("Did:\n")[1].split("\nSaw:")[0].split("\n")
    # The trail: the agent's own calls, newest first, with their arguments.
    assert did[0].startswith("- read_file path=/srv/app/m0")
    assert did == sorted(did, reverse=True)
    # What a result held, under the call that produced it, with its line number.
    saw = last.split("Saw:\n")[1].split("\n")
    assert saw[0].startswith("[read_file /srv/app/m0") and ": 1: handler_" not in saw[0]
    assert "] 1: handler_" in saw[0] and "cfg_" in saw[0]
    # What left the window is no longer sent, and the note stands in for it.
    final = model.calls[-1]
    assert not any(isinstance(m, ToolMessage) and m.tool_call_id == "t0" for m in final)
    assert _note(final) is not None
