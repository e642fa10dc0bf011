"""Describing one message for the planner: its arguments checked, fingerprinted, counted.

:func:`describe_message` is what :meth:`demote.Demoter.describe` does (adapters call it
from ``to_core``): it checks what an adapter hands over, takes the fingerprint (role,
text, tool calls, the call a result answers, the calls' arguments and the content blocks)
and the tokens a provider bills for it (its role and, for a tool result, the tool's name
included, as langchain-core counts them), counted once per fingerprint by the Demoter's
:class:`~demote.window.tokens.TokenCache`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from demote._built import unchecked
from demote.errors import ArgumentTypeError, ConfigError
from demote.records import ROLES, MessageRecord, fingerprint, parts_digest
from demote.window.clearing import KEY_STAND_IN, LONG_ARG_CHARS, call_marker, clip_calls
from demote.window.tokens import MessageCounter, TokenCache

__all__ = ["describe_message"]

# Every new message makes one; its role is checked below and its count by the counter.
_new_record = unchecked(MessageRecord)


def _call_ids(opens: object) -> tuple[str, ...]:
    """``opens`` as a tuple of tool-call ids, or :class:`ArgumentTypeError`."""
    if isinstance(opens, str | bytes):
        raise ArgumentTypeError(f"opens: expected a sequence of str, got {opens!r:.80}")
    try:
        ids: tuple[object, ...] = tuple(cast("Iterable[object]", opens))
    except TypeError:
        raise ArgumentTypeError(f"opens: expected a sequence of str, got {opens!r:.80}") from None
    if not all(isinstance(c, str) for c in ids):
        raise ArgumentTypeError(f"opens: expected a sequence of str, got {ids!r:.80}")
    return cast("tuple[str, ...]", ids)


def describe_message(
    tokens: TokenCache,
    role: Any,
    text: str,
    opens: Sequence[str],
    answers: str | None,
    tool: str | None,
    calls: Sequence[Mapping[str, Any]],
    blocks: Sequence[object],
    message: object,
    to_data: Callable[[Any], dict[str, Any]] | None,
) -> MessageRecord:
    """One message's record, as :meth:`demote.Demoter.describe` documents it."""
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text: expected a str, got {type(text).__name__}")
    if not isinstance(role, str) or role not in ROLES:
        raise ConfigError(f"role must be one of {sorted(ROLES)}, got {role!r:.40}")
    if to_data is not None and not callable(to_data):
        raise ArgumentTypeError(f"to_data: expected a callable or None, got {to_data!r:.80}")
    if not (opens or calls or blocks) and answers is None and tool is None:
        # Text alone (most messages): nothing else to check, digest or count.
        fp = fingerprint(role, text)
        counted = tokens.count(fp, text, role=role, message=message)
        return _new_record(role, text, fp, counted, (), None, None, to_data, None, None)
    opens = _call_ids(opens) if opens else ()
    if answers is not None and not isinstance(answers, str):
        raise ArgumentTypeError(f"answers: expected a str or None, got {answers!r:.80}")
    if tool is not None and not isinstance(tool, str):
        raise ArgumentTypeError(f"tool: expected a str or None, got {tool!r:.80}")
    if calls and (
        not isinstance(calls, Sequence) or not all(isinstance(c, Mapping) for c in calls)
    ):
        raise ArgumentTypeError(f"calls: expected a sequence of mappings, got {calls!r:.80}")
    if blocks and (not isinstance(blocks, Sequence) or isinstance(blocks, str | bytes)):
        raise ArgumentTypeError(f"blocks: expected a sequence, got {blocks!r:.80}")
    parts = parts_digest(calls, blocks) if calls or blocks else None
    fp = fingerprint(role, text, opens, answers, parts)
    # What releases before parts_digest called it (their stored state and keys name it so).
    legacy = None if parts is None else fingerprint(role, text, opens, answers)
    counted = tokens.count(
        fp,
        text,
        calls=calls,
        blocks=blocks,
        answers=answers,
        role=role,
        name=tool,
        message=message,
    )
    clipped = None
    if role == "assistant" and calls and counted > LONG_ARG_CHARS // 4:
        clipped = _clipped_tokens(tokens, fp, text, calls, blocks, counted)
    # The role was checked against ROLES above (typing.cast would cost a call per message).
    return _new_record(role, text, fp, counted, opens, answers, tool, to_data, clipped, legacy)


def _clipped_tokens(
    tokens: TokenCache,
    fp: str,
    text: str,
    calls: Sequence[Mapping[str, Any]],
    blocks: Sequence[object],
    counted: int,
) -> int | None:
    """What the message counts with its long argument values cut (``None``: none is long).

    Counted as the window sends it (:func:`~demote.window.clearing.clip_calls` with the
    marker of a key of the same length), once per fingerprint. A whole-message counter
    has no text counter to count the cut form with: such calls are not clipped.
    """
    if isinstance(tokens.counter, MessageCounter):
        return None
    clip = clip_calls(calls, call_marker(KEY_STAND_IN, counted))
    if clip is None:
        return None
    return tokens.count(fp + "/clipped", text, calls=clip, blocks=blocks, role="assistant")
