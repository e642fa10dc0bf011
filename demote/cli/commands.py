"""What ``demote replay``, ``demote inspect`` and ``demote search`` do.

:mod:`demote.cli` parses arguments and calls one function here per subcommand; each
writes plain text to ``out`` and raises a :class:`~demote.errors.DemoteError` for any
user error, which the CLI prints as one line. Nothing here imports a framework.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from demote.errors import ConfigError, MissingExtraError, TranscriptError
from demote.hooks.archive import SQLiteArchive
from demote.policy import Bulk, Compact, PerItem, SlidingWindow
from demote.records import MessageRecord
from demote.replay import ReplayResult, describe_policy, plot_windows, replay
from demote.state.sqlite import SQLiteStateStore
from demote.transcript import Format, Transcript, load_transcript

__all__ = [
    "DEFAULT_POLICIES",
    "RecallScore",
    "inspect_stores",
    "parse_policies",
    "recall_score",
    "replay_transcript",
    "search_archive",
]

#: Policies compared when ``demote replay`` is given none.
DEFAULT_POLICIES: tuple[SlidingWindow, ...] = (
    SlidingWindow.last_tokens(2000, eviction=PerItem()),
    SlidingWindow.last_tokens(2000, eviction=Bulk(overflow=1000)),
    SlidingWindow.last_tokens(2000, eviction=Compact(compact_count=1000)),
    SlidingWindow.last_turns(20, eviction=PerItem()),
)
_CONVERSATION = "replay"  # the conversation id demote.replay.replay uses


def parse_policies(texts: Sequence[str]) -> list[SlidingWindow]:
    """Policies from ``--policy`` JSON texts (the defaults if there are none).

    Raises:
        ConfigError: A text is not a valid policy; the message says which one.
    """
    out = []
    for n, text in enumerate(texts, 1):
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--policy #{n}: not valid JSON ({exc}): {text!r}") from None
        try:
            out.append(SlidingWindow.from_json(text))
        except ConfigError as exc:
            raise ConfigError(f"--policy #{n}: {exc}") from None
    return out or list(DEFAULT_POLICIES)


def _existing(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {p}: no such file")
    return p


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError("matplotlib", "plot") from exc


@dataclass(frozen=True, slots=True)
class RecallScore:
    """How many questions still had all their evidence reachable at the end."""

    questions: int
    in_window: int
    reachable: int

    @property
    def rate(self) -> float:
        """Share of questions whose evidence is in the window or recalled."""
        return self.reachable / self.questions if self.questions else 0.0


def recall_score(
    transcript: Transcript, archive: SQLiteArchive, window_start: int, k: int = 5
) -> RecallScore:
    """Score the evidence of ``transcript``'s questions after a replay.

    A question counts when every evidence message is in the final window (index at or
    after ``window_start``) or among the top ``k`` messages the archive recalls for it.
    Adversarial questions (LoCoMo category 5) and questions without evidence are skipped.
    """
    asked = window = reachable = 0
    for q in transcript.questions:
        if q.category == 5 or not q.evidence:
            continue
        asked += 1
        missing = {i for i in q.evidence if i < window_start}
        window += not missing
        if missing:
            missing -= {r.index for r in archive.search(_CONVERSATION, q.text, k)}
        reachable += not missing
    return RecallScore(asked, window, reachable)


def replay_transcript(
    path: str | os.PathLike[str],
    policies: Sequence[SlidingWindow],
    out: IO[str],
    *,
    format: Format = "auto",
    plot: str | os.PathLike[str] | None = None,
    k: int = 5,
    system_prompt_tokens: int = 200,
) -> list[ReplayResult]:
    """Replay a transcript file under each policy and print one row per policy.

    Raises:
        TranscriptError: The transcript cannot be read (the message names the line).
        ConfigError: Missing file or bad option.
        MissingExtraError: ``plot`` was given but matplotlib is not installed.
    """
    if k < 1:
        raise ConfigError(f"-k: must be >= 1, got {k}")
    source = _existing(path, "transcript")
    try:
        transcript = load_transcript(source, format=format)
    except TranscriptError as exc:
        raise TranscriptError(f"{source}: {exc}") from None
    if not transcript.messages:
        raise ConfigError(f"transcript {path}: no messages")
    if plot is not None:
        _require_matplotlib()  # fail before the work, not after it
    questions = sum(1 for q in transcript.questions if q.category != 5 and q.evidence)
    out.write(
        f"transcript: {transcript.name} ({transcript.source_format}, "
        f"{len(transcript):,} messages"
        + (f", {questions} questions with evidence" if questions else "")
        + f"); prompt = {system_prompt_tokens}-token system prompt + window\n\n"
    )
    header = ["policy", "window msgs", "window tokens", "demoted", "cuts", "guaranteed"]
    header += ["anthropic", "openai"] + ([f"recall@{k}"] if questions else [])
    rows = [header]
    results = []
    for policy in policies:
        starts = [0]

        def on_call(
            index: int, window: Sequence[MessageRecord], starts: list[int] = starts
        ) -> None:
            starts[0] = index + 1 - len(window)

        with SQLiteArchive(":memory:") as archive:
            result = replay(
                transcript,
                policy,
                hook=archive if questions else None,
                system_prompt_tokens=system_prompt_tokens,
                on_call=on_call,
            )
            score = recall_score(transcript, archive, starts[0], k) if questions else None
        results.append(result)
        g = result.guaranteed_tokens
        row = [
            describe_policy(policy),
            "{}-{}".format(*result.window_messages),
            "{:,}-{:,}".format(*result.window_tokens),
            f"{result.demoted:,}",
            str(result.demotions),
            "-" if g is None else f"{g:,} tok",
            f"{result.cost('anthropic').relative_cost:.2f}x",
            f"{result.cost('openai').relative_cost:.2f}x",
        ]
        if score is not None:
            row.append(f"{score.rate:.0%} ({score.reachable}/{score.questions})")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        out.write("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n")
    out.write(
        "\nwindow: smallest-largest over the model calls (one per user message); guaranteed: "
        "the smallest window once the chat outgrew it;\nanthropic/openai: prompt cost "
        "relative to no prompt caching (lower is better)"
        + (
            f"; recall@{k}: questions whose evidence is in the window or recalled"
            if questions
            else ""
        )
        + "\n"
    )
    if plot is not None:
        plot_windows(results, plot, title=f"Active window over {transcript.name}")
        out.write(f"plot written to {plot}\n")
    return results


def inspect_stores(
    out: IO[str],
    *,
    state: str | os.PathLike[str] | None = None,
    archive: str | os.PathLike[str] | None = None,
    outbox: str | os.PathLike[str] | None = None,
    conversation: str | None = None,
) -> None:
    """Print each conversation's demotion state, archive size and dead letters.

    Raises:
        ConfigError: No store given, or a given file does not exist.
    """
    if state is None and archive is None and outbox is None:
        raise ConfigError("give at least one of --state, --archive, --outbox")
    st = SQLiteStateStore(_existing(state, "state store")) if state is not None else None
    ar = SQLiteArchive(_existing(archive, "archive")) if archive is not None else None
    try:
        ids = set(st.conversations() if st else []) | set(ar.conversations() if ar else [])
        if conversation is not None:
            ids = {conversation}
        header = ["conversation", "window start", "watermark", "pinned", "archived", "summary"]
        rows = [header]
        for cid in sorted(ids):
            s = st.get(cid) if st else None
            rows.append(
                [
                    cid,
                    "-" if s is None else str(s.window_start),
                    "-" if s is None else str(s.delivered),
                    "-" if s is None else str(s.pinned),
                    "-" if ar is None else str(ar.count(cid)),
                    "-" if s is None or s.summary is None else f"{len(s.summary)} chars",
                ]
            )
        if len(rows) == 1:
            out.write("no conversations\n")
        else:
            widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
            for r in rows:
                out.write("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n")
        if conversation is not None and st is not None:
            s = st.get(conversation)
            if s is not None and s.summary:
                out.write(f"\nsummary of {conversation!r}:\n{s.summary}\n")
    finally:
        if st:
            st.close()
        if ar:
            ar.close()
    if outbox is not None:
        from demote.capture.outbox import SQLiteOutbox

        with SQLiteOutbox(_existing(outbox, "outbox")) as box:
            dead = box.dead_letters()
            out.write(f"\noutbox {outbox}: {box.pending()} pending, {len(dead)} dead letters\n")
            for d in dead:
                out.write(f"  {d.key}  attempts={d.attempts}  {d.error or ''}\n")


def search_archive(
    out: IO[str], archive: str | os.PathLike[str], conversation: str, query: str, k: int = 5
) -> None:
    """Print what recall returns from an archive for ``query`` (best first).

    Raises:
        ConfigError: The archive file does not exist, or ``k < 1``.
    """
    if k < 1:
        raise ConfigError(f"-k: must be >= 1, got {k}")
    with SQLiteArchive(_existing(archive, "archive")) as ar:
        hits = ar.search(conversation, query, k)
        total = ar.count(conversation)
    if not hits:
        out.write(f"no match in {total} archived messages of {conversation!r}\n")
        return
    for rank, hit in enumerate(hits, 1):
        text = " ".join(hit.text.split())
        out.write(f"{rank}. [{hit.score:6.2f}] #{hit.index} {hit.role}: {text}\n")
