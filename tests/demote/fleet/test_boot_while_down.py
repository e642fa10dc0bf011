"""A worker that boots while its Redis or PostgreSQL is down, then catches up.

The state store (Redis or PostgreSQL) or the archive (PostgreSQL) is made while a TCP
proxy on 127.0.0.1 in front of its server refuses connections (``cut``: a stopped server)
or black-holes them (nothing answered). The store is made all the same; eight
conversations chat on it (threads on ``Demoter.load``); every turn returns, within the
policy's bound, and says it is degraded (state store) or keeps its demoted messages
pending (archive). Then the server comes back: every conversation must catch up (a load
that is not degraded and has nothing pending) within :data:`CATCH_UP` seconds, nothing
lost, nothing delivered twice. The measured catch-up is printed (``pytest -s``); the
operations docs quote the outage benchmark's figure (``python -m bench --sections
outage``). Every wait is bounded.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from demote import Backoff, Demoter, SlidingWindow, SQLiteStateStore, Window
from demote.records import make_key
from tests.support.outage import HOWS, KeySink, fault, proxied, settled, through
from tests.support.tcp_proxy import TcpProxy

LIMIT = 6
POLICY = SlidingWindow.last_messages(LIMIT)
CHATS = 8
#: Seconds the conversations chat while the server is away.
DOWN = 1.0
#: The goal: every conversation caught up within this many seconds of the server's return.
CATCH_UP = 2.0
#: Longest a test waits for anything.
PATIENCE = 15.0


class Chats:
    """Eight conversations chatting on one Demoter, and when each caught up."""

    def __init__(self, demoter: Demoter) -> None:
        self.demoter = demoter
        self.histories: dict[str, list[tuple[str, str]]] = {f"c{i}": [] for i in range(CHATS)}
        self.windows: dict[str, list[tuple[float, Window[Any]]]] = {c: [] for c in self.histories}
        self.errors: list[BaseException] = []
        self.up: float | None = None
        self.stop = threading.Event()
        self._threads = [threading.Thread(target=self._chat, args=(cid,)) for cid in self.histories]

    def describe(self, m: tuple[str, str]) -> Any:
        return self.demoter.describe(m[0], m[1])

    def _chat(self, cid: str) -> None:
        history = self.histories[cid]
        while not self.stop.is_set():
            n = len(history) // 2
            history += [("user", f"question {n} in {cid}"), ("assistant", f"answer {n}")]
            try:
                window = self.demoter.load(cid, list(history), self.describe)
            except BaseException as exc:
                self.errors.append(exc)
                return
            self.windows[cid].append((time.monotonic(), window))
            self.stop.wait(0.02)

    def __enter__(self) -> Chats:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(30)

    def caught_up(self) -> float | None:
        """Seconds from the server's return until every conversation was caught up."""
        if self.up is None:
            return None
        times = []
        for windows in self.windows.values():
            done = [at for at, w in windows if at >= self.up and not w.degraded and not w.pending]
            if not done:
                return None
            times.append(done[0] - self.up)
        return max(times)

    def wait_caught_up(self) -> float:
        deadline = time.monotonic() + PATIENCE
        while (took := self.caught_up()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert took is not None, f"not caught up within {PATIENCE} s"
        return took

    def through(self, proxy: TcpProxy, label: str) -> float:
        """Chat while the server is away, give it back, and time the catch-up (checked)."""
        with self:
            time.sleep(DOWN)
            proxy.restore()
            self.up = time.monotonic()
            took = self.wait_caught_up()
        print(f"\n{label}: every conversation caught up {took:.2f} s after the server came back")
        assert self.errors == [], self.errors[:3]
        assert all(len(w.messages) <= LIMIT for ws in self.windows.values() for _, w in ws)
        assert took <= CATCH_UP + 1.0, f"caught up only after {took:.2f} s"  # loose: shared CPU
        return took

    def before_up(self) -> list[Window[Any]]:
        assert self.up is not None
        return [w for ws in self.windows.values() for at, w in ws if at < self.up]

    def lost(self, held: Callable[[str, list[str]], set[str]], finals: dict[str, Any]) -> list[str]:
        missing = []
        for cid, history in self.histories.items():
            keys = [
                make_key(cid, i, self.describe(history[i]).fingerprint)
                for i in range(finals[cid].start)
            ]
            missing += sorted(set(keys) - held(cid, keys))
        return missing


@pytest.fixture(params=["redis", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    request.getfixturevalue(f"{request.param}_url")  # skips, saying why, without it
    return str(request.param)


@pytest.mark.parametrize("how", HOWS)
def test_a_state_store_made_while_its_server_is_down(
    kind: str, how: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(f"{kind}_url")
    began = time.monotonic()
    proxy, store, cleanup = proxied(kind, url, down_first=how)
    made_in = time.monotonic() - began
    try:
        # Built without the server: at most one connection attempt (PostgreSQL's shortest
        # connect timeout is 2 s; Redis' is 0.5 s).
        assert made_in < 3.5, f"making the store took {made_in:.2f} s"
        sink = KeySink()
        demoter = Demoter(POLICY, sink, state=store, hook_threads=CHATS)
        chats = Chats(demoter)
        chats.through(proxy, f"{kind} state store made while {how}")
        down = chats.before_up()
        assert len(down) >= CHATS and all(w.degraded for w in down)
        assert all(any(e.kind == "degraded" for e in w.events) for w in down)
        finals = {
            c: settled(partial(demoter.load, c, h, chats.describe), store)
            for c, h in chats.histories.items()
        }
        assert all(not w.degraded and w.pending == 0 for w in finals.values())
        assert chats.lost(sink.has_keys, finals) == []
        assert sink.twice() == []
        assert store.count() == CHATS  # the states were committed once it answered
        demoter.close()
    finally:
        cleanup()


@pytest.mark.parametrize("how", HOWS)
def test_an_archive_made_while_postgres_is_down(postgres_url: str, how: str, tmp_path: Any) -> None:
    from demote.archive.postgres import PostgresArchive
    from tests.demote.archive.pg import drop_archive

    table = f"boot_{uuid.uuid4().hex[:10]}"
    port = int(postgres_url.rsplit(":", 1)[1].split("/")[0])
    proxy = TcpProxy(port).start()
    fault(proxy, how)
    archive = PostgresArchive(through(postgres_url, proxy), table=table, timeout=0.5)
    state = SQLiteStateStore(tmp_path / "state.db")
    # The hook's retries follow the Demoter's backoff (1 s, doubling, by default); a short
    # one shows the catch-up the archive itself allows.
    demoter = Demoter(POLICY, archive, state=state, retry=Backoff(initial=0.1, maximum=0.4))
    try:
        chats = Chats(demoter)
        chats.through(proxy, f"postgres archive made while {how}")
        down = chats.before_up()
        assert not any(w.degraded for w in down)  # the state store was up
        assert any(w.pending for w in down), "nothing was left pending while it was down"
        finals = {c: demoter.load(c, h, chats.describe) for c, h in chats.histories.items()}
        assert chats.lost(archive.has_keys, finals) == []
        for cid, window in finals.items():  # each message archived once
            assert archive.count(cid) == window.start
    finally:
        demoter.close()
        state.close()
        archive.close()
        proxy.close()
        drop_archive(postgres_url, table)
