"""``demote demo``: a long chat replayed through LangChain and LlamaIndex, offline.

The demo plays a long conversation (the built-in one, or a LoCoMo file) turn by turn:

1. through a real LangChain ``RunnableWithMessageHistory`` chain whose history factory is
   wrapped with :func:`langchain_demote.with_demotion` (inner history: a JSONL file);
2. through a LlamaIndex ``SimpleChatEngine`` with a
   :class:`llamaindex_demote.DemotingMemory` (chat store: a JSONL file).

Both share one :class:`~demote.Demoter` with a :class:`~demote.SQLiteStateStore` and an
:class:`~demote.SQLiteArchive` in the demo folder, recall from the archive, and end by
asking about a fact from the start of the chat. The model is
:class:`~demote.cli.offline.OfflineResponder` unless ``--model`` names a real one
(LangChain half only).

Before it creates anything, a run checks what it needs: the policy, the conversation
file, both framework extras and the model. ``progress.json`` in the folder records where
the script stands; it is written when a run starts and again when it ends. The next run
continues the stored conversation (the next turns of the script, wrapping around, the same
conversation ids, the same stores). A run that stopped half-way (a crash, Ctrl-C) is
*resumed*: its stores are kept and the script restarts where that run began; nothing is
delivered twice, because the stores are consistent whatever happened. ``--restart``
removes the demo's own files and starts again at run 1.

Delivery goes through :class:`~demote.cli.demo_parts.CountingHook`, which asks the archive
which keys it already holds before each delivery; the table's ``re-delivered`` row counts
them (0 unless the state was lost).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import IO, Any

from demote.archive.sqlite import SQLiteArchive
from demote.cli.demo_parts import (
    LANGCHAIN_ID,
    LLAMAINDEX_ID,
    CountingHook,
    DemoHalf,
    DemoOptions,
    PartResult,
    Probe,
    Script,
)
from demote.cli.demo_table import print_table
from demote.cli.offline import content_terms
from demote.cli.replay import describe_policy
from demote.cli.transcript import LOCOMO_HINT, Transcript, builtin_transcript, load_transcript
from demote.engine.demoter import Demoter
from demote.errors import ConfigError, StoreError
from demote.state.sqlite import SQLiteStateStore
from demote.summarize import TemplateSummarizer
from demote.window.policy import Bulk, Compact, PerItem, SlidingWindow

__all__ = [
    "STRATEGIES",
    "builtin_script",
    "demo_policy",
    "locomo_script",
    "run_demo",
]

STRATEGIES = ("per_item", "bulk", "compact")
_LIMIT, _OVERFLOW = 1200, 400
_FRAMEWORKS = ("langchain", "llamaindex")
#: Where the framework halves register (entry points, see ``pyproject.toml``).
HALVES_GROUP = "demote.demo"
_IDS = frozenset((LANGCHAIN_ID, LLAMAINDEX_ID))
_STORES = ("state.db", "archive.db")
_FILES = (*_STORES, "langchain-history.jsonl", "llamaindex-chats.jsonl")
_PROGRESS = "progress.json"


def _turns(messages: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """User/assistant pairs; runs of one role are joined, a leading reply is dropped."""
    out: list[list[str]] = []
    for role, text in messages:
        if role == "user":
            if out and not out[-1][1]:
                out[-1][0] += "\n" + text
            else:
                out.append([text, ""])
        elif role == "assistant" and out:
            out[-1][1] = f"{out[-1][1]}\n{text}" if out[-1][1] else text
    return tuple((user, reply or "I see.") for user, reply in out)


def builtin_script() -> Script:
    """The built-in conversation (:func:`~demote.cli.transcript.builtin_transcript`)."""
    t = builtin_transcript()
    probes = tuple(Probe(q.text, q.answer or "") for q in t.questions)
    return Script(f"built-in conversation {t.name!r}", _turns(t.messages), probes)


def _locomo_probes(t: Transcript, n: int = 4) -> tuple[Probe, ...]:
    """Questions whose evidence is early and holds the answer in words recall can find."""
    early = max(1, len(t.messages) // 4)
    found: list[tuple[int, Probe]] = []
    for q in t.questions:
        if q.category == 5 or not q.evidence or not q.answer or len(q.answer) > 40:
            continue
        if max(q.evidence) >= early:
            continue
        evidence = " ".join(t.messages[i][1] for i in q.evidence)
        shared = content_terms(q.text) & content_terms(evidence)
        if q.answer.lower() in evidence.lower() and len(shared) >= 2:
            found.append((min(q.evidence), Probe(q.text, q.answer)))
    found.sort(key=lambda item: item[0])
    return tuple(p for _, p in found[:n])


def locomo_script(path: str | Path, sample: str | None = None) -> Script:
    """A LoCoMo conversation file as a script (speaker names kept in the text).

    Args:
        path: A ``conv-N.json`` file or the published ``locomo10.json``.
        sample: Which conversation of a file that holds several (default the first).

    Raises:
        ConfigError: The file does not exist (the message says where to get it).
        TranscriptError: The file is not a LoCoMo conversation.
    """
    if not Path(path).is_file():
        raise ConfigError(f"--locomo {path}: no such file. {LOCOMO_HINT}")
    t = load_transcript(path, format="locomo", with_speaker=True, sample=sample)
    probes = _locomo_probes(t)
    if not probes:
        raise ConfigError(f"{path}: no question with early evidence to ask at the end")
    return Script(f"LoCoMo {t.name}", _turns(t.messages), probes)


def demo_policy(strategy: str = "bulk", policy_json: str | None = None) -> SlidingWindow:
    """The demo's policy: ``policy_json`` if given, else a token window with ``strategy``.

    Raises:
        ConfigError: Unknown strategy or invalid policy JSON.
    """
    if policy_json is not None:
        return SlidingWindow.from_json(policy_json)
    if strategy == "per_item":
        return SlidingWindow.last_tokens(_LIMIT, eviction=PerItem())
    if strategy == "bulk":
        return SlidingWindow.last_tokens(_LIMIT, eviction=Bulk(overflow=_OVERFLOW))
    if strategy == "compact":
        return SlidingWindow.last_tokens(_LIMIT, eviction=Compact(compact_count=_OVERFLOW))
    raise ConfigError(f"strategy: must be one of {', '.join(STRATEGIES)}, got {strategy!r}")


def _halves(options: DemoOptions) -> list[DemoHalf]:
    """Load both framework halves and let each check its needs (nothing is created).

    The halves are found by entry point (group :data:`HALVES_GROUP`), not by module name:
    they import :mod:`demote.cli.demo_parts`, and the core names no adapter.
    """
    found = {point.name: point for point in entry_points(group=HALVES_GROUP)}
    missing = [name for name in _FRAMEWORKS if name not in found]
    if missing:
        raise ConfigError(
            f"demote demo: no {' or '.join(missing)} half is registered in the "
            f"{HALVES_GROUP!r} entry points (reinstall demote)"
        )
    halves: list[DemoHalf] = [found[name].load() for name in _FRAMEWORKS]
    for half in halves:
        half.preflight(options)
    return halves


@dataclass
class _Folder:
    """Where the demo folder stands: runs finished, the next turn, the run to play now."""

    path: Path
    source: str
    runs: int = 0
    next_turn: int = 0

    def save(self, unfinished: bool) -> None:
        doc: dict[str, Any] = {"source": self.source, "runs": self.runs}
        doc["next_turn"] = self.next_turn
        if unfinished:
            doc["unfinished"] = True
        try:
            (self.path / _PROGRESS).write_text(json.dumps(doc) + "\n", "utf-8")
        except OSError as exc:
            raise StoreError(f"cannot write {self.path / _PROGRESS}: {exc}") from exc


def _demo_files(directory: Path) -> list[Path]:
    """The demo's own files in ``directory`` (SQLite side files included)."""
    names = [*_FILES, *(f"{s}{x}" for s in _STORES for x in ("-wal", "-shm", "-journal"))]
    return [directory / n for n in (*names, _PROGRESS) if (directory / n).exists()]


def _foreign_conversations(directory: Path) -> set[str]:
    """Conversations in the folder's stores that no demo run wrote."""
    found: set[str] = set()
    if (directory / "state.db").exists():
        with SQLiteStateStore(directory / "state.db") as state:
            found |= set(state.conversations())
    if (directory / "archive.db").exists():
        with SQLiteArchive(directory / "archive.db") as archive:
            found |= set(archive.conversations())
    return found - _IDS


def _read_progress(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read {path}: {exc}; run with --restart to start over") from exc
    if not isinstance(doc, dict):
        raise StoreError(f"cannot read {path}: not a JSON object; run with --restart")
    return doc


def _open_folder(options: DemoOptions, script: Script, err: IO[str]) -> _Folder:
    """Read (or start) the demo folder; say on ``err`` if it resumes or starts over."""
    directory = options.directory
    folder = _Folder(directory, script.name)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"--dir {directory}: not a folder")
    files = _demo_files(directory) if directory.is_dir() else []
    if not files:
        directory.mkdir(parents=True, exist_ok=True)
        return folder
    progress = directory / _PROGRESS
    doc = _read_progress(progress) if progress.exists() else None
    if doc is None:
        foreign = _foreign_conversations(directory)
        if foreign:
            raise ConfigError(
                f"{directory} holds stores that are not a demo's (conversations "
                f"{', '.join(sorted(foreign)[:3])}); use another --dir"
            )
    if options.restart:
        for path in files:
            path.unlink()
        err.write(f"demote demo: starting over in {directory}/ (--restart removed its files)\n")
        return folder
    if doc is None:
        err.write(
            f"demote demo: resuming the unfinished demo in {directory}/ (its stores are "
            "kept; it has no progress.json, so the script starts at turn 1)\n"
        )
        return folder
    if doc.get("source") != script.name:
        raise ConfigError(
            f"{directory} holds a demo of the {doc.get('source')}; run with --restart to "
            "start over, or use another --dir to play a different conversation"
        )
    folder.runs, folder.next_turn = int(doc.get("runs", 0)), int(doc.get("next_turn", 0))
    if doc.get("unfinished"):
        err.write(
            f"demote demo: resuming run {folder.runs + 1} in {directory}/, which stopped "
            "before it finished (its stores are kept; nothing is delivered twice)\n"
        )
    return folder


def run_demo(options: DemoOptions, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> None:
    """Run the demo and print its table to ``out`` (notes and progress bars go to ``err``).

    Everything the run needs is checked before the demo folder is touched, so a missing
    extra or a bad ``--model`` leaves nothing behind.

    Raises:
        ConfigError: Bad options (policy, strategy, conversation file, demo folder, model).
        MissingExtraError: LangChain or LlamaIndex is not installed.
        StoreError: The demo folder's files cannot be read or written.
    """
    policy = demo_policy(options.strategy, options.policy)
    if options.turns is not None and options.turns < 1:
        raise ConfigError(f"--turns: must be >= 1, got {options.turns}")
    if options.locomo is None:
        script = builtin_script()
    else:
        script = locomo_script(options.locomo, options.sample)
    halves = _halves(options)
    folder = _open_folder(options, script, err)
    n = options.turns or len(script.turns)
    first = folder.next_turn % len(script.turns)
    turns = [script.turns[(first + i) % len(script.turns)] for i in range(n)]
    probe = script.probes[folder.runs % len(script.probes)]
    folder.save(unfinished=True)
    compact = isinstance(policy.eviction, Compact)
    summarizer = TemplateSummarizer(max_summary_tokens=300) if compact else None
    directory = options.directory
    with (
        SQLiteStateStore(directory / "state.db") as state,
        SQLiteArchive(directory / "archive.db") as archive,
    ):
        hook = CountingHook(archive)
        demoter = Demoter(policy, hook, state=state, summarizer=summarizer)
        started = time.perf_counter()
        parts: list[PartResult] = [
            half.play(demoter, hook, turns, probe, options, err) for half in halves
        ]
    folder.runs += 1
    folder.next_turn = (first + n) % len(script.turns)
    folder.save(unfinished=False)
    print_table(
        out,
        script=script,
        run=folder.runs,
        policy=policy,
        label=describe_policy(policy),
        options=options,
        probe=probe,
        parts=parts,
        seconds=time.perf_counter() - started,
    )
