"""The catalogue's harness: one probe = one public call with one hostile value.

For each probe the call must either succeed (then ``check`` says whether the result is
right) or raise a :class:`~demote.errors.DemoteError` whose message names the argument;
and every store file of the environment must be byte-for-byte what it was when the call
was refused. Nothing else is acceptable: an untyped error, a hang, a crashed worker
thread, a silently accepted bad value (``accept=False`` probes must be refused), or a
refused call that wrote anything.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demote.errors import DemoteError

#: Values that are not numbers of seconds, counts or sizes.
BAD_NUMBERS: list[object] = [
    float("nan"),
    float("inf"),
    -float("inf"),
    -1,
    "5",
    None,
    True,
    b"3",
    [1],
    10**400,
]
#: Counts: every bad number, plus a fraction and zero.
BAD_COUNTS: list[object] = [*BAD_NUMBERS, 2.5, 0]
#: Ids that are not usable conversation ids.
BAD_IDS: list[object] = [None, 42, b"bytes", "", "nul\x00inside", "\ud800", "y" * 20_000, ["a"]]
#: Ids that look hostile but are fine: they must round-trip, never cross tenants.
ODD_IDS: list[str] = [
    "'; DROP TABLE demote_state; --",
    '"quoted" \\ back',
    "100%_like",
    "../../etc/passwd",
    "ünïcødé ☃ 🐍",
    "NEAR(a b) OR c*",
    "x" * 10_000,
]
#: Text that is not text.
BAD_TEXT: list[object] = [None, b"bytes", ["a", "list"], 3, {"a": 1}]
#: Text that is odd but must be handled: stored, searched, never a crash.
ODD_TEXT: list[str] = [
    "",
    "lone \ud800 surrogate",
    "nul\x00inside",
    'NEAR("a" "b") AND c* OR -d',
    '"unterminated',
    "col:term ^ $ { } ( )",
    "x" * 1_000_000,
]


@dataclass
class Probe:
    """One call with one hostile value.

    Attributes:
        name: Where, e.g. ``"Demoter(lease_ttl=nan)"``.
        argument: The word a refusal's message must contain (the argument's name).
        run: Performs the call in an environment.
        accept: ``True``: must succeed; ``False``: must be refused; ``None``: either.
        check: For a success: is the result right?
    """

    name: str
    argument: str
    run: Callable[[Env], object]
    accept: bool | None = False
    check: Callable[[Any, Env], bool] | None = None
    setup: Callable[[Env], object] | None = None


@dataclass
class Env:
    """A temporary folder with the stores a probe may use, built fresh for each probe."""

    root: Path
    objects: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], object]] = field(default_factory=list)

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def snapshot(self) -> dict[str, bytes]:
        """Every file's bytes, after folding each SQLite WAL into its main file."""
        for path in self.root.glob("*.db"):
            try:
                db = sqlite3.connect(path, timeout=5)
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                db.close()
            except sqlite3.Error:
                pass  # not a database (a corrupt or foreign file): compared as bytes
        return {
            str(p.relative_to(self.root)): p.read_bytes()
            for p in self.files()
            if not p.name.endswith(("-wal", "-shm"))
        }

    def close(self) -> None:
        for close in reversed(self.closers):
            with contextlib.suppress(Exception):
                close()


@dataclass
class Outcome:
    """What happened to one probe."""

    probe: Probe
    ok: bool
    why: str = ""


def judge(probe: Probe, env: Env) -> Outcome:
    """Run ``probe`` in ``env`` and say whether it behaved."""
    if probe.setup is not None:
        probe.setup(env)
    before = env.snapshot()
    try:
        result = probe.run(env)
    except DemoteError as exc:
        if probe.accept:
            return Outcome(probe, False, f"refused a good value: {exc!r:.200}")
        if probe.argument.lower() not in str(exc).lower():
            return Outcome(probe, False, f"the error does not name {probe.argument!r}: {exc}")
        after = env.snapshot()
        if after != before:
            changed = sorted(
                k for k in after.keys() | before.keys() if after.get(k) != before.get(k)
            )
            return Outcome(probe, False, f"refused, but wrote to {changed}")
        return Outcome(probe, True)
    except BaseException as exc:  # anything untyped is a defect
        return Outcome(probe, False, f"untyped {type(exc).__name__}: {exc!s:.200}")
    if probe.accept is False:
        return Outcome(probe, False, f"accepted a bad value, returned {result!r:.120}")
    if probe.check is not None and not probe.check(result, env):
        return Outcome(probe, False, f"wrong result {result!r:.120}")
    return Outcome(probe, True)


def show(value: object) -> str:
    """A short name for a value in a probe's name."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:16]}…({len(text)})"


def probes_for(
    name: str,
    argument: str,
    values: Iterable[object],
    call: Callable[[Env, Any], object],
    setup: Callable[[Env], object] | None = None,
) -> list[Probe]:
    """One refused probe per value: ``call(env, value)`` must raise naming ``argument``."""
    return [
        Probe(f"{name}({argument}={show(v)})", argument, lambda env, v=v: call(env, v), setup=setup)
        for v in values
    ]


#: Files of another kind a store may be pointed at (see :func:`make_foreign`).
FOREIGN_KINDS = ("state", "archive", "outbox", "corrupt", "text", "directory", "program")


def make_foreign(path: Path, kind: str) -> Path:
    """Put a file of ``kind`` (one of :data:`FOREIGN_KINDS`) at ``path``."""
    if kind in ("state", "archive", "outbox"):
        from demote import SQLiteArchive, SQLiteOutbox, SQLiteStateStore

        opener: Any = {"state": SQLiteStateStore, "archive": SQLiteArchive}.get(kind, SQLiteOutbox)
        opener(path).close()
    elif kind == "corrupt":
        path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 16)
    elif kind == "text":
        path.write_text("not a database at all\n" * 100)
    elif kind == "directory":
        path.mkdir()
    elif kind == "program":  # another program's database, in rollback-journal mode
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO customers (name) VALUES ('ada')")
        db.commit()
        db.close()
    else:
        raise ValueError(kind)
    return path


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``condition`` until it holds (``True``) or ``timeout`` passes (``False``)."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def guarded(call: Callable[[Env, Any], object]) -> Callable[[Env, Any], object]:
    """``call``, failing the probe if a refusal changed state the files do not show.

    ``env.objects["dump"]``, if set, reads that state (Redis keys, Postgres rows, an
    in-memory store, a framework's chat store): a refused call must leave it equal.
    """

    def run(env: Env, value: Any) -> object:
        dump = env.objects.get("dump")
        before = dump() if dump else None
        try:
            return call(env, value)
        except DemoteError:
            if dump and dump() != before:
                raise AssertionError("refused, but the in-memory or server state changed") from None
            raise

    return run


def check(probe: Probe, root: Path) -> None:
    """Run ``probe`` in a fresh environment under ``root``; fail the test if it misbehaved."""
    env = Env(root)
    try:
        outcome = judge(probe, env)
    finally:
        env.close()
    assert outcome.ok, f"{probe.name}: {outcome.why}"
