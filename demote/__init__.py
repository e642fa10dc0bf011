"""demote: a bounded active window, with what falls out demoted exactly once.

The shared, framework-free core. Adapters live in ``langchain_demote`` and
``llamaindex_demote``; nothing here imports LangChain, LlamaIndex or mem0. The ``demote``
command and the tools it is built from (transcript replay, prompt-cache pricing) live in
:mod:`demote.cli`.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from demote.archive.options import ArchiveOptions
from demote.archive.postgres import PostgresArchive
from demote.archive.sqlite import SQLiteArchive
from demote.capture import AsyncRecorder, Recorder, SQLiteOutbox
from demote.engine.demoter import Demoter
from demote.engine.result import Window
from demote.engine.retry import Backoff
from demote.errors import (
    ArgumentTypeError,
    ConfigError,
    ConversationIdError,
    DemoteError,
    DemoteWarning,
    EmbeddingError,
    EmbeddingModelChanged,
    FencedOut,
    HookBusy,
    HookError,
    HookTimeout,
    MessageTypeError,
    MissingExtraError,
    StoreError,
    StoreUnavailable,
    SummarizerError,
    TranscriptError,
)
from demote.events import ConversationStats, DemoteEvent, DemoterStats
from demote.hooks.simple import CallbackHook, FanOutHook, NoopHook
from demote.records import (
    CapturedTurn,
    ConversationState,
    DemotedMessage,
    Demotion,
    MessageRecord,
    Recalled,
)
from demote.restarts import check_restarts
from demote.state import (
    AsyncStateStore,
    InMemoryStateStore,
    Lease,
    LeasingStateStore,
    PostgresStateStore,
    RedisStateStore,
    SQLiteStateStore,
    StateStore,
)
from demote.summarize import ModelSummarizer, TemplateSummarizer
from demote.window.planner import Plan, plan
from demote.window.policy import (
    Bulk,
    ClearToolResults,
    Compact,
    LowWater,
    PerItem,
    SlidingWindow,
)

__all__ = [
    "ArchiveOptions",
    "ArgumentTypeError",
    "AsyncRecorder",
    "AsyncStateStore",
    "Backoff",
    "Bulk",
    "CallbackHook",
    "CapturedTurn",
    "ClearToolResults",
    "Compact",
    "ConfigError",
    "ConversationIdError",
    "ConversationState",
    "ConversationStats",
    "DemoteError",
    "DemoteEvent",
    "DemoteWarning",
    "DemotedMessage",
    "Demoter",
    "DemoterStats",
    "Demotion",
    "EmbeddingError",
    "EmbeddingModelChanged",
    "FanOutHook",
    "FencedOut",
    "HookBusy",
    "HookError",
    "HookTimeout",
    "InMemoryStateStore",
    "Lease",
    "LeasingStateStore",
    "LowWater",
    "MessageRecord",
    "MessageTypeError",
    "MissingExtraError",
    "ModelSummarizer",
    "NoopHook",
    "PerItem",
    "Plan",
    "PostgresArchive",
    "PostgresStateStore",
    "Recalled",
    "Recorder",
    "RedisStateStore",
    "SQLiteArchive",
    "SQLiteOutbox",
    "SQLiteStateStore",
    "SlidingWindow",
    "StateStore",
    "StoreError",
    "StoreUnavailable",
    "SummarizerError",
    "TemplateSummarizer",
    "TranscriptError",
    "Window",
    "check_restarts",
    "plan",
]

try:
    #: The installed distribution's version (``demote --version`` prints it).
    __version__: str = _version("demote")
except _PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"
