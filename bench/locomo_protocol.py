"""The LoCoMo recall protocol: conversations read in place, replayed through a token window.

What :mod:`bench.recall_locomo` describes and sections 3, 3b and 6 share: each conversation
is loaded (:func:`conversations`), replayed turn by turn into a store (:func:`replay`), and
every question is scored as retained or not, by the window alone and with recall
(:func:`evaluate`, :func:`rates`).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from demote.records import DemotedMessage, Demotion, Recalled, fingerprint, make_key

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo"
#: Never used to choose a variant or an option; reported apart.
HELD_OUT = frozenset({"conv-41", "conv-43"})
KS = (5, 10)
BUDGETS = (250, 500, 1000)
#: Hits asked for when only the budget should bind.
BUDGET_K = 100


class Store(Protocol):
    def deliver(self, batch: Demotion) -> None: ...

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]: ...


@dataclass(frozen=True)
class Turn:
    dia_id: str
    role: str
    text: str
    speaker: str
    date: str
    #: The dataset's caption of a shared photo (BLIP's), or empty: what a captioning
    #: model would say about the image; only the captioned setups index it.
    caption: str = ""


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
            t["dia_id"],
            roles[t["speaker"]],
            t["text"],
            t["speaker"],
            doc[f"session_{s}_date_time"],
            str(t.get("blip_caption") or ""),
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


def recalled_tokens(hits: Sequence[Recalled]) -> int:
    """What recall costs the prompt: the archive's default counter over the texts."""
    return sum(math.ceil(len(h.text) / 4) for h in hits)


def replay(conv: Conversation, store: Store, window_tokens: int) -> int:
    """Feed ``conv`` through a token window, demoting into ``store``; returns window start."""
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
                    raw={"speaker": t.speaker, "date": t.date, "caption": t.caption},
                )
                for j, t in enumerate(conv.turns[delivered:start], start=delivered)
            )
            store.deliver(Demotion(conv.name, batch))
            delivered = start
    return start


def measures(ks: Sequence[int] = KS, budgets: Sequence[int] = BUDGETS) -> list[str]:
    return ["window", *(f"k={k}" for k in ks), *(f"{b} tok" for b in budgets)]


def evaluate(
    store_factory: Callable[[], Store],
    window_tokens: int = 2000,
    ks: Sequence[int] = KS,
    budgets: Sequence[int] = BUDGETS,
    directory: Path | None = None,
) -> dict[str, Any]:
    """Evidence retained per conversation, for the window alone and with recall.

    Args:
        store_factory: Makes one empty store; every conversation is delivered to it under
            its own conversation id.
        window_tokens: Token budget of the active window.
        ks: Top-k depths to measure.
        budgets: Recalled-token budgets to measure (``search(..., budget_tokens=b)``).
        directory: Where the ``conv-*.json`` files are (default: :func:`data_dir`).

    Returns:
        ``{"seconds": s, "conversations": {name: {"skipped", "questions": {category: n},
        "hits": {measure: {category: n}}, "tokens": {measure: total}}}}``; measures are
        ``"window"``, ``"k=5"``, ..., ``"250 tok"``, ...
    """
    began = time.perf_counter()
    store = store_factory()
    per: dict[str, Any] = {}
    searches: list[tuple[str, int, int | None]] = [
        *((f"k={k}", k, None) for k in ks),
        *((f"{b} tok", BUDGET_K, b) for b in budgets),
    ]
    try:
        for conv in conversations(directory):
            start = replay(conv, store, window_tokens)
            window = {t.dia_id for t in conv.turns[start:]}
            names = measures(ks, budgets)
            hits = {m: dict.fromkeys(CATEGORIES.values(), 0) for m in names}
            spent = dict.fromkeys(names, 0)
            asked = dict.fromkeys(CATEGORIES.values(), 0)
            for question, number, evidence in conv.questions:
                category = CATEGORIES[number]
                asked[category] += 1
                missing = evidence - window
                hits["window"][category] += not missing
                for name, k, budget in searches:
                    found = store.search(conv.name, question, k, budget_tokens=budget)
                    spent[name] += recalled_tokens(found)
                    ids = {conv.turns[r.index].dia_id for r in found if r.index >= 0}
                    hits[name][category] += not (missing - ids)
            per[conv.name] = {
                "skipped": conv.skipped,
                "questions": asked,
                "hits": hits,
                "tokens": spent,
            }
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return {"seconds": time.perf_counter() - began, "conversations": per}


def rates(result: dict[str, Any], names: Sequence[str] | None = None) -> dict[str, Any]:
    """Rates over some conversations (default: all): ``{measure: {category: rate}}``.

    Each measure also has ``"overall"`` and ``"tokens"`` (mean recalled tokens per
    question), and the result ``"questions"``.
    """
    convs = [c for n, c in result["conversations"].items() if names is None or n in names]
    asked = {c: sum(v["questions"][c] for v in convs) for c in CATEGORIES.values()}
    total = sum(asked.values())
    out: dict[str, Any] = {"questions": total}
    for measure in convs[0]["hits"] if convs else []:
        found = {c: sum(v["hits"][measure][c] for v in convs) for c in CATEGORIES.values()}
        row = {c: found[c] / asked[c] for c in CATEGORIES.values() if asked[c]}
        row["overall"] = sum(found.values()) / total if total else 0.0
        row["tokens"] = sum(v["tokens"][measure] for v in convs) / total if total else 0.0
        out[measure] = row
    return out


def speaker_and_date(message: DemotedMessage) -> str | None:
    """Context for the archive: who said it and when (from the replay's ``raw``)."""
    raw = message.raw
    return f"{raw['speaker']} {raw['date']}" if isinstance(raw, dict) else None


def speaker_context(message: DemotedMessage) -> dict[str, str] | None:
    """The same as a mapping: the speaker also prefixes the embedded text."""
    raw = message.raw
    return {"speaker": raw["speaker"], "date": raw["date"]} if isinstance(raw, dict) else None
