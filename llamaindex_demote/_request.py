"""One LLM request of an agent run, windowed: what :class:`~llamaindex_demote.DemotingLLM` sends.

:func:`prepare` is a generator, written once for the sync and async LLM methods, that
yields its I/O (the chat store's read, the Demoter's load, the recall search) as
:class:`~demote.flow.Twin` operations; ``drive_sync`` and ``drive_async``
run it. Steps:

1. find the ``DemotingMemory`` read the request was built from
   (:func:`llamaindex_demote._conversations.find`). Its messages split the request into the
   agent's *prefix* (its system prompt; ``ReActAgent``'s header with the tools), the
   *memory's part*, and the run's *steps* after it (``FunctionAgent``'s scratchpad,
   ``ReActAgent``'s reasoning). System messages at the very end (``early_stopping_method=
   "generate"``'s instruction) are instructions, not steps: they stay at the end. A request
   not built from a read is handed on as it is;
2. number the steps where the memory will keep them: the stored history
   (``memory.aget_all()``) and then the steps, the positions, and so the dedup keys, they
   get when the run ends and the agent puts its scratchpad into the memory;
3. load that whole history through the memory's Demoter, with the prefix, the trailing
   instructions and the tool schemas counted as ``reserved`` (in a token window). The
   engine plans the window (cuts at steps inside the run, the opener kept, results
   cleared or clipped, the policy's eviction), hands what left it to the hook once and
   commits. The load is recorded (:func:`llamaindex_demote._conversations.note_run`): the
   memory's own reads inside the run see only the stored history, so they load what
   this call loaded and show its stored part, changing nothing, and so does a request
   of the run without steps of its own (``early_stopping_method="generate"``'s last
   call). When the run ends, the memory's next read finds every step where it was
   numbered: nothing is handed over again;
4. render the window as the memory does (:func:`demote.request.compose`, recall as its
   reads place it: right after the question, the same at every call of the run until a
   cut; the memory blocks as its reads place them, :mod:`llamaindex_demote._block_slots`)
   and put the prefix in front and the instructions after it. In a token window the
   prefix, the instructions, the tool schemas, the recall's budget and the blocks' are all
   counted toward the limit, so the whole request stays within it.

``ReActAgent`` keeps its steps as text: an assistant message (``Thought: ... Action: ...``)
and a user message (``Observation: ...``); ``CodeActAgent`` sends the output of the code
an assistant message wrote as a user message (``Result of executing the code given:``).
A step's two messages are described to the engine as a call and its result (a call id
made of the step's position), so the engine cuts between steps and never between an
action and its result, and the task stays the opener.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole

from demote.engine import Window
from demote.flow import Flow, Twin
from demote.records import MessageRecord
from llamaindex_demote._conversations import Run, find, note_run, run_history, stored_part
from llamaindex_demote._rendering import Parts
from llamaindex_demote._shaping import shape
from llamaindex_demote.instrumentation import emit_events
from llamaindex_demote.messages import opened_calls, text_of, to_data

__all__ = ["OBSERVATIONS", "Prepared", "prepare"]

#: How ``ReActAgent`` and ``CodeActAgent`` start the text of a result they send as a user
#: message (a tool's observation; the output of the code the model wrote).
OBSERVATIONS = ("Observation:", "Result of executing the code given:")


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one request is sent, and the window it was planned from.

    ``window`` is ``None`` when the request was not built from a ``DemotingMemory`` read
    (it is then handed on as it is); ``reserved`` is what the load counted besides the
    history (prefix, trailing instructions, tool schemas).
    """

    messages: list[ChatMessage]
    window: Window[ChatMessage] | None = None
    reserved: int = 0


def _react_steps(steps: Sequence[ChatMessage], base: int) -> dict[int, tuple[bool, str]]:
    """``id(message) -> (opens, call id)`` for the text steps' action/result pairs in ``steps``.

    A result is a user message whose text starts with one of :data:`OBSERVATIONS` right
    after an assistant message without tool calls; the pair's call id is
    ``"step-<position of the action>"`` (stable across the run's requests).
    """
    pairs: dict[int, tuple[bool, str]] = {}
    for i in range(1, len(steps)):
        m, before = steps[i], steps[i - 1]
        if (
            m.role == MessageRole.USER
            and text_of(m).startswith(OBSERVATIONS)
            and before.role == MessageRole.ASSISTANT
            and not opened_calls(before)
        ):
            call = f"step-{base + i - 1}"
            pairs[id(before)] = (True, call)
            pairs[id(m)] = (False, call)
    return pairs


def _describer(parts: Parts, steps: Sequence[ChatMessage], base: int) -> Callable[..., Any]:
    """The memory's ``to_core``, with text steps described as calls and results."""
    pairs = _react_steps(steps, base)
    if not pairs:
        return parts.describe
    describe, plain = parts.demoter.describe, parts.describe

    def describe_step(message: ChatMessage) -> MessageRecord:
        pair = pairs.get(id(message))
        if pair is None:
            return plain(message)
        opens, call = pair
        text = text_of(message)
        if opens:
            return describe("assistant", text, opens=(call,), message=message, to_data=to_data)
        return describe("tool", text, answers=call, message=message, to_data=to_data)

    return describe_step


def prepare(
    messages: Sequence[ChatMessage], tool_tokens: Callable[[Callable[[str], int]], int]
) -> Flow[Prepared]:
    """The request to send instead of ``messages`` (see the module docstring).

    Args:
        messages: The request the agent built (``chat_history``).
        tool_tokens: Tokens of the tool schemas sent with it, under the given counter.
    """
    found = find(messages)
    if found is None:
        return Prepared(list(messages))
    read, start, end = found
    memory = read.memory
    parts, cid = memory._p, memory.chat_store_key
    prefix, rest = list(messages[:start]), list(messages[end:])
    k = len(rest)
    while k and rest[k - 1].role == MessageRole.SYSTEM:
        k -= 1
    steps, suffix = rest[:k], rest[k:]
    stored: list[ChatMessage] = yield Twin(memory.get_all, memory.aget_all)
    demoter = parts.demoter
    history = [*stored, *steps]
    describe = _describer(parts, steps, len(stored))
    # No steps of its own, inside a run (early stopping's last call): read what the run's
    # newest call read, as the memory's reads do, and show the stored part.
    inside = None if steps else run_history(demoter, cid, stored, parts.describe)
    reserved = 0
    if inside is not None:
        history, describe, reserved = inside
    elif demoter.policy.unit == "tokens":
        reserved = sum(parts.describe(m).tokens for m in (*prefix, *suffix))
        reserved += tool_tokens(demoter.policy.resolved_counter())
        reserved += parts.reserve()  # the recall message's budget
    load = functools.partial(demoter.load, cid, history, describe, reserved=reserved)
    aload = functools.partial(demoter.aload, cid, history, describe, reserved=reserved)
    window: Window[ChatMessage] = yield Twin(load, aload)
    if inside is None:
        last = parts.describe(stored[-1]).fingerprint if stored else None
        note_run(Run(demoter, len(stored), last, history, describe, reserved), cid)
    else:
        window = stored_part(window, len(stored))
    if window.events:
        emit_events(window.events)
    # As the memory's reads do: recall and the memory blocks, the newest user message the
    # question.
    body = yield from shape(parts, window, None)
    sent = [*prefix, *body, *suffix]
    if len(sent) == len(messages) and all(a is b for a, b in zip(sent, messages, strict=True)):
        sent = list(messages)  # the whole request: nothing cut, cleared or added
    return Prepared(sent, window, reserved)
