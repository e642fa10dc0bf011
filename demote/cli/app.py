"""The ``demote`` command line: demo, replay, inspect, search, migrate and erase.

Argument parsing only; each subcommand calls one function of :mod:`demote.cli.demo`,
:mod:`demote.cli.commands` or :mod:`demote.cli.migrate`; every store option is opened by
:func:`demote.cli.stores.open_store`. Every user error (a bad policy, a missing file, an unreadable
transcript line, an unknown conversation) is printed as one line, ``demote: error: ...``,
with exit code 2. Results go to standard output; notes and progress to standard error.
``erase`` lives in :mod:`demote.cli.erase`; it exits 1 when a tier did not erase, 3 when
no store held the conversation.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from demote import __version__
from demote._validate import MAX_COUNT, MAX_SECONDS, seconds
from demote.errors import DemoteError

__all__ = ["build_parser", "main"]

_ARCHIVE_HELP = (
    "an SQLiteArchive file, or a PostgresArchive's database as a URL "
    "(postgresql://user@host/db; read, never written)"
)
_TABLE_HELP = "with a PostgreSQL --archive: its table (default: demote_archive)"
_STATE_HELP = (
    "an SQLiteStateStore file, or a fleet's state store as a URL: redis:// (rediss://) "
    "or postgresql://"
)
_STATE_TABLE_HELP = "with a PostgreSQL --state: its table (default: demote_state)"
_STATE_PREFIX_HELP = "with a Redis --state: its key prefix (default: demote:)"
_POLICY_HELP = (
    "a window policy as JSON, e.g. "
    '\'{"unit": "tokens", "limit": 4000, "eviction": {"kind": "bulk", "overflow": 1000}}\''
)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``demote: error: ...`` (exit 2)."""

    def error(self, message: str) -> NoReturn:
        """Print one line naming the problem and exit with status 2."""
        sub = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        self.exit(2, f"demote: error: {sub}{message} (see {self.prog} --help)\n")


def _count(minimum: int) -> Callable[[str], int]:
    """An option's parser: an int in ``[minimum, MAX_COUNT]`` (argparse names the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an int, got {text!r:.40}") from None
        if not minimum <= value <= MAX_COUNT:
            raise argparse.ArgumentTypeError(
                f"must be an int from {minimum} to {MAX_COUNT}, got {text:.24}"
            )
        return value

    return parse


def _seconds(text: str) -> float:
    """``--wait``'s parser: a finite number of seconds >= 0."""
    try:
        return seconds("", float(text), zero=True)
    except (ValueError, OverflowError):  # ConfigError is a ValueError
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from 0 to {MAX_SECONDS:g}, got {text!r:.40}"
        ) from None


def _demo(args: argparse.Namespace) -> None:
    from demote.cli.demo import run_demo
    from demote.cli.demo_parts import DemoOptions

    run_demo(
        DemoOptions(
            directory=Path(args.dir),
            locomo=None if args.locomo is None else Path(args.locomo),
            sample=args.sample,
            strategy=args.strategy,
            policy=args.policy,
            model=args.model,
            turns=args.turns,
            progress=not args.no_progress,
            restart=args.restart,
        )
    )


def _replay(args: argparse.Namespace) -> None:
    from demote.cli.commands import parse_policies, replay_transcript

    replay_transcript(
        args.transcript,
        parse_policies(args.policy or []),
        sys.stdout,
        format=args.format,
        sample=args.sample,
        plot=args.plot,
        k=args.k,
        system_prompt_tokens=args.system_prompt_tokens,
        summarizer=args.summarizer,
        err=sys.stderr,
        progress=not args.no_progress,
    )


_STORE_OPTIONS = ("state", "state_table", "state_prefix", "archive", "archive_table", "outbox")


def _stores(args: argparse.Namespace) -> dict[str, str | None]:
    """The store options (:func:`_store_arguments`) as keywords."""
    return {name: getattr(args, name) for name in _STORE_OPTIONS}


def _store_arguments(parser: argparse.ArgumentParser, archive_help: str) -> None:
    """``--state`` (with its table and prefix), ``--archive`` (its table), ``--outbox``."""
    parser.add_argument("--state", metavar="STATE", help=_STATE_HELP)
    parser.add_argument("--state-table", metavar="TABLE", help=_STATE_TABLE_HELP)
    parser.add_argument("--state-prefix", metavar="PREFIX", help=_STATE_PREFIX_HELP)
    parser.add_argument("--archive", metavar="ARCHIVE", help=archive_help)
    parser.add_argument("--archive-table", metavar="TABLE", help=_TABLE_HELP)
    parser.add_argument("--outbox", metavar="outbox.db", help="an SQLiteOutbox file")


def _inspect(args: argparse.Namespace) -> None:
    from demote.cli.commands import inspect_stores

    inspect_stores(sys.stdout, conversation=args.conversation, **_stores(args))


def _migrate(args: argparse.Namespace) -> None:
    from demote.cli.migrate import migrate_stores

    migrate_stores(sys.stdout, **_stores(args))


def _search(args: argparse.Namespace) -> None:
    from demote.cli.commands import search_archive

    search_archive(
        sys.stdout,
        args.archive,
        args.conversation,
        args.query,
        args.k,
        archive_table=args.archive_table,
    )


def _erase(args: argparse.Namespace) -> int:
    from demote.cli.erase import erase_stores, exit_status

    report = erase_stores(
        sys.stdout,
        args.conversation,
        state=args.state,
        archive=args.archive,
        outbox=args.outbox,
        wait=args.wait,
        state_table=args.state_table,
        archive_table=args.archive_table,
    )
    return exit_status(report)


def build_parser() -> argparse.ArgumentParser:
    """The ``demote`` argument parser (demo, replay, inspect, search, migrate, erase)."""
    parser = _Parser(
        prog="demote",
        description="A bounded active window for LangChain and LlamaIndex chats; what falls "
        "out is demoted, exactly once, to a long-tail store.",
    )
    parser.add_argument("--version", action="version", version=f"demote {__version__}")
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = subs.add_parser(
        "demo",
        help="replay a long chat through LangChain and LlamaIndex, offline",
        description="Replay a long conversation through a LangChain RunnableWithMessageHistory "
        "chain (with_demotion) and a LlamaIndex chat engine (DemotingMemory), with SQLite "
        "state and archive in --dir; ask about an early fact at the end. Offline: no server, "
        "no key. Run it again to continue from the stored state; a run that stopped "
        "half-way is resumed.",
    )
    demo.add_argument("--dir", default="demote-demo", help="demo folder (default: ./demote-demo)")
    demo.add_argument(
        "--restart", action="store_true", help="remove the demo's files in --dir and start over"
    )
    demo.add_argument(
        "--locomo",
        metavar="PATH",
        help="play a LoCoMo conversation instead (conv-N.json or locomo10.json from the "
        "snap-research/locomo repository; not shipped with demote)",
    )
    demo.add_argument(
        "--sample", metavar="ID", help="with --locomo locomo10.json: which conversation"
    )
    demo.add_argument(
        "--strategy",
        choices=("per_item", "bulk", "compact"),
        default="bulk",
        help="eviction strategy of the default 1200-token window (default: bulk)",
    )
    demo.add_argument("--policy", metavar="JSON", help=_POLICY_HELP + " (overrides --strategy)")
    demo.add_argument(
        "--model",
        metavar="PROVIDER:MODEL",
        help="a real model for the LangChain part (anything init_chat_model accepts; "
        "needs its package and API key)",
    )
    demo.add_argument(
        "--turns", type=_count(1), metavar="N", help="turns to play this run (default: all)"
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(run=_demo)

    rep = subs.add_parser(
        "replay",
        help="replay a transcript under window policies and compare them",
        description="Replay a transcript (JSONL of {role, content}, LangChain messages_to_dict "
        "output, a LlamaIndex chat store such as the demo's llamaindex-chats.jsonl, or a "
        "LoCoMo JSON file) under one or more policies: window sizes, demotions, "
        "guaranteed context, relative prompt-cache cost, recall hit rate (with questions).",
    )
    rep.add_argument("transcript", help="the transcript file")
    rep.add_argument(
        "--policy", action="append", metavar="JSON", help=_POLICY_HELP + "; repeatable"
    )
    rep.add_argument(
        "--format",
        choices=("auto", "jsonl", "langchain", "llamaindex", "locomo"),
        default="auto",
        help="transcript format (default: auto)",
    )
    rep.add_argument(
        "--plot",
        metavar="FILE.png",
        help="plot window tokens over turns (.png, .svg or .pdf; needs demote[plot])",
    )
    rep.add_argument(
        "--sample",
        metavar="ID",
        help="for a file of several conversations (LoCoMo, a LlamaIndex chat store): which "
        "one (default: the first)",
    )
    rep.add_argument(
        "--summarizer",
        choices=("none", "template"),
        default="none",
        help="for compact policies: none (cut back in bulk, a stand-in summary is priced; "
        "the default) or template (a real summary, no model)",
    )
    rep.add_argument(
        "-k", type=_count(1), default=5, help="recall depth for the hit rate (default: 5)"
    )
    rep.add_argument(
        "--system-prompt-tokens",
        type=_count(0),
        default=200,
        metavar="N",
        help="size of the system prompt priced with every call (default: 200)",
    )
    rep.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    rep.set_defaults(run=_replay)

    ins = subs.add_parser(
        "inspect",
        help="show conversations in a state store and archive",
        description="First what each store reads (file, table, key prefix); then per "
        "conversation: window start, watermark, pending messages, pinned messages, archived "
        "count, summary length, and the pending total; with --outbox, pending items and "
        "dead letters with their conversation and last error. The last delivery error of a "
        "conversation is kept by the process that delivers, not in the state store. Every "
        "store is opened read-only: nothing is created or written.",
    )
    _store_arguments(ins, _ARCHIVE_HELP)
    ins.add_argument("conversation", nargs="?", help="only this conversation")
    ins.set_defaults(run=_inspect)

    sea = subs.add_parser(
        "search",
        help="show what recall returns from an archive",
        description="Search the archived messages of one conversation, as recall would.",
    )
    sea.add_argument("--archive", required=True, metavar="ARCHIVE", help=_ARCHIVE_HELP)
    sea.add_argument("--archive-table", metavar="TABLE", help=_TABLE_HELP)
    sea.add_argument("conversation", help="the conversation id")
    sea.add_argument("query", help="the text to search for")
    sea.add_argument("-k", type=_count(1), default=5, help="how many messages (default: 5)")
    sea.set_defaults(run=_search)

    mig = subs.add_parser(
        "migrate",
        help="create or upgrade demote's tables ahead of a deployment",
        description="Create the tables of each store given, or upgrade them to this "
        "demote's schema, and make again any that is missing; print what was found and "
        "made. Idempotent. A new SQLite file is created; Redis keeps no schema (nothing to "
        "do). A newer schema is refused and left as it was. The stores do the same at first "
        "use; run this first to do it before the workers start.",
    )
    _store_arguments(
        mig, "an SQLiteArchive file, or a PostgresArchive's database as a URL (postgresql://)"
    )
    mig.set_defaults(run=_migrate)

    era = subs.add_parser(
        "erase",
        help="forget a conversation in the state store, archive and outbox",
        description="Delete one conversation's demotion state, archived messages and queued "
        "or dead-lettered outbox items, bytes included (secure delete, WAL truncated), after "
        "waiting for a delivery in flight; print what each tier did. Exit status 0 if "
        "every tier erased, 1 if one did not, 3 if none of the stores held the "
        "conversation. The application's own chat history is not in these files.",
    )
    era.add_argument(
        "--state",
        required=True,
        metavar="STATE",
        help="an SQLiteStateStore file, or a redis:// or postgresql:// URL of a fleet's store",
    )
    era.add_argument(
        "--state-table", metavar="TABLE", help="a PostgreSQL state store's table (demote_state)"
    )
    era.add_argument(
        "--archive",
        required=True,
        metavar="ARCHIVE",
        help="an SQLiteArchive file, or a postgresql:// URL of a PostgresArchive",
    )
    era.add_argument("--archive-table", metavar="TABLE", help=_TABLE_HELP)
    era.add_argument("--outbox", metavar="outbox.db", help="an SQLiteOutbox file")
    era.add_argument(
        "--wait",
        type=_seconds,
        metavar="SECONDS",
        help="how long to wait for a delivery in flight (default: the lease time, 30 s)",
    )
    era.add_argument("conversation", help="the conversation id")
    era.set_defaults(run=_erase)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``demote`` command line; returns the exit status.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).

    Returns:
        ``0`` on success, ``2`` for a user error, ``1`` for anything unexpected
        (set ``DEMOTE_DEBUG=1`` to see its traceback) or an incomplete ``erase``,
        ``3`` for an ``erase`` of a conversation no store held, ``130`` when interrupted.
    """
    args = build_parser().parse_args(argv)
    try:
        status = args.run(args)
    except (DemoteError, OSError) as exc:
        print(f"demote: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("demote: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("DEMOTE_DEBUG"):
            traceback.print_exc()
        print(f"demote: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
