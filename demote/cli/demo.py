"""``demote demo``: a long chat replayed through LangChain and LlamaIndex, offline.

The demo plays a long conversation (the built-in one, or a LoCoMo file) turn by turn:

1. through a real LangChain ``RunnableWithMessageHistory`` chain whose history factory is
   wrapped with :func:`langchain_demote.with_demotion` (inner history: a JSONL file);
2. through a LlamaIndex ``SimpleChatEngine`` with a
   :class:`llamaindex_demote.DemotingMemory` (chat store: a JSONL file).

Both share one :class:`~demote.Demoter` with a :class:`~demote.SQLiteStateStore` and an
:class:`~demote.hooks.archive.SQLiteArchive` in the demo folder, recall from the archive,
and end by asking about a fact from the start of the chat. The model is
:mod:`demote.offline`'s stand-in unless ``--model`` names a real one (LangChain part only).

Every run continues the stored conversation: the next turns of the script (wrapping
around), the same conversation ids, the same stores. Delivery goes through
:class:`CountingHook`, which asks the archive which keys it already holds before each
delivery; the table's ``re-delivered`` row counts them (0 unless the state was lost).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from demote.cachecost import CacheMeter
from demote.engine import Demoter
from demote.errors import ConfigError, StoreError
from demote.hooks.archive import SQLiteArchive
from demote.offline import content_terms
from demote.policy import Bulk, Compact, PerItem, SlidingWindow
from demote.records import Demotion, fingerprint
from demote.replay import describe_policy
from demote.state.sqlite import SQLiteStateStore
from demote.summarize import TemplateSummarizer
from demote.tokens import TokenCache
from demote.transcript import Transcript, load_transcript

__all__ = [
    "CallLog",
    "CountingHook",
    "DemoOptions",
    "Probe",
    "Script",
    "builtin_script",
    "demo_policy",
    "locomo_script",
    "run_demo",
]

#: The package data folder (the built-in conversation).
DATA = Path(__file__).with_name("data")
#: How recalled messages are introduced to the model (LangChain and LlamaIndex alike).
RECALL_HEADER = "Relevant messages from earlier in this conversation:"
STRATEGIES = ("per_item", "bulk", "compact")
_LIMIT, _OVERFLOW = 1200, 400
_FILES = ("state.db", "archive.db", "langchain-history.jsonl", "llamaindex-chats.jsonl")


@dataclass(frozen=True, slots=True)
class Probe:
    """A question about an early fact, asked at the end of a run, and its answer."""

    question: str
    answer: str


@dataclass(frozen=True, slots=True)
class Script:
    """A conversation to play: ``(user text, recorded reply)`` turns and probes."""

    name: str
    turns: tuple[tuple[str, str], ...]
    probes: tuple[Probe, ...]


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
    """The built-in conversation (``demote/data/conversation.json``)."""
    doc = json.loads(DATA.joinpath("conversation.json").read_text("utf-8"))
    messages = tuple((m["role"], m["content"]) for m in doc["messages"])
    probes = tuple(Probe(p["question"], p["answer"]) for p in doc["probes"])
    return Script(f"built-in conversation {doc['name']!r}", _turns(messages), probes)


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


def locomo_script(path: str | Path) -> Script:
    """A LoCoMo conversation file as a script (speaker names kept in the text).

    Raises:
        TranscriptError: The file is not a LoCoMo conversation.
    """
    t = load_transcript(path, format="locomo", with_speaker=True)
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


class CountingHook:
    """Delivers to an archive, counting per conversation what it already held.

    Args:
        archive: The long tail (anything with ``deliver`` and ``has_keys``).
    """

    def __init__(self, archive: SQLiteArchive) -> None:
        self.archive = archive
        self.delivered: dict[str, int] = {}
        self.redelivered: dict[str, int] = {}

    def deliver(self, batch: Demotion) -> None:
        """Count the batch's keys the archive already has, then deliver it."""
        cid = batch.conversation_id
        known = self.archive.has_keys(cid, [m.key for m in batch.messages])
        self.archive.deliver(batch)
        self.delivered[cid] = self.delivered.get(cid, 0) + len(batch)
        self.redelivered[cid] = self.redelivered.get(cid, 0) + len(known)

    def has_keys(self, conversation_id: str, keys: list[str]) -> set[str]:
        """The archive's answer (the engine asks after a history rewrite)."""
        return self.archive.has_keys(conversation_id, keys)


@dataclass
class CallLog:
    """What the model was sent: window sizes per call and the prompt-cache price.

    Args:
        tokens: Counts message tokens (the policy's counter).
    """

    tokens: TokenCache
    meter: CacheMeter = field(default_factory=CacheMeter)
    window_messages: list[int] = field(default_factory=list)
    window_tokens: list[int] = field(default_factory=list)
    last: list[tuple[str, str]] = field(default_factory=list)
    full_from: int | None = None

    def __call__(self, prompt: list[tuple[str, str]]) -> None:
        """Record one prompt (``(role, text)`` pairs); the last user message is the input."""
        priced = []
        for role, text in prompt:
            fp = fingerprint(role, text)
            priced.append((fp, self.tokens.count(fp, text)))
        self.meter.add(priced)
        ask = max((i for i, (role, _) in enumerate(prompt) if role == "user"), default=0)
        chat = [i for i, (role, _) in enumerate(prompt[:ask]) if role in ("user", "assistant")]
        self.window_messages.append(len(chat))
        self.window_tokens.append(sum(priced[i][1] for i in chat))
        self.last = prompt

    def mark_full(self) -> None:
        """Note that the window no longer holds the whole chat (from the next call on)."""
        if self.full_from is None:
            self.full_from = len(self.window_messages)

    def steady(self, values: list[int]) -> list[int]:
        """``values`` from the first call whose window no longer held the whole chat."""
        return values if self.full_from is None else values[self.full_from :] or values

    def recalled(self) -> list[str]:
        """The recalled lines of the last prompt (its recall system message)."""
        for role, text in self.last:
            if role == "system" and text.startswith(RECALL_HEADER):
                return [line[2:] for line in text.splitlines()[1:] if line.startswith("- ")]
        return []


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``demote demo`` was asked to do (see ``demote demo --help``)."""

    directory: Path = Path("demote-demo")
    locomo: Path | None = None
    strategy: str = "bulk"
    policy: str | None = None
    model: str | None = None
    turns: int | None = None
    progress: bool = True


@dataclass
class PartResult:
    """One framework's run, for the table."""

    name: str
    turns: int = 0
    history: int = 0
    log: CallLog | None = None
    demoted: int = 0
    archived: int = 0
    redelivered: int = 0
    seconds: float = 0.0
    answer: str = ""
    recalled: list[str] = field(default_factory=list)


class _NoBar:
    """Stands in for a tqdm bar when tqdm is not installed."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        """Do nothing."""


def _progress(options: DemoOptions, err: IO[str], total: int, desc: str) -> Any:
    """A tqdm bar on ``err`` (off when not a TTY, with ``--no-progress`` or without tqdm)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    enabled = options.progress and err.isatty()
    return tqdm(total=total, desc=desc, file=err, disable=not enabled, unit="turn", leave=False)


def _state(directory: Path, script: Script) -> dict[str, Any]:
    path = directory / "progress.json"
    if not path.exists():
        if any((directory / f).exists() for f in _FILES):
            raise ConfigError(f"{directory} holds stores but no progress.json; use another --dir")
        return {"source": script.name, "runs": 0, "next_turn": 0}
    try:
        state: dict[str, Any] = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    if state.get("source") != script.name:
        raise ConfigError(
            f"{directory} holds a demo of the {state.get('source')}; "
            "use another --dir (or delete it) to play a different conversation"
        )
    return state


def run_demo(options: DemoOptions, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> None:
    """Run the demo and print its table to ``out`` (progress bars go to ``err``).

    Raises:
        ConfigError: Bad options (policy, strategy, conversation file, demo folder).
        MissingExtraError: LangChain or LlamaIndex is not installed.
    """
    from demote.demo_run import play, print_table

    policy = demo_policy(options.strategy, options.policy)
    script = builtin_script() if options.locomo is None else locomo_script(options.locomo)
    if options.turns is not None and options.turns < 1:
        raise ConfigError(f"--turns: must be >= 1, got {options.turns}")
    directory = options.directory
    directory.mkdir(parents=True, exist_ok=True)
    progress = _state(directory, script)
    n = options.turns or len(script.turns)
    first = int(progress["next_turn"]) % len(script.turns)
    turns = [script.turns[(first + i) % len(script.turns)] for i in range(n)]
    probe = script.probes[int(progress["runs"]) % len(script.probes)]
    summarizer = TemplateSummarizer(max_summary_tokens=300)
    with (
        SQLiteStateStore(directory / "state.db") as state,
        SQLiteArchive(directory / "archive.db") as archive,
    ):
        hook = CountingHook(archive)
        compact = isinstance(policy.eviction, Compact)
        demoter = Demoter(policy, hook, state=state, summarizer=summarizer if compact else None)
        started = time.perf_counter()
        parts = [
            play("langchain", demoter, hook, turns, probe, options, err),
            play("llamaindex", demoter, hook, turns, probe, options, err),
        ]
        progress.update(runs=int(progress["runs"]) + 1, next_turn=(first + n) % len(script.turns))
        (directory / "progress.json").write_text(json.dumps(progress) + "\n", "utf-8")
        print_table(
            out,
            script=script,
            run=int(progress["runs"]),
            policy=policy,
            label=describe_policy(policy),
            options=options,
            probe=probe,
            parts=parts,
            seconds=time.perf_counter() - started,
        )
