"""Demotion events as LangChain custom callback events, inside the run that caused them.

Each :class:`~demote.events.DemoteEvent` a load (or a recall) produces is dispatched with
:func:`langchain_core.callbacks.dispatch_custom_event` (``adispatch_custom_event`` on
async paths) under the name ``"demote." + event.kind`` (``"demote.demoted"``,
``"demote.delivered"``, ``"demote.delivery_failed"``, ``"demote.resynced"``,
``"demote.recalled"``, ...), with ``event.to_dict()`` as its data. Any callback handler's
``on_custom_event`` receives them with the ``run_id`` of the run that read the window
(``RunnableWithMessageHistory``'s history step, an agent's model node, a retriever's run),
and tracers (LangSmith, Langfuse) show them there; ``astream_events`` yields them as
``on_custom_event``.

A read outside any run (a plain ``history.messages``) has no run to report to: the events
are then not dispatched (``dispatch_custom_event`` would raise), and still reach the
Demoter's observers. Checking for a run costs a context-variable read, so a history used
outside LangChain pays nothing for this.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.callbacks import (
    BaseCallbackManager,
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.runnables.config import RunnableConfig, var_child_runnable_config

from demote.errors import ArgumentTypeError
from demote.events import DemoteEvent

__all__ = ["EVENT_PREFIX", "adispatch_events", "dispatch_events", "event_name"]

#: What the name of every custom event demote dispatches begins with.
EVENT_PREFIX = "demote."


def event_name(event: DemoteEvent) -> str:
    """The custom event's name: ``"demote."`` followed by the event's kind."""
    return EVENT_PREFIX + event.kind


def _check(events: object) -> bool:
    """Are there events to dispatch? :class:`~demote.errors.ArgumentTypeError` for non-events."""
    if isinstance(events, list | tuple) and all(isinstance(e, DemoteEvent) for e in events):
        return bool(events)
    raise ArgumentTypeError(f"events: must be a sequence of DemoteEvent, got {events!r:.60}")


def _in_run(config: RunnableConfig | None) -> bool:
    """Is there a run to report to (what ``dispatch_custom_event`` needs)?"""
    if config is None:
        config = var_child_runnable_config.get()
        if config is None:
            return False
    elif not isinstance(config, dict):
        raise ArgumentTypeError(f"config: must be a RunnableConfig (a dict), got {config!r:.60}")
    callbacks = config.get("callbacks")
    return isinstance(callbacks, BaseCallbackManager) and callbacks.parent_run_id is not None


def dispatch_events(events: Sequence[DemoteEvent], *, config: RunnableConfig | None = None) -> bool:
    """Dispatch ``events`` as custom events in the current run (or ``config``'s).

    Args:
        events: The events, in order.
        config: The run's config; by default the one of the runnable being executed.

    Returns:
        ``True`` if there was a run to dispatch them in (then every handler got them).
    """
    some = _check(events)
    if not _in_run(config) or not some:
        return False
    for event in events:
        dispatch_custom_event(event_name(event), event.to_dict(), config=config)
    return True


async def adispatch_events(
    events: Sequence[DemoteEvent], *, config: RunnableConfig | None = None
) -> bool:
    """Async :func:`dispatch_events`: async handlers are awaited."""
    some = _check(events)
    if not _in_run(config) or not some:
        return False
    for event in events:
        await adispatch_custom_event(event_name(event), event.to_dict(), config=config)
    return True
