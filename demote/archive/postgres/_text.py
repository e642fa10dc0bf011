"""What the PostgreSQL archive indexes, and the tsqueries it builds: user text is never syntax.

Text is split into words in Python, exactly as the SQLite archive's queries are
(:func:`demote.archive._fts.query_terms`: Unicode letters and digits, lowercased), with
diacritics folded off Latin letters (``café`` is ``cafe``, as FTS5's ``unicode61`` does),
and only the words, joined by spaces, reach ``to_tsvector``. The archive's text search
configuration stems every word with Snowball's ``porter`` stemmer, Porter's original
algorithm (FTS5's ``porter`` tokenizer implements the same) and drops no stop words, so a
message gives PostgreSQL the tokens it gives FTS5. The query side goes the same way: each
query term becomes lexemes through the same ``to_tsvector`` (in the database), and each
lexeme becomes a quoted tsquery literal restricted to the weights of the columns searched
(:func:`term_query`). Nothing a user types is ever parsed as tsquery syntax.

Weights stand for the SQLite archive's columns: ``A`` the text, ``B`` the context, ``C``
the neighbours' text, ``D`` the conversation's scope token alone.

A ``tsvector`` holds at most 1 MB, so the words indexed per text are cut at
:data:`MAX_INDEXED` characters (the whole text is stored and returned); words longer than
PostgreSQL indexes (2,047 bytes) are left out.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

__all__ = ["MAX_INDEXED", "fold", "index_words", "literal", "term_query", "weights_of"]

#: Characters of a text's (or a context's) words indexed; the rest is stored, not indexed.
MAX_INDEXED = 40_000
_WORD = re.compile(r"[^\W_]+", re.UNICODE)  # as demote.archive._fts splits queries
_MAX_WORD_BYTES = 2047  # PostgreSQL skips longer words (with a notice)


def fold(word: str) -> str:
    """``word`` with diacritics removed from Latin letters (``é`` -> ``e``)."""
    if word.isascii():
        return word
    out = []
    for char in word:
        base = unicodedata.normalize("NFD", char)
        out.append(base[0] if len(base) > 1 and base[0].isascii() else char)
    return "".join(out)


def index_words(text: str, limit: int = MAX_INDEXED) -> str:
    """The words of ``text`` as the archive indexes them: lowercased, folded, space-joined."""
    words: list[str] = []
    size = 0
    for match in _WORD.finditer(text.lower()):
        word = fold(match.group())
        if len(word.encode("utf-8")) > _MAX_WORD_BYTES:
            continue
        size += len(word) + 1
        if size > limit + 1:
            break
        words.append(word)
    return " ".join(words)


def literal(lexeme: str) -> str:
    """``lexeme`` as a quoted tsquery operand (quotes and backslashes doubled)."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def term_query(lexemes: Sequence[str], weights: str) -> str:
    """The tsquery text of one query term restricted to ``weights`` (``"AB"``, say).

    A term of several lexemes is a phrase (``<->``), as a quoted FTS5 string of several
    tokens is.
    """
    return " <-> ".join(f"{literal(lexeme)}:{weights}" for lexeme in lexemes)


def weights_of(columns: Sequence[str]) -> str:
    """The tsvector weights of the SQLite archive's column names."""
    letters = {"text": "A", "context": "B", "adjacent": "C", "scope": "D"}
    return "".join(letters[c] for c in columns)
