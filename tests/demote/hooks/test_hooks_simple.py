"""Small built-in hooks: CallbackHook, FanOutHook, NoopHook."""

from __future__ import annotations

import asyncio
import threading

import pytest

from demote import (
    Backoff,
    CallbackHook,
    ConfigError,
    DemotedMessage,
    Demoter,
    Demotion,
    FanOutHook,
    NoopHook,
    SlidingWindow,
)
from demote.hooks.base import AsyncHook, SyncHook
from demote.hooks.simple import deliver_async, deliver_sync
from tests.strategies import Msg, describer, unique

BATCH = Demotion(
    "c", (DemotedMessage("user", "hi", 0, "k0"), DemotedMessage("assistant", "yo", 1, "k1"))
)


def chat(n: int) -> list[Msg]:
    return unique([Msg("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(n)])


# -- CallbackHook ---------------------------------------------------------------------------


def test_callback_sync_fn_from_sync_and_async_loads() -> None:
    got: list[tuple[int, threading.Thread]] = []
    hook = CallbackHook(lambda b: got.append((len(b), threading.current_thread())))
    inline = Demoter(SlidingWindow.last_messages(2), hook, hook_timeout=None, hook_wait=None)
    inline.load("a", chat(6), describer(inline))
    assert got == [(4, threading.current_thread())], (
        "no bound and no wait: called in the caller's thread"
    )
    got.clear()
    d = Demoter(SlidingWindow.last_messages(2), hook)  # a timeout: on an engine thread
    d.load("a", chat(6), describer(d))
    assert got[0][0] == 4 and got[0][1].name == "demote-hook"
    got.clear()

    async def main() -> None:
        await d.aload("b", chat(6), describer(d))

    asyncio.run(main())
    assert len(got) == 1 and got[0][0] == 4
    assert got[0][1].name == "demote-hook", "a sync fn runs off the loop, on an engine thread"


def test_callback_async_fn_from_sync_and_async_loads() -> None:
    got: list[str] = []

    async def fn(batch: Demotion) -> None:
        await asyncio.sleep(0)
        got.append(batch.conversation_id)

    hook = CallbackHook(fn)
    d = Demoter(SlidingWindow.last_messages(2), hook)
    d.load("a", chat(6), describer(d))
    asyncio.run(d.aload("b", chat(6), describer(d)))
    assert got == ["a", "b"]


async def test_callback_async_fn_from_sync_deliver_inside_a_running_loop() -> None:
    got: list[int] = []

    async def fn(batch: Demotion) -> None:
        got.append(len(batch))

    CallbackHook(fn).deliver(BATCH)
    await CallbackHook(fn).adeliver(BATCH)
    assert got == [2, 2]


def test_callback_async_callable_object() -> None:
    class Fn:
        def __init__(self) -> None:
            self.n = 0

        async def __call__(self, batch: Demotion) -> None:
            self.n += len(batch)

    fn = Fn()
    hook = CallbackHook(fn)
    hook.deliver(BATCH)
    asyncio.run(hook.adeliver(BATCH))
    assert fn.n == 4


def test_callback_failure_propagates() -> None:
    def boom(batch: Demotion) -> None:
        raise RuntimeError("nope")

    with pytest.raises(RuntimeError, match="nope"):
        CallbackHook(boom).deliver(BATCH)
    with pytest.raises(RuntimeError, match="nope"):
        asyncio.run(CallbackHook(boom).adeliver(BATCH))


def test_callback_needs_a_callable() -> None:
    with pytest.raises(ConfigError, match="fn"):
        CallbackHook("not callable")  # type: ignore[arg-type]


# -- FanOutHook -----------------------------------------------------------------------------


class Rec:
    def __init__(
        self, name: str, log: list[str], *, fail: bool = False, held: set[str] | None = None
    ):
        self.name, self.log, self.fail = name, log, fail
        if held is not None:
            self.held = held
            self.has_keys = lambda cid, keys: {k for k in keys if k in self.held}

    def deliver(self, batch: Demotion) -> None:
        self.log.append(self.name)
        if self.fail:
            raise RuntimeError(self.name)


class AsyncRec:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    async def adeliver(self, batch: Demotion) -> None:
        self.log.append(self.name)


def test_fan_out_delivers_in_order_sync_and_async() -> None:
    log: list[str] = []
    hook = FanOutHook(Rec("a", log), AsyncRec("b", log), Rec("c", log))
    hook.deliver(BATCH)
    assert log == ["a", "b", "c"]
    log.clear()
    asyncio.run(hook.adeliver(BATCH))
    assert log == ["a", "b", "c"]


def test_fan_out_failure_stops_and_propagates() -> None:
    log: list[str] = []
    hook = FanOutHook(Rec("a", log), Rec("b", log, fail=True), Rec("c", log))
    with pytest.raises(RuntimeError, match="b"):
        hook.deliver(BATCH)
    assert log == ["a", "b"]
    log.clear()
    with pytest.raises(RuntimeError, match="b"):
        asyncio.run(hook.adeliver(BATCH))
    assert log == ["a", "b"]


def test_fan_out_failure_keeps_the_watermark_through_the_engine() -> None:
    log: list[str] = []
    failing = Rec("b", log, fail=True)
    d = Demoter(
        SlidingWindow.last_messages(2), FanOutHook(Rec("a", log), failing), retry=Backoff(0, 0)
    )
    msgs = chat(6)
    w = d.load("c", msgs, describer(d))
    assert (w.start, w.pending, w.delivered) == (4, 4, 0)
    failing.fail = False
    assert d.load("c", msgs, describer(d)).demoted == 4
    assert log == ["a", "b", "a", "b"], "the hooks before the failure see the batch again"


def test_fan_out_has_keys_is_the_intersection() -> None:
    log: list[str] = []
    hook = FanOutHook(Rec("a", log, held={"k0", "k1"}), Rec("b", log, held={"k1", "k2"}))
    assert hook.has_keys("c", ["k0", "k1", "k2", "k3"]) == {"k1"}
    blind = FanOutHook(Rec("a", log, held={"k0"}), Rec("b", log))
    assert blind.has_keys("c", ["k0"]) == set(), "a hook that cannot tell makes it unknown"


def test_fan_out_config_errors() -> None:
    with pytest.raises(ConfigError):
        FanOutHook()
    with pytest.raises(ConfigError, match="hook"):
        FanOutHook(NoopHook(), object())


# -- NoopHook and the protocols -------------------------------------------------------------


def test_noop_hook() -> None:
    hook = NoopHook()
    assert hook.deliver(BATCH) is None
    assert asyncio.run(hook.adeliver(BATCH)) is None
    assert isinstance(hook, SyncHook) and isinstance(hook, AsyncHook)
    d = Demoter(SlidingWindow.last_messages(2))
    assert isinstance(d.hook, NoopHook)
    assert d.load("c", chat(6), describer(d)).demoted == 4


def test_deliver_helpers_reject_objects_without_deliver() -> None:
    with pytest.raises(ConfigError):
        deliver_sync(object(), BATCH)
    with pytest.raises(ConfigError):
        asyncio.run(deliver_async(object(), BATCH))


# -- a plain function is a hook -------------------------------------------------------------


def test_a_plain_function_is_a_hook_called_once_per_batch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = Demoter(SlidingWindow.last_messages(2), print)
    msgs = [Msg("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(6)]
    w = d.load("user-42", msgs, describer(d))
    assert (w.demoted, w.pending) == (4, 0)
    assert isinstance(d.hook, CallbackHook) and d.hook.fn is print
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "Demotion of 'user-42': 4 messages (positions 0-3)",
        "  [0] user: m0",
        "  [1] assistant: m1",
        "  [2] user: m2",
        "  [3] assistant: m3",
    ], "print shows each batch, one line per message"


def test_a_plain_function_gets_the_batch_with_its_keys_and_a_failure_refuses_all_of_it() -> None:
    got: list[Demotion] = []
    fail = [True]

    def keep(batch: Demotion) -> None:
        if fail[0]:
            raise RuntimeError("sink down")
        got.append(batch)

    d = Demoter(SlidingWindow.last_messages(2), keep, retry=Backoff(0, 0))
    msgs = chat(6)
    w = d.load("c", msgs, describer(d))
    assert (w.demoted, w.pending) == (0, 4), "a raising function refuses the whole batch"
    fail[0] = False
    w = d.load("c", msgs, describer(d))
    assert (w.demoted, w.pending) == (4, 0)
    (batch,) = got
    assert [m.index for m in batch.messages] == [0, 1, 2, 3]
    assert len({m.key for m in batch.messages}) == 4, "each message carries its dedup key"
    d.load("c", msgs, describer(d))
    assert len(got) == 1, "once within a process"


def test_an_async_function_is_a_hook_for_sync_and_async_loads() -> None:
    got: list[tuple[str, int]] = []

    async def keep(batch: Demotion) -> None:
        await asyncio.sleep(0)
        got.append((batch.conversation_id, len(batch)))

    d = Demoter(SlidingWindow.last_messages(2), keep)
    assert d.hook.native_async  # type: ignore[attr-defined]
    d.load("a", chat(6), describer(d))
    asyncio.run(d.aload("b", chat(6), describer(d)))
    assert got == [("a", 4), ("b", 4)]


def test_fan_out_takes_plain_functions_too() -> None:
    log: list[str] = []
    hook = FanOutHook(lambda b: log.append(f"first {len(b)}"), Rec("second", log))
    hook.deliver(BATCH)
    assert log == ["first 2", "second"]
    assert isinstance(hook.parts()[0], CallbackHook)


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        (42, "hook: 42 is neither a hook"),
        ("archive.db", "hook: 'archive.db' is neither a hook"),
        (CallbackHook, "hook: got the class CallbackHook, not an instance"),
        (NoopHook, "hook: got the class NoopHook, not an instance"),
    ],
)
def test_what_is_not_a_hook_is_a_config_error_naming_it(hook: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Demoter(SlidingWindow.last_messages(2), hook)
    with pytest.raises(ConfigError, match=message):
        FanOutHook(NoopHook(), hook)
