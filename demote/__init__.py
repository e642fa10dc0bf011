"""demote: a bounded active window, with what falls out demoted exactly once.

The shared, framework-free core. Adapters live in ``langchain_demote`` and
``llamaindex_demote``; nothing here imports LangChain, LlamaIndex or mem0.
"""

from demote.engine import Demoter, Window
from demote.errors import (
    ConfigError,
    ConversationIdError,
    DemoteError,
    HookError,
    HookTimeout,
    MissingExtraError,
    StoreError,
    SummarizerError,
    TranscriptError,
)
from demote.hooks.simple import CallbackHook, FanOutHook, NoopHook
from demote.planner import Plan, plan
from demote.policy import Bulk, Compact, PerItem, SlidingWindow
from demote.records import (
    CapturedTurn,
    ConversationState,
    DemotedMessage,
    Demotion,
    MessageRecord,
    Recalled,
)
from demote.state import InMemoryStateStore, SQLiteStateStore, StateStore

__all__ = [
    "Bulk",
    "CallbackHook",
    "CapturedTurn",
    "Compact",
    "ConfigError",
    "ConversationIdError",
    "ConversationState",
    "DemoteError",
    "DemotedMessage",
    "Demoter",
    "Demotion",
    "FanOutHook",
    "HookError",
    "HookTimeout",
    "InMemoryStateStore",
    "MessageRecord",
    "MissingExtraError",
    "NoopHook",
    "PerItem",
    "Plan",
    "Recalled",
    "SQLiteStateStore",
    "SlidingWindow",
    "StateStore",
    "StoreError",
    "SummarizerError",
    "TranscriptError",
    "Window",
    "plan",
]
