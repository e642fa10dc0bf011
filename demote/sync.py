"""Running a coroutine to completion from sync code, with or without a running loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["run_sync"]

T = TypeVar("T")


def run_sync(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to completion and return its result.

    In a thread without an event loop this is ``asyncio.run``; inside a running loop (a
    sync API called from async code) it runs on a fresh loop in a helper thread, so the
    caller's loop is never re-entered.
    """

    async def main() -> T:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:  # handed to the calling thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="demote-run-sync", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]
