"""What ``demote replay``, ``demote inspect`` and ``demote search`` do.

:mod:`demote.cli.app` parses arguments and calls one function here per subcommand; each
writes plain text to ``out`` (progress to ``err``) and raises a
:class:`~demote.errors.DemoteError` for any user error, which the command line prints as
one line. Every option is checked before the work starts. Nothing here imports a
framework.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from demote.archive.sqlite import SQLiteArchive
from demote.cli._table import table
from demote.cli.demo_parts import progress_bar
from demote.cli.replay import ReplayResult, describe_policy, plot_windows, replay
from demote.cli.stores import OpenedStore, open_store
from demote.cli.transcript import Format, Transcript, load_transcript
from demote.errors import ConfigError, MissingExtraError, TranscriptError
from demote.records import MessageRecord
from demote.summarize import TemplateSummarizer
from demote.window.policy import Bulk, Compact, PerItem, SlidingWindow

if TYPE_CHECKING:
    from demote.archive.postgres import PostgresArchive

__all__ = [
    "DEFAULT_POLICIES",
    "RecallScore",
    "inspect_stores",
    "open_archive",
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
_CONVERSATION = "replay"  # the conversation id demote.cli.replay.replay uses
#: What ``--summarizer`` accepts.
SummarizerName = Literal["none", "template"]


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


def _check_plot(plot: str | os.PathLike[str]) -> None:
    """Fail before a replay if its plot could not be written: no matplotlib, bad file."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtraError("matplotlib", "plot") from exc
    path = Path(plot)
    kinds = sorted(Figure().canvas.get_supported_filetypes())
    if path.suffix.lower().lstrip(".") not in kinds:
        raise ConfigError(
            f"--plot {path}: cannot write a {path.suffix or 'suffix-less'} file; "
            f"name it .png, .svg or .pdf (or {', '.join('.' + k for k in kinds)})"
        )
    if not path.resolve().parent.is_dir():
        raise ConfigError(f"--plot {path}: no such folder {path.parent}")


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


def _label(policy: SlidingWindow, summarizer: SummarizerName) -> str:
    label = describe_policy(policy)
    if isinstance(policy.eviction, Compact):
        label += ", no summarizer" if summarizer == "none" else ", template summary"
    return label


def replay_transcript(
    path: str | os.PathLike[str],
    policies: Sequence[SlidingWindow],
    out: IO[str],
    *,
    format: Format = "auto",
    sample: str | None = None,
    plot: str | os.PathLike[str] | None = None,
    k: int = 5,
    system_prompt_tokens: int = 200,
    summarizer: SummarizerName = "none",
    err: IO[str] = sys.stderr,
    progress: bool = True,
) -> list[ReplayResult]:
    """Replay a transcript file under each policy and print one row per policy.

    Args:
        path: The transcript file.
        policies: The policies to compare, one row each.
        out: Where the table goes.
        format: The transcript format (``"auto"`` guesses).
        sample: For a file of several LoCoMo conversations: which one.
        plot: Also plot window sizes over the replay into this image file.
        k: Recall depth for the evidence hit rate.
        system_prompt_tokens: Size of the system prompt priced with every call.
        summarizer: For ``Compact`` policies: ``"none"`` (the engine cuts back in bulk,
            and the replay prices a stand-in summary; the row says so) or ``"template"``
            (:class:`~demote.TemplateSummarizer`, a real summary with no model).
        err: Where progress goes (one line per policy, or a bar on a terminal).
        progress: Show progress at all.

    Raises:
        TranscriptError: The transcript cannot be read (the message names the line).
        ConfigError: Missing file or bad option (checked before any replay starts).
        MissingExtraError: ``plot`` was given but matplotlib is not installed.
    """
    if k < 1:
        raise ConfigError(f"-k: must be >= 1, got {k}")
    if summarizer not in ("none", "template"):
        raise ConfigError(f"--summarizer: must be none or template, got {summarizer!r}")
    if plot is not None:
        _check_plot(plot)  # fail before the work, not after it
    source = _existing(path, "transcript")
    try:
        transcript = load_transcript(source, format=format, sample=sample)
    except TranscriptError as exc:
        raise TranscriptError(f"{source}: {exc}") from None
    if not transcript.messages:
        raise ConfigError(f"transcript {path}: no messages")
    questions = sum(1 for q in transcript.questions if q.category != 5 and q.evidence)
    calls = sum(1 for role, _ in transcript.messages if role == "user")
    out.write(
        f"transcript: {transcript.name} ({transcript.source_format}, "
        f"{len(transcript):,} messages"
        + (f", {questions} questions with evidence" if questions else "")
        + f"); prompt = {system_prompt_tokens}-token system prompt + window\n\n"
    )
    out.flush()
    header = ["policy", "window msgs", "window tokens", "demoted", "cuts", "guaranteed"]
    header += ["anthropic", "openai"] + ([f"recall@{k}"] if questions else [])
    rows = [header]
    results = []
    for number, policy in enumerate(policies, 1):
        label = _label(policy, summarizer)
        bar = progress_bar(progress, err, calls, f"[{number}/{len(policies)}] {label}", "call")
        if progress and not err.isatty():
            err.write(f"demote replay: [{number}/{len(policies)}] {label}\n")
            err.flush()
        starts = [0]

        def on_call(
            index: int,
            window: Sequence[MessageRecord],
            starts: list[int] = starts,
            bar: Any = bar,
        ) -> None:
            starts[0] = index + 1 - len(window)
            bar.update()

        compact = isinstance(policy.eviction, Compact) and summarizer == "template"
        with bar, SQLiteArchive(":memory:") as archive:
            result = replay(
                transcript,
                policy,
                hook=archive if questions else None,
                system_prompt_tokens=system_prompt_tokens,
                summarizer=TemplateSummarizer() if compact else None,
                label=label,
                on_call=on_call,
            )
            score = recall_score(transcript, archive, starts[0], k) if questions else None
        results.append(result)
        g = result.guaranteed_tokens
        row = [
            label,
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
    out.write("\n".join(table(rows)) + "\n")
    notes = [
        "window: smallest-largest over the model calls (one per user message); guaranteed: "
        "the smallest window once the chat outgrew it",
        "anthropic/openai: prompt cost relative to no prompt caching (lower is better)",
    ]
    if questions:
        notes.append(f"recall@{k}: questions whose evidence is in the window or recalled")
    if summarizer == "none" and any(isinstance(p.eviction, Compact) for p in policies):
        notes.append(
            "compact, no summarizer: nothing is summarized, the window is cut back in bulk at "
            "limit + 2 x compact_count, and a stand-in summary is priced "
            "(--summarizer template writes real summaries)"
        )
    out.write("\n" + "\n".join(notes) + "\n")
    if plot is not None:
        plot_windows(results, plot, title=f"Active window over {transcript.name}")
        out.write(f"plot written to {plot}\n")
    return results


def open_archive(
    archive: str | os.PathLike[str], table: str | None = None
) -> SQLiteArchive | PostgresArchive:
    """The archive an ``--archive`` names, read-only (:func:`demote.cli.stores.open_store`).

    Args:
        archive: A file path, or a ``postgresql://`` (``postgres://``) URL.
        table: The PostgreSQL archive's table (default ``demote_archive``).

    Raises:
        ConfigError: The file does not exist, or ``table`` was given with a file.
        StoreError: PostgreSQL cannot be reached, or holds no archive in ``table``.
    """
    store: SQLiteArchive | PostgresArchive = open_store("archive", archive, table=table).store
    return store


def inspect_stores(
    out: IO[str],
    *,
    state: str | os.PathLike[str] | None = None,
    archive: str | os.PathLike[str] | None = None,
    outbox: str | os.PathLike[str] | None = None,
    conversation: str | None = None,
    archive_table: str | None = None,
    state_table: str | None = None,
    state_prefix: str | None = None,
) -> None:
    """Print each conversation's demotion state, pending messages, archive size and dead letters.

    The stores are opened read-only by :func:`demote.cli.stores.open_store`: the state
    store an SQLite file, a Redis URL (``state_prefix``) or a PostgreSQL URL
    (``state_table``), the archive an SQLite file or a PostgreSQL URL (``archive_table``).
    The output starts with what each store reads (its file, table or key prefix); the
    table below is the same for the same conversation whatever the store.

    Pending messages (they left the window, the hook has not accepted them yet: the
    window start less the watermark, from the state store) are counted per conversation
    and in all. The last delivery error is not stored there: the process that delivers
    keeps it (``Demoter.conversation_stats``, ``demote.delivery_failed`` events, the
    ``demote`` logger), which the output says when something is pending. With an outbox,
    each dead letter is listed with its conversation and last error.

    Raises:
        ConfigError: No store given, a given file does not exist, an option goes with
            another backend, or ``conversation`` is in none of the given state store and
            archive.
        StoreError: A store cannot be read (a server out of reach, another schema).
    """
    if state is None and archive is None and outbox is None:
        raise ConfigError("give at least one of --state, --archive, --outbox")
    opened: list[OpenedStore] = []
    try:
        if state is not None:
            opened.append(open_store("state", state, table=state_table, prefix=state_prefix))
        if archive is not None:
            opened.append(open_store("archive", archive, table=archive_table))
        if outbox is not None:
            opened.append(open_store("outbox", outbox))
        _inspect(out, {o.kind: o for o in opened}, conversation)
    finally:
        for o in opened:
            o.close()


def _inspect(out: IO[str], opened: dict[str, OpenedStore], conversation: str | None) -> None:
    st = opened["state"].store if "state" in opened else None
    ar = opened["archive"].store if "archive" in opened else None
    ids = set(st.conversations() if st else []) | set(ar.conversations() if ar else [])
    if conversation is not None:
        if conversation not in ids and (st is not None or ar is not None):
            named = [opened[k].location for k in ("state", "archive") if k in opened]
            raise ConfigError(
                f"unknown conversation {conversation!r}: not in "
                + " or ".join(named)
                + (f" (it has {_few(ids)})" if ids else " (no conversations at all)")
            )
        ids = {conversation} & ids
    width = max(len(o.kind) for o in opened.values()) + 1
    for o in opened.values():
        out.write(f"{o.kind + ':':<{width}} {o.where}\n")
    out.write("\n")
    header = ["conversation", "window start", "watermark", "pending", "pinned", "archived"]
    rows = [[*header, "summary"]]
    pending: dict[str, int] = {}
    summaries: dict[str, str] = {}
    for cid in sorted(ids):
        s = st.get(cid) if st else None
        if s is not None:
            pending[cid] = max(0, s.window_start - max(s.delivered, s.pinned))
            summaries[cid] = s.summary or ""
        rows.append(
            [
                cid,
                "-" if s is None else str(s.window_start),
                "-" if s is None else str(s.delivered),
                "-" if s is None else str(pending[cid]),
                "-" if s is None else str(s.pinned),
                "-" if ar is None else str(ar.count(cid)),
                "-" if s is None or s.summary is None else f"{len(s.summary)} chars",
            ]
        )
    if len(rows) == 1:
        if st is not None or ar is not None:
            out.write("no conversations\n")
    else:
        out.write("\n".join(table(rows)) + "\n")
    if pending:
        total = sum(pending.values())
        waiting = {cid: n for cid, n in pending.items() if n}
        of_all = f"{len(waiting)} of {len(pending)} conversations"
        out.write(f"\npending: {total} messages in {of_all}\n")
        if waiting:
            out.write(
                f"\n{total} messages pending in {len(waiting)} conversations "
                f"({_few(set(waiting))}): they left the window before the hook accepted them "
                "and are retried by the next loads. The state store does not keep the "
                "delivery error; the process that delivers does (Demoter.conversation_stats, "
                "demote.delivery_failed events, warnings on the 'demote' logger).\n"
            )
    if conversation is not None and summaries.get(conversation):
        out.write(f"\nsummary of {conversation!r}:\n{summaries[conversation]}\n")
    if "outbox" in opened:
        box = opened["outbox"].store
        dead = box.dead_letters()
        of = [(getattr(d.item, "conversation_id", None), d) for d in dead]
        if conversation is not None:
            of = [(c, d) for c, d in of if c == conversation]
        where = opened["outbox"].location
        out.write(f"\noutbox {where}: {box.pending()} pending, {len(of)} dead letters\n")
        for owner, d in of:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.failed_at))
            out.write(
                f"  {owner or '-'}  {d.key}  attempts={d.attempts}  {when}  {d.error or ''}\n"
            )


def _few(ids: set[str], n: int = 3) -> str:
    shown = ", ".join(repr(i) for i in sorted(ids)[:n])
    return shown + (f" and {len(ids) - n} more" if len(ids) > n else "")


def search_archive(
    out: IO[str],
    archive: str | os.PathLike[str],
    conversation: str,
    query: str,
    k: int = 5,
    *,
    archive_table: str | None = None,
    err: IO[str] | None = None,
) -> None:
    """Print what recall returns from an archive for ``query`` (best first).

    The archive is an SQLite file or a PostgreSQL URL
    (:func:`demote.cli.stores.open_store`, read-only); which file or table was read goes
    to ``err`` (standard error by default), the hits to ``out``.

    Raises:
        ConfigError: The archive file does not exist, or ``k < 1``.
        StoreError: A PostgreSQL archive cannot be read.
    """
    if k < 1:
        raise ConfigError(f"-k: must be >= 1, got {k}")
    with open_store("archive", archive, table=archive_table) as opened:
        hits = opened.store.search(conversation, query, k)
        total = opened.store.count(conversation)
    (sys.stderr if err is None else err).write(f"demote search: read {opened.where}\n")
    if not hits:
        out.write(f"no match in {total} archived messages of {conversation!r}\n")
        return
    for rank, hit in enumerate(hits, 1):
        text = " ".join(hit.text.split())
        out.write(f"{rank}. [{hit.score:6.2f}] #{hit.index} {hit.role}: {text}\n")
