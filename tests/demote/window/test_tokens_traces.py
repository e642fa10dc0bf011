"""The default count agrees with LangChain's ``count_tokens_approximately`` per request.

A window's limit means what users compare it with: langchain-core's approximate count
(what ``trim_messages``, ``SummarizationMiddleware`` and most dashboards use). For every
request an agent makes (the messages before each assistant message, system included) the
default ``"approx"`` count of the request must be within 2% of LangChain's. Measured on the
real agent runs of the development set (``../shared/data/agent_traces``, 31 runs; skipped
with a reason when absent) and on generated edge cases: empty content, many tiny tool
results, big tool-call arguments, unicode and escapes. The LlamaIndex adapter counts the
same messages the same way.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("langchain_core", reason="langchain-core not installed (demote[langchain])")

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
)
from langchain_core.messages.utils import count_tokens_approximately

from demote import Demoter, SlidingWindow
from langchain_demote.messages import to_core

BOUND = 0.02


def _traces_dir() -> Path | None:
    given = os.environ.get("DEMOTE_AGENT_TRACES")
    if given:
        return Path(given)
    root = Path(__file__).resolve().parents[3]  # the checkout
    for shared in (root.parent / "shared", root.parent.parent / "shared"):
        found = shared / "data" / "agent_traces"
        if found.is_dir():
            return found
    return None


TRACES = _traces_dir()


def _real_runs() -> list[tuple[str, list[BaseMessage]]]:
    if TRACES is None:
        return []
    runs = []
    for path in sorted(TRACES.glob("*.json")):
        with path.open(encoding="utf-8") as f:
            runs.append((path.stem, messages_from_dict(json.load(f)["messages"])))
    return runs


def _requests(messages: list[BaseMessage]) -> Iterator[int]:
    """The end of each request: every prefix that an assistant message answered."""
    for i, message in enumerate(messages):
        if isinstance(message, AIMessage) and i > 0:
            yield i


def _errors(messages: list[BaseMessage]) -> list[float]:
    """Relative error of demote's count of each request against LangChain's."""
    d = Demoter(SlidingWindow.last_tokens(10_000))
    ours = [to_core(m, d.describe).tokens for m in messages]
    # LangChain's count is a sum over messages (each rounded up, plus 3), so counting each
    # message once gives every prefix's count exactly; spot-checked against whole prefixes.
    theirs = [count_tokens_approximately([m]) for m in messages]
    errors = []
    mine = lc = 0
    last = 0
    for end in _requests(messages):
        mine += sum(ours[last:end])
        lc += sum(theirs[last:end])
        last = end
        errors.append((mine - lc) / lc)
    return errors


@pytest.mark.skipif(TRACES is None, reason="../shared/data/agent_traces is absent (dev set)")
def test_every_request_of_the_real_runs_counts_within_2_percent_of_langchain() -> None:
    runs = _real_runs()
    assert len(runs) >= 20, f"expected the 31 runs of the development set in {TRACES}"
    errors: list[float] = []
    for name, messages in runs:
        run = _errors(messages)
        worst = max(map(abs, run), default=0.0)
        assert worst <= BOUND, (name, worst)
        errors.extend(run)
        # The sum of per-message counts is LangChain's count of the whole request.
        ends = list(_requests(messages))
        for end in ends[:: max(1, len(ends) // 3)]:
            assert count_tokens_approximately(messages[:end]) == sum(
                count_tokens_approximately([m]) for m in messages[:end]
            )
    assert len(errors) > 1000


def _tiny_tools(n: int) -> list[BaseMessage]:
    out: list[BaseMessage] = [SystemMessage("Agent."), HumanMessage("go")]
    for i in range(n):
        cid = f"call_{i:024d}"
        out.append(AIMessage("", tool_calls=[{"name": "ls", "args": {}, "id": cid}]))
        out.append(ToolMessage("" if i % 3 else "ok", tool_call_id=cid, name="ls"))
    return [*out, AIMessage("done")]


def _big_args() -> list[BaseMessage]:
    code = "def f(x):\n    return \"it's\" + 'q' * x  # \\ backslash\n" * 600
    return [
        HumanMessage("Write the file."),
        AIMessage(
            "Writing it.",
            tool_calls=[
                {"name": "write_file", "args": {"path": "a.py", "content": code}, "id": "toolu_1"}
            ],
        ),
        ToolMessage("ok", tool_call_id="toolu_1", name="write_file"),
        AIMessage("Done."),
    ]


def _unicode(seed: int = 7) -> list[BaseMessage]:
    rng = random.Random(seed)
    alphabet = "aé中文😀\n\t\"'\\\u200b\x00 "
    out: list[BaseMessage] = [HumanMessage("Übersetze bitte 😀")]
    for i in range(40):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60)))
        args = {"q": text, "n": i, "flag": i % 2 == 0, "none": None, "xs": [1.5, text[:5]]}
        cid = f"c{i}"
        out.append(AIMessage(text[:10], tool_calls=[{"name": "search", "args": args, "id": cid}]))
        out.append(ToolMessage(text[::-1], tool_call_id=cid, name="search"))
    return [*out, AIMessage("fertig")]


def _parallel_empty() -> list[BaseMessage]:
    out: list[BaseMessage] = [HumanMessage("")]
    for r in range(20):
        calls = [{"name": "get", "args": {"k": str(j)}, "id": f"p{r}_{j}"} for j in range(6)]
        out.append(AIMessage("", tool_calls=calls))
        out.extend(ToolMessage("", tool_call_id=c["id"], name="get") for c in calls)
    return [*out, AIMessage("")]


EDGES = {
    "tiny-tool-results": lambda: _tiny_tools(300),
    "big-tool-call-args": _big_args,
    "unicode-and-escapes": _unicode,
    "parallel-empty": _parallel_empty,
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_cases_count_within_2_percent_of_langchain(name: str) -> None:
    errors = _errors(EDGES[name]())
    assert errors
    assert max(map(abs, errors)) <= BOUND, (name, max(errors), min(errors))


def test_llamaindex_counts_the_same_messages_the_same_way() -> None:
    pytest.importorskip("llama_index.core", reason="llama-index-core not installed")
    from llama_index.core.base.llms.types import (
        ChatMessage,
        MessageRole,
        TextBlock,
        ToolCallBlock,
    )

    from llamaindex_demote.messages import to_core as li_to_core

    def as_llamaindex(m: BaseMessage) -> ChatMessage:
        if isinstance(m, AIMessage):
            blocks: list[TextBlock | ToolCallBlock] = [TextBlock(text=str(m.content))]
            blocks += [
                ToolCallBlock(tool_call_id=c["id"], tool_name=c["name"], tool_kwargs=c["args"])
                for c in m.tool_calls
            ]
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
        if isinstance(m, ToolMessage):
            return ChatMessage(
                role=MessageRole.TOOL,
                content=str(m.content),
                additional_kwargs={"tool_call_id": m.tool_call_id, "name": m.name},
            )
        role = MessageRole.SYSTEM if isinstance(m, SystemMessage) else MessageRole.USER
        return ChatMessage(role=role, content=str(m.content))

    d = Demoter(SlidingWindow.last_tokens(10_000))
    runs = [(n, make()) for n, make in EDGES.items()] + _real_runs()[:8]
    for name, messages in runs:
        for m in messages:
            ours = to_core(m, d.describe).tokens
            assert li_to_core(as_llamaindex(m), d.describe).tokens == ours, (name, m)


@pytest.mark.skipif(TRACES is None, reason="../shared/data/agent_traces is absent (dev set)")
@pytest.mark.parametrize("clearing", [False, True], ids=["last_tokens", "clearing"])
def test_no_window_of_the_real_runs_is_over_the_limit_by_langchains_count(clearing: bool) -> None:
    """Replayed call by call: what each model call is sent, placeholders and clipped results
    included, counted by LangChain, stays within the limit (beyond the reported overhang)."""
    from demote import ClearToolResults
    from langchain_demote.history import render_window

    limit = 4000
    stage = ClearToolResults(trigger=limit // 2, keep=3, clear_at_least=limit // 8)
    policy = SlidingWindow(unit="tokens", limit=limit, clearing=stage if clearing else None)
    over, requests, shown = [], 0, 0
    for name, messages in _real_runs():
        d = Demoter(policy)
        for end in _requests(messages):
            window = d.load(name, messages[:end], lambda m, d=d: to_core(m, d.describe))
            sent = count_tokens_approximately(render_window(window))
            requests += 1
            shown += bool(window.placeholders or window.clipped)
            if sent > limit + window.overhang:
                over.append((name, end, sent, window.overhang))
    assert requests > 1000 and shown > 50  # placeholders and clipped results were sent
    assert over == []
