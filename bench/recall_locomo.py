"""Evidence retained on LoCoMo: the active window alone versus window plus archive recall.

Each LoCoMo conversation is replayed turn by turn (speaker_a as ``user``, speaker_b as
``assistant``). The active window is the newest messages that fit in ``window_tokens``
(about ``ceil((len(text) + len(role)) / 4) + 3`` tokens a message); whatever falls out is
delivered to the archive as :class:`~demote.records.Demotion` batches, as the engine would.
At the end, every question of categories 1-4 is asked: it counts as *retained* when each of
its evidence turns is in the window or among the top ``k`` messages the archive recalls for
the question text. Questions whose evidence is empty or names no turn of the conversation
(a few annotation slips) are skipped and counted.

Run ``python -m bench.recall_locomo`` (from the repository root) to print the table. The
data is read from ``../shared/data/locomo`` (or ``$DEMOTE_LOCOMO``); it is never copied.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from demote.hooks.archive import SQLiteArchive
from demote.records import DemotedMessage, Demotion, Recalled, fingerprint, make_key

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo"


class Archive(Protocol):
    def deliver(self, batch: Demotion) -> None: ...

    def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]: ...


@dataclass(frozen=True)
class Turn:
    dia_id: str
    role: str
    text: str
    speaker: str
    date: str


@dataclass(frozen=True)
class Conversation:
    name: str
    turns: tuple[Turn, ...]
    questions: tuple[tuple[str, int, frozenset[str]], ...]  # text, category, evidence
    skipped: int


def data_dir() -> Path:
    return Path(os.environ.get("DEMOTE_LOCOMO", DEFAULT_DATA))


def _evidence(raw: Sequence[str]) -> set[str]:
    # A few annotations join two ids ("D8:6; D9:17") or misplace a colon ("D:11:26").
    found: set[str] = set()
    for item in raw:
        for part in re.split(r"[;,\s]+", item):
            if part:
                found.add(re.sub(r"^D:", "D", part))
    return found


def load(path: Path) -> Conversation:
    doc = json.loads(path.read_text(encoding="utf-8"))
    roles = {doc["speaker_a"]: "user", doc["speaker_b"]: "assistant"}
    sessions = sorted(int(m.group(1)) for key in doc if (m := re.fullmatch(r"session_(\d+)", key)))
    turns = [
        Turn(
            t["dia_id"], roles[t["speaker"]], t["text"], t["speaker"], doc[f"session_{s}_date_time"]
        )
        for s in sessions
        for t in doc[f"session_{s}"]
    ]
    known = {t.dia_id for t in turns}
    questions, skipped = [], 0
    for qa in doc["qa"]:
        if qa["category"] not in CATEGORIES:
            continue
        evidence = _evidence(qa.get("evidence", []))
        if not evidence or not evidence <= known:
            skipped += 1
            continue
        questions.append((qa["question"], qa["category"], frozenset(evidence)))
    return Conversation(path.stem, tuple(turns), tuple(questions), skipped)


def conversations(directory: Path | None = None) -> Iterator[Conversation]:
    for path in sorted((directory or data_dir()).glob("conv-*.json")):
        yield load(path)


def tokens(role: str, text: str) -> int:
    return math.ceil((len(text) + len(role)) / 4) + 3


def replay(conv: Conversation, archive: Archive, window_tokens: int) -> int:
    """Feed ``conv`` through a token window, demoting into ``archive``; returns window start."""
    start, used, delivered = 0, 0, 0
    for i, turn in enumerate(conv.turns):
        used += tokens(turn.role, turn.text)
        while used > window_tokens and start <= i:
            used -= tokens(conv.turns[start].role, conv.turns[start].text)
            start += 1
        if start > delivered:
            batch = tuple(
                DemotedMessage(
                    role=t.role,  # type: ignore[arg-type]
                    text=t.text,
                    index=j,
                    key=make_key(conv.name, j, fingerprint(t.role, t.text)),
                    raw={"speaker": t.speaker, "date": t.date},
                )
                for j, t in enumerate(conv.turns[delivered:start], start=delivered)
            )
            archive.deliver(Demotion(conv.name, batch))
            delivered = start
    return start


def evaluate(
    archive_factory: Callable[[], Archive],
    window_tokens: int = 2000,
    ks: Sequence[int] = (5, 10),
    directory: Path | None = None,
) -> dict[str, Any]:
    """Evidence-retained rates for the window alone and for window plus top-``k`` recall.

    Args:
        archive_factory: Makes one empty archive; every conversation is delivered to it
            under its own conversation id.
        window_tokens: Token budget of the active window.
        ks: Recall depths to measure.
        directory: Where the ``conv-*.json`` files are (default: :func:`data_dir`).

    Returns:
        ``{"questions": n, "skipped": m, "seconds": s, "rates": {setup: {category: rate}}}``
        where setup is ``"window"`` or ``"k=5"`` etc., category is a category name or
        ``"overall"``, and rate is a fraction in ``[0, 1]``.
    """
    setups = ["window", *(f"k={k}" for k in ks)]
    hits = {s: {c: 0 for c in CATEGORIES} for s in setups}
    totals = dict.fromkeys(CATEGORIES, 0)
    skipped = 0
    began = time.perf_counter()
    archive = archive_factory()
    try:
        for conv in conversations(directory):
            skipped += conv.skipped
            start = replay(conv, archive, window_tokens)
            window = {t.dia_id for t in conv.turns[start:]}
            for question, category, evidence in conv.questions:
                totals[category] += 1
                missing = evidence - window
                hits["window"][category] += not missing
                for k in ks:
                    found = {
                        conv.turns[r.index].dia_id for r in archive.search(conv.name, question, k)
                    }
                    hits[f"k={k}"][category] += not (missing - found)
    finally:
        close = getattr(archive, "close", None)
        if close is not None:
            close()
    n = sum(totals.values())
    rates = {
        s: {
            **{CATEGORIES[c]: hits[s][c] / totals[c] for c in CATEGORIES if totals[c]},
            "overall": sum(hits[s].values()) / n if n else 0.0,
        }
        for s in setups
    }
    return {
        "questions": n,
        "skipped": skipped,
        "per_category": {CATEGORIES[c]: totals[c] for c in CATEGORIES},
        "seconds": time.perf_counter() - began,
        "rates": rates,
    }


def speaker_and_date(message: DemotedMessage) -> str | None:
    """Context for the archive: who said it and when (from the replay's ``raw``)."""
    raw = message.raw
    return f"{raw['speaker']} {raw['date']}" if isinstance(raw, dict) else None


def _table(title: str, result: dict[str, Any]) -> str:
    rates = result["rates"]
    columns = [*(CATEGORIES[c] for c in CATEGORIES), "overall"]
    lines = [
        f"{title}  ({result['questions']} questions, {result['skipped']} skipped, "
        f"{result['seconds']:.1f}s)",
        f"{'setup':<10}" + "".join(f"{c:>13}" for c in columns),
    ]
    for setup, row in rates.items():
        lines.append(f"{setup:<10}" + "".join(f"{row.get(c, 0.0):>12.1%} " for c in columns))
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> None:
    setups: dict[str, dict[str, Any]] = {
        "plain BM25 (coverage=0, neighbours=0)": {"coverage": 0.0, "neighbours": 0.0},
        "SQLiteArchive defaults": {},
        "defaults + speaker/date context": {"context": speaker_and_date},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for n, (title, options) in enumerate(setups.items()):
            path = Path(tmp) / f"archive-{n}.db"
            result = evaluate(lambda p=path, o=options: SQLiteArchive(p, **o))
            print(_table(title, result), end="\n\n")


if __name__ == "__main__":
    main(sys.argv[1:])
