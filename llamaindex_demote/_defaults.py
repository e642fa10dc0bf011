"""What ``DemotingMemory.from_defaults`` makes of its options: the demoter, the conversation.

A memory runs on a :class:`~demote.Demoter`: a shared one (``demoter=``), or a private one
built here from ``policy=``, ``hook=`` and ``state=``. A private window is sized by
``policy=``, else ``token_limit=`` (so that ``memory_cls=DemotingMemory`` works in
``SimpleChatEngine.from_defaults``), else a share of ``llm``'s context window, as
LlamaIndex's ``ChatMemoryBuffer`` sizes its own. ``session_id`` is the name LlamaIndex's
``Memory`` gives the conversation id: it is the ``chat_store_key``.
"""

from __future__ import annotations

from llama_index.core.llms.llm import LLM
from llama_index.core.memory.types import DEFAULT_CHAT_STORE_KEY

from demote.engine import Demoter
from demote.errors import ConfigError
from demote.state.base import StateStore, validate_conversation_id
from demote.window.policy import SlidingWindow

__all__ = ["LLM_WINDOW_RATIO", "build_demoter", "conversation_key"]

#: Share of an LLM's context window used for the window when only ``llm=`` sizes it
#: (what LlamaIndex's ``ChatMemoryBuffer`` uses).
LLM_WINDOW_RATIO = 0.75


def build_demoter(
    demoter: Demoter | None,
    policy: SlidingWindow | None,
    hook: object | None,
    state: StateStore | None,
    token_limit: int | None,
    llm: LLM | None,
) -> Demoter:
    """The shared ``demoter``, or a private one (see the module docstring).

    Raises:
        ConfigError: Both a demoter and parts of one, or nothing sizes the window.
    """
    if demoter is not None:
        if policy is not None or hook is not None or state is not None:
            raise ConfigError("give either demoter= or policy=/hook=/state=, not both")
        if not isinstance(demoter, Demoter):
            raise ConfigError(f"demoter: expected a Demoter, got {type(demoter).__name__}")
        return demoter
    if policy is None:
        if token_limit is None and llm is not None:
            token_limit = int(llm.metadata.context_window * LLM_WINDOW_RATIO)
        if token_limit is None:
            raise ConfigError("give demoter=, policy= or token_limit= to size the window")
        policy = SlidingWindow.last_tokens(token_limit)
    return Demoter(policy, hook, state=state)


def conversation_key(chat_store_key: str, session_id: str | None) -> str:
    """The conversation id: ``session_id`` when given, else ``chat_store_key``.

    Raises:
        ConfigError: The two name different conversations, or ``session_id`` is unusable.
    """
    if session_id is None:
        return chat_store_key
    validate_conversation_id(session_id, "session_id")
    if chat_store_key not in (DEFAULT_CHAT_STORE_KEY, session_id):
        raise ConfigError(
            f"session_id={session_id!r} and chat_store_key={chat_store_key!r} name "
            "two conversations; give one of them"
        )
    return session_id
