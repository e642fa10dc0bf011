"""Write the release fixtures: files that earlier releases of demote wrote, for the tests.

Not run by the test suite (its name does not start with ``test_``); the files it writes are
committed under ``tests/releases/data/<wave>/`` and read by ``test_across_releases.py``,
which needs neither git nor the old code.

Usage, from the repository root, with the project's interpreter (langchain-core installed)::

    .venv/bin/python tests/releases/make_fixtures.py            # every wave
    .venv/bin/python tests/releases/make_fixtures.py wave2      # one wave

For each wave (a past release: the commit on main that ended it, listed in ``WAVES``) it
exports that commit's tree with ``git archive`` into a temporary directory, and runs
:func:`scenario` in a subprocess with ``PYTHONPATH`` set to that tree only, so the old
release's ``demote`` and ``langchain_demote`` are the ones imported (the subprocess checks
``demote.__file__`` and records it). The scenario uses only the APIs every wave has
(``Demoter``, ``SlidingWindow.last_messages``, ``Demoter.load`` / ``describe`` /
``drain``, ``SQLiteStateStore``, ``SQLiteArchive`` (``demote.hooks.archive`` in wave 1),
``DemotingChatMessageHistory``, ``Recorder`` with an ``SQLiteOutbox``):

* ``core-1``, a framework-free conversation through ``Demoter.load`` (records made with
  ``Demoter.describe``, as ``tests/strategies.py``'s ``describer`` does): a pinned system
  message, a tool call (``opens``) and its result (``answers``), unicode text, loaded
  after every message under ``SlidingWindow.last_messages(4)``;
* ``lc-1``, the same through the LangChain adapter over an ``InMemoryChatMessageHistory``
  (an ``AIMessage`` with a tool call and its ``ToolMessage``), its user turns captured by
  a ``Recorder`` with an ``SQLiteOutbox``, whose sink blocks: the turns, one ``Demotion``
  and one plain JSON value stay in the outbox undelivered when the Recorder closes.

Each wave's directory gets ``state.sqlite`` (the state store), ``archive.sqlite`` (the
archive hook's file), ``outbox.sqlite`` and ``manifest.json``: the commit, the history of
each conversation (role, text, tool calls), the committed state, the archived rows (key,
index, role, text) and the outbox's undelivered items. Every SQLite file is VACUUMed after
the old code closed it, and no ``-wal`` or ``-shm`` file is left (the files are named
``.sqlite``: ``.gitignore`` ignores ``*.db``).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

WAVES = {"wave1": "9b5f0e8", "wave2": "391e7ab", "wave3": "1f9939b", "wave4": "16d41c9"}

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
FILES = ("state.sqlite", "archive.sqlite", "outbox.sqlite")

SYSTEM = "You are a terse trail guide."
#: The framework-free conversation: (role, text, opens, answers).
CORE: list[tuple[str, str, list[str], str | None]] = [
    ("system", SYSTEM, [], None),
    ("user", "We hiked the Alps in June; the tent leaked.", [], None),
    ("assistant", "Noted — Alps, June, a leaky tent.", [], None),
    ("user", "Which hut is near the Matterhorn? Grüße an Anaïs ☕", [], None),
    ("assistant", "", ["call_hut_1"], None),
    ("tool", "Hörnlihütte, 3260 m — Übernachtung ab 150 CHF 🏔", [], "call_hut_1"),
    ("assistant", "The Hörnlihütte sits at 3260 m.", [], None),
    ("user", "Small talk one.", [], None),
    ("assistant", "Sure, one.", [], None),
    ("user", "Small talk two.", [], None),
    ("assistant", "Sure, two.", [], None),
]
#: The LangChain conversation: role, text, tool calls, the call a result answers.
LANGCHAIN: list[dict[str, Any]] = [
    {"role": "user", "text": "We kayaked the Vltava in May; the paddle snapped."},
    {"role": "assistant", "text": "Noted — Vltava, May, a snapped paddle."},
    {"role": "user", "text": "Find a café in Zürich for Grüße an Anaïs ☕"},
    {
        "role": "assistant",
        "text": "",
        "tool_calls": [
            {"id": "call_cafe_1", "name": "find_cafe", "args": {"city": "Zürich", "near": "HB"}}
        ],
    },
    {
        "role": "tool",
        "text": "Café Sprüngli, Bahnhofstrasse 21 — open 7–18 🥐",  # noqa: RUF001
        "tool_call_id": "call_cafe_1",
        "name": "find_cafe",
    },
    {"role": "assistant", "text": "Café Sprüngli on Bahnhofstrasse, open until 18:00."},
    {"role": "user", "text": "Chit chat one."},
    {"role": "assistant", "text": "Okay, one."},
    {"role": "user", "text": "Chit chat two."},
    {"role": "assistant", "text": "Okay, two."},
    {"role": "user", "text": "Chit chat three."},
    {"role": "assistant", "text": "Okay, three."},
]
#: The extra outbox items: a demotion batch and a plain JSON value (with its key).
OUTBOX_DEMOTION: dict[str, Any] = {
    "conversation_id": "lc-1",
    "messages": [["user", "Ein Grüezi aus dem Outbox — naïve ✓", 90, "outbox-demotion-key-90"]],
}
OUTBOX_JSON: dict[str, Any] = {"key": "outbox-json-1", "value": {"note": "réglé ✓", "n": 3}}


def scenario(out: Path, tree: Path) -> None:  # runs in the subprocess, on the old code
    import logging
    import threading
    import warnings

    import demote

    logging.disable(logging.WARNING)  # the Recorder warns about what it leaves behind
    import langchain_demote

    for module in (demote, langchain_demote):
        if not Path(module.__file__ or "").resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"imported the wrong {module.__name__}: {module.__file__}")
    from langchain_core.chat_history import InMemoryChatMessageHistory
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

    from demote import Demoter, Recorder, SlidingWindow, SQLiteOutbox, SQLiteStateStore
    from demote.records import DemotedMessage, Demotion
    from langchain_demote import DemotingChatMessageHistory

    # LangChain deprecates the in-memory history (its own filter is set at import time)
    warnings.filterwarnings("ignore", "The class `InMemoryChatMessageHistory`")
    try:
        from demote.archive.sqlite import SQLiteArchive  # wave 3 on
    except ImportError:
        from demote.hooks.archive import SQLiteArchive  # type: ignore  # waves 1, 2

    state = SQLiteStateStore(out / "state.sqlite")
    archive = SQLiteArchive(out / "archive.sqlite")
    demoter = Demoter(SlidingWindow.last_messages(4), archive, state=state)

    class Msg:  # tests/strategies.py's Msg, as every wave has it
        def __init__(self, role: str, text: str, opens: list[str], answers: str | None):
            self.role, self.text, self.opens, self.answers = role, text, tuple(opens), answers

    def describe(m: Msg) -> Any:
        return demoter.describe(m.role, m.text, opens=m.opens, answers=m.answers)

    core: list[Msg] = []
    for row in CORE:
        core.append(Msg(*row))
        demoter.load("core-1", core, describe)
        demoter.drain()

    release = threading.Event()  # never set: the sink holds its first item until exit
    outbox = SQLiteOutbox(out / "outbox.sqlite")
    recorder = Recorder(lambda item: release.wait(), flush_timeout=0.2, outbox=outbox)
    history = DemotingChatMessageHistory(
        InMemoryChatMessageHistory(), demoter, "lc-1", capture=recorder
    )
    for item in LANGCHAIN:
        message: BaseMessage
        if item["role"] == "user":
            message = HumanMessage(item["text"])
        elif item["role"] == "tool":
            message = ToolMessage(
                item["text"], tool_call_id=item["tool_call_id"], name=item["name"]
            )
        else:
            calls = [{**c, "type": "tool_call"} for c in item.get("tool_calls", [])]
            message = AIMessage(item["text"], tool_calls=calls)
        history.add_messages([message])
        history.messages  # noqa: B018 - a read is a load, as a chain's next turn does
        demoter.drain()
    recorder.enqueue(
        Demotion(
            OUTBOX_DEMOTION["conversation_id"],
            tuple(DemotedMessage(*m) for m in OUTBOX_DEMOTION["messages"]),
        )
    )
    recorder.enqueue(OUTBOX_JSON["value"], key=OUTBOX_JSON["key"])
    recorder.close()
    undelivered = [(r.key, r.payload) for r in outbox.load()]
    outbox.close()

    conversations: dict[str, Any] = {}
    histories = {
        "core-1": [{"role": r, "text": t, "opens": o, "answers": a} for r, t, o, a in CORE],
        "lc-1": LANGCHAIN,
    }
    for cid, adapter in (("core-1", "core"), ("lc-1", "langchain")):
        st = state.get(cid)
        assert st is not None, cid
        conversations[cid] = {
            "adapter": adapter,
            "messages": histories[cid],
            "state": {name: getattr(st, name) for name in st.__dataclass_fields__},
            "archived": [
                {"index": r.index, "key": r.key, "role": r.role, "text": r.text}
                for r in archive.messages(cid)
            ],
        }
    archive.close()
    state.close()
    manifest = {
        "demote_file": str(Path(demote.__file__).resolve().relative_to(tree.resolve())),
        "window": "SlidingWindow.last_messages(4)",
        "conversations": conversations,
        "outbox": {
            "undelivered": [{"key": k, "payload": json.loads(p)} for k, p in undelivered],
            "demotion": OUTBOX_DEMOTION,
            "json": OUTBOX_JSON,
        },
    }
    (out / "scenario.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1))


def export(commit: str, into: Path) -> None:
    """The tree of ``commit`` (its ``demote`` and ``langchain_demote``), without a worktree."""
    with tempfile.TemporaryFile() as tar:
        subprocess.run(
            ["git", "archive", "--format=tar", commit, "demote", "langchain_demote"],
            cwd=HERE.parent.parent,
            stdout=tar,
            check=True,
        )
        tar.seek(0)
        with tarfile.open(fileobj=tar) as archive:
            archive.extractall(into, filter="data")


def pragmas(path: Path) -> dict[str, Any]:
    db = sqlite3.connect(path)
    try:
        return {
            "user_version": db.execute("PRAGMA user_version").fetchone()[0],
            "application_id": db.execute("PRAGMA application_id").fetchone()[0],
            "journal_mode": db.execute("PRAGMA journal_mode").fetchone()[0],
        }
    finally:
        db.close()


def compact(path: Path) -> None:
    """VACUUM ``path`` and close it, leaving no ``-wal`` or ``-shm`` beside it."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("VACUUM")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    for suffix in ("-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            raise SystemExit(f"{path}{suffix} left behind")


def make(wave: str, commit: str) -> Path:
    target = DATA / wave
    with tempfile.TemporaryDirectory(prefix=f"demote-{wave}-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "out"
        tree.mkdir()
        out.mkdir()
        export(commit, tree)
        env = {
            **os.environ,
            "PYTHONPATH": str(tree),
            "MEM0_TELEMETRY": "False",
            "LANGSMITH_TRACING": "false",
            "LANGCHAIN_TRACING_V2": "false",
        }
        code = (
            "import sys, pathlib; sys.path.insert(0, sys.argv[3]); "
            "import make_fixtures as m; m.scenario(pathlib.Path(sys.argv[1]), "
            "pathlib.Path(sys.argv[2]))"
        )
        subprocess.run(
            [sys.executable, "-c", code, str(out), str(tree), str(HERE)],
            env=env,
            cwd=tmp,
            check=True,
        )
        manifest = json.loads((out / "scenario.json").read_text())
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        files = {}
        for name in FILES:
            compact(out / name)
            shutil.copyfile(out / name, target / name)
            files[name] = pragmas(target / name)
        manifest = {"wave": wave, "commit": commit, "files": files, **manifest}
        (target / "manifest.json").write_text(
            json.dumps(manifest, ensure_ascii=False, indent=1) + "\n"
        )
    return target


def main(argv: list[str]) -> None:
    for wave in argv or list(WAVES):
        target = make(wave, WAVES[wave])
        sizes = ", ".join(f"{p.name} {p.stat().st_size}" for p in sorted(target.iterdir()))
        print(f"{wave} ({WAVES[wave]}): {sizes}")


if __name__ == "__main__":
    main(sys.argv[1:])
