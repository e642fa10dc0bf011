"""Does the running agent's checkpointer outlive a restart its demotion state does not?

``DemotingMiddleware`` cannot be handed its agent's checkpointer (``create_agent`` keeps
it), so on its first model call it looks at the saver LangGraph lends the run through its
config, and hands it to :func:`demote.restarts.check_restarts`: a saver other than
``InMemorySaver`` keeps threads across restarts. Each middleware looks once; a run
without a checkpointer, or a LangGraph that lends it under another key, is not checked.
"""

from __future__ import annotations

import weakref
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from demote.engine import Demoter
from demote.restarts import check_restarts

__all__ = ["check_checkpointer"]

#: Where LangGraph lends a run's checkpointer in its config (``configurable``).
_CHECKPOINTER_KEY = "__pregel_checkpointer"

_checked: weakref.WeakSet[Any] = weakref.WeakSet()


def check_checkpointer(middleware: Any, demoter: Demoter) -> None:
    """Warn if the run's checkpointer is durable and the demoter's state is not.

    Looks on ``middleware``'s first model call only; warns once per process (see
    :mod:`demote.restarts`).
    """
    if middleware in _checked:
        return
    _checked.add(middleware)
    from langgraph.config import get_config

    try:
        saver = get_config().get("configurable", {}).get(_CHECKPOINTER_KEY)
    except RuntimeError:  # not inside a run
        return
    if isinstance(saver, BaseCheckpointSaver):
        check_restarts(demoter, saver, durable=not isinstance(saver, InMemorySaver))
