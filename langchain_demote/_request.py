"""One model call of an agent run, windowed: what its preparation yields and returns.

:class:`~langchain_demote.DemotingMiddleware`'s preparation is a generator, shared by
``wrap_model_call`` and ``awrap_model_call`` so each piece of logic is written once for
sync and async, that yields its I/O as operations (:class:`Load` below, and
:mod:`demote.flow`'s), each with a blocking ``run_sync`` and an awaited ``run_async``, run
by the drivers of :mod:`demote.flow`. It returns a :class:`Prepared`: the request to hand
on, the state update to return with the response, the events to report in the run, and
the metadata to put on the model call's run.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from langchain.agents.middleware.types import (
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import BaseMessage
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.types import Command

from demote import flow
from demote.engine import Demoter, Window
from demote.events import DemoteEvent
from demote.records import MessageRecord

__all__ = ["Load", "Preparation", "Prepared", "model_call_metadata", "run_metadata"]


@dataclass(slots=True)
class Load:
    """Load the window (the engine delivers and commits)."""

    demoter: Demoter
    conversation_id: str
    messages: Sequence[BaseMessage]
    describe: Callable[[BaseMessage], MessageRecord]
    reserved: int = 0  # tokens of the system message and tools
    pruned: range = range(0)  # positions pruned from the messages

    def run_sync(self) -> Window[BaseMessage]:
        return self.demoter.load(
            self.conversation_id,
            self.messages,
            self.describe,
            reserved=self.reserved,
            pruned=self.pruned,
        )

    async def run_async(self) -> Window[BaseMessage]:
        return await self.demoter.aload(
            self.conversation_id,
            self.messages,
            self.describe,
            reserved=self.reserved,
            pruned=self.pruned,
        )


@dataclass(frozen=True, slots=True)
class Prepared:
    """The request to send and the state update to return with the response.

    ``request`` is ``origin`` itself when the window is the whole request; otherwise
    ``sent`` is what its list held when it was handed on. ``events`` are what the load
    (and the recall) did, to report in the model node's run; ``metadata`` goes on the
    model call's run.
    """

    request: ModelRequest[Any]
    origin: ModelRequest[Any]
    sent: tuple[BaseMessage, ...]
    update: dict[str, Any] | None
    events: tuple[DemoteEvent, ...] = ()
    metadata: dict[str, Any] | None = None

    def finish(
        self, response: ModelResponse[Any]
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        if self.request is not self.origin:
            self._mirror_appends()
        if self.update is None:
            return response
        return ExtendedModelResponse(model_response=response, command=Command(update=self.update))

    def _mirror_appends(self) -> None:
        """Messages an inner middleware appended to the window, appended to the original."""
        now, n = self.request.messages, len(self.sent)
        target = self.origin.messages
        if len(now) > n and isinstance(target, list) and all(map(operator.is_, now, self.sent)):
            target.extend(now[n:])


@contextlib.contextmanager
def model_call_metadata(metadata: dict[str, Any] | None) -> Iterator[None]:
    """Runs inside have ``metadata`` merged into their ``RunnableConfig["metadata"]``.

    ``create_agent`` invokes the model without a config, so the model call takes the
    model node's config (LangChain's documented inheritance: a runnable invoked inside
    another gets its config, whose ``metadata`` every child run carries). The model's run
    therefore records ``metadata``; outside any run (no config) nothing changes.
    """
    config = var_child_runnable_config.get()
    if config is None or not metadata:
        yield
        return
    merged = {**config, "metadata": {**config.get("metadata", {}), **metadata}}
    token = var_child_runnable_config.set(merged)  # type: ignore[arg-type]
    try:
        yield
    finally:
        var_child_runnable_config.reset(token)


def run_metadata(window: Window[BaseMessage], recalled: int, reserved: int) -> dict[str, Any]:
    """What the model call's run records about the window it was sent."""
    pinned = len(window.pinned)
    opener = window.opener is not None
    return {
        "conversation_id": window.conversation_id,
        "pinned": pinned,
        "window": len(window.messages),
        "cut": window.start - pinned - opener,
        "total": window.total,
        "pending": window.pending,
        "summary": window.summary is not None,
        "recalled": recalled,
        "opener": opener,
        "cleared": len(window.placeholders),
        "clipped": len(window.clipped),
        "overhang": window.overhang,
        "reserved": reserved,
    }


#: The preparation: a :data:`demote.flow.Flow` that returns a :class:`Prepared`.
Preparation = flow.Flow[Prepared]
