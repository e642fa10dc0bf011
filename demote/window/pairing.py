"""Tool calls the conversation moved on from without their results.

A tool call and its results go to the model together: the providers refuse a call whose
results do not follow it once another message comes after it. The window never separates
a call from its results (a step is the call and all of its results), but the history
itself can hold such a call: a human-in-the-loop interrupt the user abandoned by sending a
new message instead of resuming, or a run that died between the call and its result.

:func:`unanswered` finds them, framework-free, from each message's opened call ids and
the call id it answers; each adapter then sends the model a stand-in error result,
:data:`UNANSWERED`, for each, right after the results the call did get. A call at the very
end of the messages is about to run, and is left alone. Stored messages are never changed.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["UNANSWERED", "unanswered"]

UNANSWERED = "[no result: this call was interrupted before it ran]"
"""The text of the stand-in result the model is sent for a call that never got one."""


def unanswered(
    opens: Sequence[Sequence[str]], answers: Sequence[str | None]
) -> list[tuple[int, list[str]]]:
    """Where stand-in results go: ``(position, call ids)`` pairs, in order.

    Args:
        opens: For each message, the ids of the tool calls it opens (empty for most).
        answers: For each message, the id of the call it answers, or ``None``.

    Returns:
        For each message with calls that the next messages (its run of results) leave
        unanswered while something else follows, the position right after that run,
        with the missing ids in the order the message opened them. Empty when nothing
        dangles, which is the common case.
    """
    out: list[tuple[int, list[str]]] = []
    n = len(opens)
    i = 0
    while i < n:
        calls = opens[i]
        j = i + 1
        if calls:
            answered: set[str] = set()
            while j < n and answers[j] is not None:
                answered.add(answers[j])  # type: ignore[arg-type]
                j += 1
            missing = [c for c in dict.fromkeys(calls) if c not in answered]
            if missing and j < n:
                out.append((j, missing))
        i = j
    return out
