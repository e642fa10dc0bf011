"""What the two halves of ``demote demo`` share: the options, the script, the counting hook.

The halves (``langchain_demote.demo`` and ``llamaindex_demote.demo``) import this module
and nothing else of the demo. Each registers itself under the ``demote.demo`` entry point
group (in ``pyproject.toml``) and provides a :class:`DemoHalf`; :mod:`demote.cli.demo`
loads what is registered there and never names an adapter, so the imports run one way:
``demo -> demo_parts <- {langchain,llamaindex}_demote.demo``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from demote.archive.sqlite import SQLiteArchive
from demote.cli.cachecost import CacheMeter
from demote.records import Demotion, fingerprint
from demote.request import RECALL_PREFIX
from demote.window.tokens import TokenCache

if TYPE_CHECKING:
    from demote.engine import Demoter

__all__ = [
    "LANGCHAIN_ID",
    "LLAMAINDEX_ID",
    "RECALL_HEADER",
    "CallLog",
    "CountingHook",
    "DemoHalf",
    "DemoOptions",
    "PartResult",
    "Probe",
    "Script",
    "finish",
    "progress_bar",
]

#: The conversation id of the LangChain half.
LANGCHAIN_ID = "demo-langchain"
#: The conversation id of the LlamaIndex half.
LLAMAINDEX_ID = "demo-llamaindex"
#: How recalled messages are introduced to the model (LangChain and LlamaIndex alike): the
#: adapters' own lead (:data:`demote.request.RECALL_PREFIX`), without its line break.
RECALL_HEADER = RECALL_PREFIX.rstrip("\n")


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


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``demote demo`` was asked to do (see ``demote demo --help``)."""

    directory: Path = Path("demote-demo")
    locomo: Path | None = None
    sample: str | None = None
    strategy: str = "bulk"
    policy: str | None = None
    model: str | None = None
    turns: int | None = None
    progress: bool = True
    restart: bool = False


class CountingHook:
    """Delivers to an archive, counting per conversation what it already held.

    The demo's ``re-delivered`` row is the sum of these counts: a message the archive
    already had when it was delivered again.

    Args:
        archive: The long tail.
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
        """The recalled lines of the last prompt (its recall message)."""
        for _, text in self.last:
            if text.startswith(RECALL_HEADER):
                return [line[2:] for line in text.splitlines()[1:] if line.startswith("- ")]
        return []


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


class DemoHalf(Protocol):
    """One framework's half of the demo: a module registered in the ``demote.demo`` group."""

    def preflight(self, options: DemoOptions) -> None:
        """Check what this half needs (its framework, the model) before anything is made."""

    def play(
        self,
        demoter: Demoter,
        hook: CountingHook,
        turns: Sequence[tuple[str, str]],
        probe: Probe,
        options: DemoOptions,
        err: IO[str],
    ) -> PartResult:
        """Play ``turns`` and then ``probe`` through the framework; what it did."""
        ...


def finish(part: PartResult, hook: CountingHook, cid: str, started: float) -> PartResult:
    """Fill in what a played half delivered, archived and took; return ``part``."""
    part.demoted = hook.delivered.get(cid, 0)
    part.redelivered = hook.redelivered.get(cid, 0)
    part.archived = hook.archive.count(cid)
    part.seconds = time.perf_counter() - started
    return part


class _NoBar:
    """Stands in for a tqdm bar when tqdm is not installed or the bar is off."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        """Do nothing."""


def progress_bar(enabled: bool, err: IO[str], total: int, desc: str, unit: str = "turn") -> Any:
    """A tqdm bar on ``err``, or a silent stand-in when off, not a TTY, or without tqdm.

    Args:
        enabled: The user did not ask for ``--no-progress``.
        err: Where the bar is drawn (standard error).
        total: Steps in all.
        desc: The bar's label.
        unit: What a step is.
    """
    if not (enabled and err.isatty()):
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, file=err, unit=unit, leave=False)
