"""The SQLite archive's entity index: who and what each message is about.

Theory of operation. A question often names someone or something ("What did Jenna give
Caroline for her birthday?") that the answering message only refers to ("She gave me a
necklace"). At archive time, :func:`mentions` finds the names a message uses (capitalised
words that are not the first of a sentence, or that are known names of the conversation
wherever they stand; stop words and ``I`` are never names) and resolves its third-person
pronouns (he, she, him, his, her, hers) to the last name the conversation used before
them that is not one of its speakers. Every ``(conversation, name, message)`` link goes
into the ``entities`` table this module creates; ``entity_state`` carries, per
conversation, the last name used, so pronouns resolve across deliveries.

At search time :func:`linked` returns, for each known name the query contains (all its
words among the query terms), the messages linked to it. The ranking
(:func:`demote.archive._rank.favour_entities`) multiplies their scores and lets the messages
of a rare name join the candidates even when they share no word with the query. The
speakers' own names are left to the speaker rule (a speaker's turns, not the turns that
address them, answer a question about them).

The links are bytes of the conversation: rows are deleted by a trigger with the message
they point to, so erasing a conversation erases its entity index too.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence

from demote.archive._fts import STOP_WORDS

__all__ = ["SCHEMA", "create", "index", "linked", "mentions"]

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS entities (
        conversation_id TEXT NOT NULL, entity TEXT NOT NULL, idx INTEGER NOT NULL,
        PRIMARY KEY (conversation_id, entity, idx)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS entity_state (
        conversation_id TEXT PRIMARY KEY, last TEXT NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TRIGGER IF NOT EXISTS entities_ad AFTER DELETE ON messages BEGIN
        DELETE FROM entities WHERE conversation_id = old.conversation_id AND idx = old.idx;
        DELETE FROM entity_state WHERE conversation_id = old.conversation_id
            AND NOT EXISTS (SELECT 1 FROM entities WHERE conversation_id = old.conversation_id);
    END""",
)

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_APOSTROPHE = "\u2019"  # the typographic apostrophe of "Jenna\u2019s"
_WORD = re.compile(r"[^\W\d_][\w'\u2019-]*", re.UNICODE)
_PRONOUNS = frozenset({"he", "she", "him", "his", "her", "hers"})
# Capitalised words that start sentences or greet, never names on their own.
_GREETINGS = """hey hi hello thanks thank wow yeah yep nope oh ah congrats glad sure okay ok
    sounds great awesome cool nice lol haha bye mr mrs ms dr"""
_NOT_NAMES = STOP_WORDS | frozenset(_GREETINGS.split())


def create(db: sqlite3.Connection) -> bool:
    """Create the index's tables if missing; ``True`` when they were just created."""
    found = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'entities'"
    ).fetchone()
    for statement in SCHEMA:
        db.execute(statement)
    return found is None


def _name(word: str) -> str:
    word = word.lower().replace(_APOSTROPHE, "'")
    return word[:-2] if word.endswith("'s") else word.strip("'-")


def mentions(text: str, known: set[str], speakers: set[str], last: str) -> tuple[set[str], str]:
    """The names ``text`` links to, and the last name used after it.

    Args:
        text: The message.
        known: Names the conversation already used (lowercased); they count wherever
            they stand, a sentence's first word included. New names are added to it.
        speakers: The conversation's speakers (lowercased); never a pronoun's referent.
        last: The last name used before this message (``""``: none).

    Returns:
        The linked names (lowercased), pronouns resolved to ``last`` as it stood when
        each pronoun was read; and the new ``last``.
    """
    found: set[str] = set()
    for sentence in _SENTENCE.split(text):
        for n, match in enumerate(_WORD.finditer(sentence)):
            word = match.group()
            lowered = word.lower()
            if lowered in _PRONOUNS:
                if last:
                    found.add(last)
                continue
            if not word[0].isupper():
                continue
            name = _name(word)
            if len(name) < 2 or name in _NOT_NAMES or (n == 0 and name not in known):
                continue
            known.add(name)
            found.add(name)
            if name not in speakers:
                last = name
    return found, last


def index(
    db: sqlite3.Connection,
    conversation_id: str,
    rows: Iterable[tuple[int, str]],
    speakers: Iterable[str],
) -> None:
    """Link newly stored ``(index, text)`` rows, in index order, inside the caller's transaction."""
    rows = sorted(rows)
    if not rows:
        return
    known = {
        e
        for (e,) in db.execute(
            "SELECT DISTINCT entity FROM entities WHERE conversation_id = ?", (conversation_id,)
        )
    }
    spoken = {s.lower() for s in speakers if s}
    state = db.execute(
        "SELECT last FROM entity_state WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    last = state[0] if state else ""
    links: list[tuple[str, str, int]] = []
    for idx, text in rows:
        names, last = mentions(text, known, spoken, last)
        links.extend((conversation_id, name, idx) for name in names)
    db.executemany("INSERT OR IGNORE INTO entities VALUES (?, ?, ?)", links)
    db.execute(
        "INSERT INTO entity_state VALUES (?, ?) ON CONFLICT (conversation_id) "
        "DO UPDATE SET last = excluded.last",
        (conversation_id, last),
    )


def rebuild(db: sqlite3.Connection) -> None:
    """Index every stored message, conversation by conversation (a file without the index)."""
    ids = [c for (c,) in db.execute("SELECT DISTINCT conversation_id FROM messages")]
    for conversation_id in ids:
        speakers = [
            s
            for (s,) in db.execute(
                "SELECT speaker FROM speakers WHERE conversation_id = ?", (conversation_id,)
            )
        ]
        rows = db.execute(
            "SELECT idx, text FROM messages WHERE conversation_id = ? ORDER BY idx, id",
            (conversation_id,),
        ).fetchall()
        index(db, conversation_id, rows, speakers)


def linked(
    db: sqlite3.Connection, conversation_id: str, terms: Sequence[str], speakers: Iterable[str]
) -> dict[str, frozenset[int]]:
    """For each known non-speaker name among the query ``terms``, the messages linked to it."""
    spoken = {s.lower() for s in speakers}
    wanted = sorted({_name(t) for t in terms} - spoken)
    if not wanted:
        return {}
    marks = ",".join("?" * len(wanted))
    found: dict[str, set[int]] = {}
    for entity, idx in db.execute(
        f"SELECT entity, idx FROM entities WHERE conversation_id = ? AND entity IN ({marks})",
        (conversation_id, *wanted),
    ):
        found.setdefault(entity, set()).add(int(idx))
    return {e: frozenset(s) for e, s in found.items()}
