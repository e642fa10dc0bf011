"""demote: a bounded active window, with what falls out demoted exactly once.

The shared, framework-free core. Adapters live in ``langchain_demote`` and
``llamaindex_demote``; nothing here imports LangChain, LlamaIndex or mem0.
"""

from demote.capture import AsyncRecorder, Recorder, SQLiteOutbox
from demote.engine import Demoter, Window
from demote.errors import (
    ConfigError,
    ConversationIdError,
    DemoteError,
    EmbeddingError,
    EmbeddingModelChanged,
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
from demote.state import (
    InMemoryStateStore,
    PostgresStateStore,
    RedisStateStore,
    SQLiteStateStore,
    StateStore,
)
from demote.summarize import ModelSummarizer, TemplateSummarizer

__all__ = [
    "AsyncRecorder",
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
    "EmbeddingError",
    "EmbeddingModelChanged",
    "FanOutHook",
    "HookError",
    "HookTimeout",
    "InMemoryStateStore",
    "MessageRecord",
    "MissingExtraError",
    "ModelSummarizer",
    "NoopHook",
    "PerItem",
    "Plan",
    "PostgresStateStore",
    "Recalled",
    "Recorder",
    "RedisStateStore",
    "SQLiteOutbox",
    "SQLiteStateStore",
    "SlidingWindow",
    "StateStore",
    "StoreError",
    "SummarizerError",
    "TemplateSummarizer",
    "TranscriptError",
    "Window",
    "plan",
]
