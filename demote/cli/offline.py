"""An offline stand-in for a chat model: it answers only from what it is given.

The demo must run with no server, no API key and nothing downloaded, yet
show a model answering a late question from text that recall put back into its prompt.
:class:`OfflineResponder` does exactly that, without any framework:

- *Recorded replies.* When the conversation being replayed has a recorded assistant reply
  for the newest user message, it says that reply (so a replayed chat reads as it was
  written). Replies are consumed in order, so a repeated question gets its own reply.
- *Grounded answers.* Otherwise it quotes the line of its prompt most relevant to the
  question (IDF-weighted overlap of content words, crudely stemmed), or says that nothing
  in front of it answers the question. It never invents anything, so if the answer is
  quoted, the memory really delivered it.

``langchain_demote.demo.OfflineChatModel`` and ``llamaindex_demote.demo.OfflineLLM`` wrap it
as a LangChain chat model and a LlamaIndex LLM.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Sequence

from demote.engine import PROGRESS_PREFIX, SUMMARY_PREFIX
from demote.request import RECALL_PREFIX

__all__ = [
    "GROUNDED_PREFIX",
    "SYSTEM_PROMPT",
    "UNKNOWN_REPLY",
    "OfflineResponder",
    "content_terms",
    "relevant_line",
]

#: The system prompt of the demo's chain and chat engine.
SYSTEM_PROMPT = (
    "You are a friendly everyday assistant. Answer briefly. When messages recalled from "
    "earlier in the conversation are given, use them."
)

#: How a grounded answer starts (the quoted line follows, in double quotes).
GROUNDED_PREFIX = "From what I have in front of me: "
#: The answer when nothing in the prompt shares a content word with the question.
UNKNOWN_REPLY = "I don't have anything about that in front of me."

_WORD = re.compile(r"[^\W_]+")
_STOP_TEXT = """
    a about after again ago all also am an and any are as at back be because been before but
    by can could did do does don earlier for from get got had has have he her here him his how
    i if in into is it its just know let like me my no not now of on once one or our out please
    remember remind she so some tell that the their them then there they think this to told
    too up us was we were what when where which who why will with would you your
"""
_STOP = frozenset(_STOP_TEXT.split())
# Lines the model should not quote: framing the memory adds around recalled text.
_FRAMING = re.compile(
    "^("
    + "|".join(
        re.escape(p.strip().rstrip(":")) for p in (RECALL_PREFIX, SUMMARY_PREFIX, PROGRESS_PREFIX)
    )
    + ")",
    re.IGNORECASE,
)
# What the memory adds as a user message (never the user's question).
_ADDED = (RECALL_PREFIX, SUMMARY_PREFIX, PROGRESS_PREFIX)
_ROLE_PREFIX = re.compile(r"^[-*]?\s*(user|assistant|human|ai|system|tool)\s*:\s*", re.IGNORECASE)


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def content_terms(text: str) -> set[str]:
    """The lowercased, crudely stemmed content words of ``text`` (stop words dropped)."""
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1}


def relevant_line(question: str, lines: Sequence[str]) -> str | None:
    """The line of ``lines`` that best answers ``question``, or ``None`` if none relates.

    Each line scores the summed inverse document frequency (over ``lines``) of the
    question's content words it contains; ties go to the later line (the newer fact).

    Args:
        question: The question.
        lines: Candidate lines (already split and stripped).

    Returns:
        The best line, or ``None`` when no line shares a content word with the question.
    """
    wanted = content_terms(question)
    if not wanted:
        return None
    bags = [content_terms(line) & wanted for line in lines]
    df = {t: sum(t in bag for bag in bags) for t in wanted}
    n = len(lines)
    best, best_score = None, 0.0
    for line, bag in zip(lines, bags, strict=True):
        score = sum(math.log(1 + n / df[t]) for t in bag)
        if score > 0 and score >= best_score:
            best, best_score = line, score
    return best


def _lines(texts: Iterable[str]) -> list[str]:
    out = []
    for text in texts:
        for raw in text.splitlines():
            line = _ROLE_PREFIX.sub("", raw.strip())
            if line and not _FRAMING.match(line):
                out.append(line)
    return out


class OfflineResponder:
    """Answers a chat from its prompt alone (see the module docstring).

    Example::

        responder = OfflineResponder([("Hi!", "Hello, how was the run?")])
        responder.reply([("user", "Hi!")])                    # 'Hello, how was the run?'
        responder.reply([("system", "- user: my locker code is 4512"),
                         ("user", "What is my locker code?")])
        # 'From what I have in front of me: "my locker code is 4512"'

    Args:
        recorded: ``(user text, assistant reply)`` pairs of the conversation being
            replayed; each is said once, in order, when its user text is the newest
            user message.
    """

    def __init__(self, recorded: Iterable[tuple[str, str]] = ()) -> None:
        self._recorded: dict[str, deque[str]] = {}
        for user, reply in recorded:
            self._recorded.setdefault(user.strip(), deque()).append(reply)
        self.calls = 0
        self.grounded = 0

    def add_recorded(self, user: str, reply: str) -> None:
        """Queue one more recorded reply for the user text ``user``."""
        self._recorded.setdefault(user.strip(), deque()).append(reply)

    def reply(self, messages: Sequence[tuple[str, str]]) -> str:
        """The reply to a prompt given as ``(role, text)`` pairs, oldest first.

        Args:
            messages: The prompt; the newest ``user`` message is the question (not what
                the memory adds as user messages: recall, a summary, a progress note).

        Returns:
            The recorded reply for the question if there is one left, else a grounded
            answer that quotes one line of the prompt, else :data:`UNKNOWN_REPLY`.
        """
        self.calls += 1
        last = max(
            (
                i
                for i, (role, text) in enumerate(messages)
                if role == "user" and not text.startswith(_ADDED)
            ),
            default=-1,
        )
        if last < 0:
            return UNKNOWN_REPLY
        question = messages[last][1]
        queue = self._recorded.get(question.strip())
        if queue:
            return queue.popleft()
        self.grounded += 1
        context = [text for i, (_, text) in enumerate(messages) if i != last]
        asked = " ".join(question.split()).lower()
        lines = [line for line in _lines(context) if " ".join(line.split()).lower() != asked]
        line = relevant_line(question, lines)  # an earlier copy of the question answers nothing
        return UNKNOWN_REPLY if line is None else f'{GROUNDED_PREFIX}"{line}"'
