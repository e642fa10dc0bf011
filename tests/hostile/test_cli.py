"""The catalogue, command line: every bad option exits 2 with one line naming it.

Each probe runs ``demote.cli.app.main(argv)`` in process over a folder holding an
archive (conversations A and B), a state store, an outbox and files of other kinds. A
refused command exits 2 with exactly one line on standard error that names the option,
and no file changes; an accepted read-only command (``search``, ``inspect``) exits 0 and
no file changes either: no byte of a store, and no WAL left with content.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from demote import Demoter, SlidingWindow, SQLiteArchive, SQLiteOutbox, SQLiteStateStore
from demote.cli.app import main
from tests.hostile.test_archive import TEXTS, demotion
from tests.strategies import Msg, describer


@dataclass
class Run:
    """One command line: ``argv`` (``{d}`` is the folder), what it must do."""

    argv: list[str]
    names: str  # the word the one-line refusal must contain ("" for an accepted run)
    status: int = 2
    check: Callable[[str], bool] | None = None  # on standard output, for status 0

    @property
    def id(self) -> str:
        shown = " ".join(a if len(a) < 30 else f"{a[:12]}…({len(a)})" for a in self.argv)
        return shown.replace("{d}/", "").encode("ascii", "backslashreplace").decode()


def stores(root: Path) -> None:
    with SQLiteArchive(root / "archive.db") as archive:
        for cid, texts in TEXTS.items():
            archive.deliver(demotion(cid, texts))
    state = SQLiteStateStore(root / "state.db")
    d = Demoter(SlidingWindow.last_messages(2), state=state)
    d.load("A", [Msg("user", f"m{i}") for i in range(5)], describer(d))
    d.close()
    state.close()
    SQLiteOutbox(root / "outbox.db").close()
    (root / "notes.txt").write_text("not a database\n" * 50)
    (root / "corrupt.db").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 32)
    (root / "folder.db").mkdir()
    (root / "chat.jsonl").write_text('{"role": "user", "content": "hi"}\n' * 4)


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


def no_b(out: str) -> bool:
    return not any(t in out for t in TEXTS["B"])


def rows(out: str) -> set[str]:
    """The conversations of inspect's table (after what each store reads, and its header)."""
    table = out.split("\n\n", 1)[1]
    return {line.split()[0] for line in table.splitlines()[1:] if line.strip()}


BAD_COUNTS = ["0", "-1", "2.5", "nan", "", "abc", str(10**20), "9" * 5000, "1e3", "0x10"]
OTHERS = ["state.db", "outbox.db", "notes.txt", "corrupt.db", "folder.db", "missing.db"]
RUNS: list[Run] = []

# -- search ----------------------------------------------------------------------------------

SEARCH = ["search", "--archive", "{d}/archive.db", "A", "garden"]
RUNS += [Run([*SEARCH, "-k", v], "-k") for v in BAD_COUNTS]
RUNS += [
    Run(["search", "--archive", f"{{d}}/{f}", "A", "garden"], "archive")
    for f in [*OTHERS, ""]
    if f != "archive.db"
]
RUNS += [
    Run(["search", "--archive", "{d}/archive.db", c, "x"], "conversation")
    for c in ("", "\udc80", "y" * 20_000)
]
RUNS.append(Run([*SEARCH, "--archive-table", "t"], "archive-table"))
RUNS.append(Run(["search", "--archive", "{d}/archive.db", "A"], "query"))
RUNS.append(Run([*SEARCH, "--bogus"], "--bogus"))
RUNS += [
    Run(["search", "--archive", "{d}/archive.db", "A", q], "", 0, no_b)
    for q in (
        "",
        "garden giraffe",
        "lone \udc80 surrogate garden",
        'NEAR("garden" "basil") OR scope:* -x',
        "giraffe" + " garden" * 100_000,
        "bicycle",
        "nul\x00garden",
    )
]
RUNS += [Run([*SEARCH, "-k", k], "", 0, no_b) for k in ("1", "2147483647", " 3 ", "+2")]

# -- inspect ---------------------------------------------------------------------------------

RUNS += [
    Run(["inspect", "--state", f"{{d}}/{f}"], "state")
    for f in ["archive.db", *OTHERS]
    if f != "state.db"
]
RUNS += [Run(["inspect", "--archive", f"{{d}}/{f}"], "archive") for f in OTHERS]
RUNS += [
    Run(["inspect", "--outbox", f"{{d}}/{f}"], "outbox")
    for f in ("archive.db", "state.db", "notes.txt", "missing.db")
]
RUNS.append(Run(["inspect"], "--state"))
RUNS += [
    Run(["inspect", "--archive", "{d}/archive.db", c], "conversation")
    for c in ("C", "", "\udc80", "y" * 20_000)
]
RUNS += [
    Run(["inspect", "--archive", "{d}/archive.db"], "", 0, lambda out: rows(out) == {"A", "B"}),
    Run(["inspect", "--state", "{d}/state.db", "--archive", "{d}/archive.db", "A"], "", 0),
    Run(["inspect", "--outbox", "{d}/outbox.db"], "", 0),
]

# -- erase, replay, demo -----------------------------------------------------------------------

ERASE = ["erase", "--state", "{d}/state.db", "--archive", "{d}/archive.db"]
RUNS += [
    Run([*ERASE, "--wait", v, "A"], "--wait") for v in ("nan", "-1", "inf", "abc", "1e300", "")
]
RUNS += [
    Run(["erase", "--state", "{d}/state.db", "--archive", f"{{d}}/{f}", "A"], "archive")
    for f in OTHERS
    if f != "state.db"
]
RUNS += [
    Run(["erase", "--state", f"{{d}}/{f}", "--archive", "{d}/archive.db", "A"], "state")
    for f in ("archive.db", "outbox.db", "notes.txt", "corrupt.db")
]
RUNS += [Run([*ERASE, c], "conversation") for c in ("", "\udc80")]
REPLAY = ["replay", "{d}/chat.jsonl"]
RUNS += [Run([*REPLAY, "-k", v], "-k") for v in BAD_COUNTS]
RUNS += [
    Run([*REPLAY, "--system-prompt-tokens", v], "--system-prompt-tokens")
    for v in ("-1", "2.5", str(10**20), "x")
]
RUNS += [
    Run(["replay", f"{{d}}/{f}"], "transcript")
    for f in ("missing.jsonl", "folder.db", "corrupt.db")
]
RUNS += [
    Run(["replay", "{d}/chat.jsonl", "--policy", p], "policy")
    for p in ("{", "[]", '{"unit": "moons", "limit": 3}', '{"unit": "messages", "limit": -1}')
]
RUNS += [
    Run(["demo", "--dir", "{d}/demo", "--turns", v], "--turns")
    for v in ("0", "-1", str(10**20), "x", "")
]


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.id)
def test_cli_probe(run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stores(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = files(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    argv = [a.replace("{d}", str(tmp_path)) for a in run.argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse
            status = exc.code if isinstance(exc.code, int) else 1
    lines = err.getvalue().splitlines()
    assert status == run.status, (status, err.getvalue()[-400:])
    if run.status == 2:
        assert len(lines) == 1 and lines[0].startswith("demote"), err.getvalue()[-400:]
        assert run.names.lower() in lines[0].lower(), lines[0]
        assert "Traceback" not in err.getvalue()
    elif run.check is not None:
        assert run.check(out.getvalue()), out.getvalue()[-400:]
    assert files(tmp_path) == before
    leftovers = [p.name for p in tmp_path.glob("*-wal") if p.stat().st_size > 0]
    assert leftovers == []


def test_the_catalogue_is_large() -> None:
    assert len(RUNS) >= 100
    assert len({r.id for r in RUNS}) == len(RUNS)
