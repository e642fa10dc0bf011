"""Section 7 on recorded runs: the metric definitions on hand-made cases, and a short run.

The definitions are issue 29's (see :mod:`bench.agent_metrics`). The replay is LangChain's
own ``create_agent``; only the model (the recorded answers) and the tools (the recorded
results) are scripted, since no model can run here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # ``bench`` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

pytest.importorskip("langchain")

from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from bench import agent_metrics as metrics  # noqa: E402
from bench.agent_run import replay  # noqa: E402
from bench.agents_real import BASELINE, bench, runs, split  # noqa: E402
from bench.real_traces import (  # noqa: E402
    HELD_OUT,
    chain,
    held_out,
    load,
    parse,
    sessions_dir,
    traces_dir,
)
from demote.cli.cachecost import ANTHROPIC, OPENAI_AUTO  # noqa: E402


def call(call_id: str, /, **args: object) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "tool", "args": args, "id": call_id}])


def test_pieces_are_identifier_like_runs() -> None:
    text = 'open("src/app.py") id=R-12345, plain words|x@y.com;[ab_cde] 123456 ab_cd abc.d'
    assert metrics.pieces(text) == ["src/app.py", "R-12345", "x@y.com", "ab_cde", "123456"]
    # six characters at least, and a digit or one of / _ . @ - (none in "plainwords")
    assert metrics.pieces("plainwords abcde1 a.b.c") == ["abcde1"]


def test_call_pieces_reach_nested_arguments() -> None:
    answer = call("c", path="a/b/c.txt", opts={"ids": ["ID-0001", {"deep": "x_y_z1"}]}, n=7)
    assert metrics.call_pieces(answer) == ["a/b/c.txt", "ID-0001", "x_y_z1"]
    assert metrics.call_pieces(AIMessage("no calls here: a/b/c.txt")) == []


RUN: list[BaseMessage] = [
    SystemMessage("You are an agent; logs go to /var/log/agent.log"),
    HumanMessage("book it for user_42"),
    call("c1", query="flights"),
    ToolMessage("reservation R-12345 written to /tmp/out_2.log", tool_call_id="c1"),
    call("c2", id="R-12345", files=["/tmp/out_2.log"], user="user_42", log="/var/log/agent.log"),
    ToolMessage("done", tool_call_id="c2"),
    AIMessage("Booked."),
]


def test_grounded_counts_pieces_first_seen_in_a_tool_result() -> None:
    answers = [RUN[2], RUN[4], RUN[6]]
    # user_42 (the user's message) and the log path (the system prompt) are not counted:
    # they did not come from a tool result. R-12345 and /tmp/out_2.log did.
    everything = [RUN[:2], RUN[:4], RUN[:6]]
    g = metrics.grounded(RUN, answers, everything)
    assert (g.found, g.pieces, g.share) == (2, 2, 1.0)
    assert g.per_call == ((0, 0), (2, 2), (0, 0))
    # Call 2 sent without the result: neither piece is there.
    dropped = [RUN[:2], [RUN[0], RUN[1]], RUN[:6]]
    assert metrics.grounded(RUN, answers, dropped).share == 0.0
    # A placeholder that kept the id (in any message, call arguments included) counts.
    placeholder = ToolMessage("[cleared]", tool_call_id="x")
    kept_id = [RUN[0], RUN[1], call("x", note="R-12345"), placeholder]
    g = metrics.grounded(RUN, answers, [RUN[:2], kept_id, RUN[:6]])
    assert (g.found, g.pieces) == (1, 2)


def test_grounded_in_context_needs_a_word_that_stood_beside_the_piece() -> None:
    """Issue 36's definition: sent within 60 characters of a word (4+ letters, not part
    of the identifier) that stood within 60 characters of it in its tool result."""
    result = ToolMessage('{"reservation": "ZFA04Y", "flight": "8JD3KQ"}', tool_call_id="a")
    run: list[BaseMessage] = [
        HumanMessage("book it"),
        call("a", q="find"),
        result,
        call("b", code="ZFA04Y"),
    ]
    answers = [run[1], run[3]]

    def sent(text: str) -> list[list[BaseMessage]]:
        return [run[:1], [run[0], HumanMessage(text)]]

    # A bare list: grounded, not in context.
    bare = metrics.grounded(run, answers, sent("ids: ZFA04Y 8JD3KQ /srv/app/x.py"))
    assert (bare.found, bare.in_context, bare.pieces) == (1, 0, 1)
    # Beside its word (any case): both.
    keyed = metrics.grounded(run, answers, sent("Reservation ZFA04Y"))
    assert (keyed.found, keyed.in_context, keyed.context_share) == (1, 1, 1.0)
    # A word farther than 60 characters does not count.
    far = metrics.grounded(run, answers, sent("reservation" + " " * 61 + "ZFA04Y"))
    assert (far.found, far.in_context) == (1, 0)
    # The identifier's own letters are not its context.
    assert metrics.context_words("xx flight_reservation_1 yy", "flight_reservation_1") == set()
    assert metrics.context_words("the reservation: ZFA04Y, ok", "ZFA04Y") == {"reservation"}
    # The whole run (no memory) is in context by construction.
    assert metrics.grounded(run, answers, [run[:1], run[:3]]).in_context == 1


def test_billed_of_a_known_prefix_sequence() -> None:
    count = metrics.Counter()
    first = [SystemMessage("s" * 4000), HumanMessage("h" * 400)]
    second = [*first, AIMessage("a" * 800)]
    third = [first[0], AIMessage("a" * 800)]  # the history changed after the system prompt
    t1 = sum(count(m)[1] for m in first)
    t2 = sum(count(m)[1] for m in second)
    t3 = sum(count(m)[1] for m in third)
    system = count(first[0])[1]
    assert t1 >= 1024 and system < 1024  # the system prompt alone is too short to cache
    expected = 1.25 * t1 + (0.1 * t1 + 1.25 * (t2 - t1)) + 1.25 * t3
    got = metrics.billed([first, second, third], ANTHROPIC, count=count)
    assert got == pytest.approx(expected)
    cached = 1024 + (t1 - 1024) // 128 * 128  # OpenAI caches in 128-token steps
    expected = t1 + (0.1 * cached + (t2 - cached)) + t3  # no write premium
    assert metrics.billed([first, second, third], OPENAI_AUTO, count=count) == pytest.approx(
        expected
    )
    # Under 1,024 tokens nothing is cached and nothing is written: full price.
    small = [HumanMessage("x" * 100)]
    assert metrics.billed([small, small], ANTHROPIC, count=count) == 2 * count(small[0])[1]


def test_tool_definitions_come_first_in_the_prompt() -> None:
    count = metrics.Counter()
    tools = [{"type": "function", "function": {"name": "t", "description": "d" * 6000}}]
    request = [HumanMessage("x")]
    tokens = metrics.call_tokens([request], tools, count)[0]
    # The tool schemas alone reach 1,024 tokens: the second identical call reads them.
    assert metrics.billed([request, request], ANTHROPIC, tools=tools, count=count) == (
        pytest.approx(1.25 * tokens + 0.1 * tokens)
    )


def test_size_stats() -> None:
    stats = metrics.size_stats(list(range(1, 101)), 90)
    assert (stats["peak"], stats["p95"], stats["over"]) == (100, 95, 10)


def test_a_human_after_tool_results_cannot_replay() -> None:
    with pytest.raises(ValueError, match="human message right after tool results"):
        parse("x", [HumanMessage("go"), call("c1", q="a"), ToolMessage("r", tool_call_id="c1"),
                    HumanMessage("error!"), AIMessage("ok")])  # fmt: skip


def test_replay_answers_a_repeated_call_with_its_own_result() -> None:
    messages = [
        SystemMessage("sys"),
        HumanMessage("go"),
        call("c1", cmd="ls"),
        ToolMessage("first listing file_0001.txt", tool_call_id="c1"),
        call("c2", cmd="ls"),  # the same call again: the directory changed meanwhile
        ToolMessage("second listing file_0002.txt", tool_call_id="c2"),
        AIMessage("Two files."),
        HumanMessage("and now?"),
        call("c3", cmd="ls"),
        ToolMessage("third listing", tool_call_id="c3"),
    ]  # the recording stops after a step: the replay does too
    trace = parse("repeat", messages)
    run = replay(trace)
    assert len(run.requests) == 4
    assert [m.content for m in run.requests[2]] == [m.content for m in messages[:6]]
    assert [m.content for m in run.requests[3]] == [m.content for m in messages[:8]]
    g = metrics.grounded(trace.messages, trace.replies, run.requests)
    assert g.share is None or g.share == 1.0


needs_traces = pytest.mark.skipif(
    not traces_dir().is_dir(), reason=f"no recorded agent runs in {traces_dir()}"
)


@needs_traces
def test_two_short_dev_runs_at_one_limit() -> None:
    traces, skipped = load()
    assert len(traces) + len(skipped) >= 2
    short = sorted(traces, key=lambda t: len(t.replies))[:2]
    rows = {r["setup"]: r for r in bench(short, [4_000], ["demote"], quiet=True)}
    base, demote = rows[BASELINE], rows["demote"]
    # No memory is the reference: 1.00 in both shapes, and grounded by construction.
    assert base["billed_anthropic"] == base["billed_openai"] == 1.0
    assert base["billed_anthropic_total"] == 1.0
    assert base["grounded"] in (1.0, None) and base["grounded_run_mean"] in (1.0, None)
    assert base["calls"] == demote["calls"] == sum(len(t.replies) for t in short)
    assert demote["invalid"] == 0
    assert demote["billed_anthropic"] > 0 and demote["billed_openai"] > 0


@needs_traces
def test_chained_runs_are_long_and_replayable() -> None:
    traces, _ = load()
    long = chain(traces)
    sizes = [t.summary() for t in long]
    assert all(s["tokens"] >= 50_000 and s["tool_calls"] >= 100 for s in sizes), sizes
    for t in long:  # the runs' own ids repeat across runs (bash_1, ...); not once chained
        ids = [c["id"] for a in t.replies for c in a.tool_calls]
        assert len(ids) == len(set(ids)), t.name
    assert sum(s["model_calls"] for s in sizes) >= sum(len(t.replies) for t in traces)


needs_sessions = pytest.mark.skipif(
    not sessions_dir().is_dir(), reason=f"no long sessions in {sessions_dir()}"
)


@needs_sessions
def test_long_sessions_replay_and_split_by_owner_for_the_held_out_figures() -> None:
    sessions, skipped = load(sessions_dir())
    assert len(sessions) == 32 and not skipped
    held = [t for t in sessions if held_out(t)]
    # Whole owners are held out, so no repository is on both sides.
    assert len(held) == 7 and {t.owner for t in held} == HELD_OUT
    assert not {t.owner for t in sessions if not held_out(t)} & HELD_OUT
    two = [min(held, key=lambda t: len(t.replies)), min(sessions, key=lambda t: len(t.replies))]
    per = runs(two, [4_000], ["demote"], quiet=True)
    parts = split(per)
    rows = {r["setup"]: r for r in parts["all"]}
    assert {r["runs"] for r in parts["tuned"]} == {1} == {r["runs"] for r in parts["held out"]}
    base, demote = rows[BASELINE], rows["demote"]
    assert base["grounded"] == 1.0 and base["grounded_context"] > 0.99
    assert 0 < demote["grounded_context"] <= demote["grounded"] < 1
    assert demote["billed_anthropic"] < 0.5 and demote["invalid"] == 0
