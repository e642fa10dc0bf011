"""What ``DemotingMemory`` makes of its options: the demoter, the conversation, its parts.

A memory runs on a :class:`~demote.Demoter`: a shared one (``demoter=``), or a private one
built here from ``policy=``, ``hook=`` and ``state=``. A private window is sized by
``policy=``, else ``token_limit=`` (so that ``memory_cls=DemotingMemory`` works in
``SimpleChatEngine.from_defaults``), else a share of ``llm``'s context window, as
LlamaIndex's ``ChatMemoryBuffer`` sizes its own. ``session_id`` is the name LlamaIndex's
``Memory`` gives the conversation id: it is the ``chat_store_key``.

A private demoter built without ``hook=`` demotes to ``NoopHook``: what leaves the window
stays in the chat store (demote never deletes from it) but reaches no long tail, so nothing
can recall it. That is a legitimate memory (LlamaIndex's ``ChatMemoryBuffer`` trims the
same way), but rarely what someone who reached for demote meant, so it warns
(:class:`~demote.DemoteWarning`, at the caller's line) and says how to choose:
``hook=SQLiteArchive(path)`` for a long tail, ``hook=NoopHook()`` for a window alone.
There is no default long tail: an archive file written where the process happens to run,
unasked, or an in-memory one that grows without bound and is gone at exit (and that no
other worker shares), would each surprise someone.

With ``memory_blocks=`` and no ``demoter=``, the private demoter's hook also feeds the
blocks (:func:`feed_blocks`). The memory's own options, checked, become the
:class:`~llamaindex_demote._rendering.Parts` its reads and writes use
(:func:`memory_parts`, then :func:`with_blocks`).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llama_index.core.llms.llm import LLM
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.memory.types import DEFAULT_CHAT_STORE_KEY
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.storage.chat_store import BaseChatStore
from llama_index.core.storage.chat_store.base_db import AsyncDBChatStore

from demote.engine import Demoter
from demote.errors import ConfigError, DemoteWarning
from demote.hooks.base import Capture, Recall
from demote.hooks.simple import FanOutHook
from demote.state.base import StateStore, validate_conversation_id
from demote.window.policy import SlidingWindow
from llamaindex_demote._block_slots import BlockSettings
from llamaindex_demote._rendering import Parts
from llamaindex_demote.blocks import LLM_WINDOW_RATIO, blocks_hook, feeding_hook
from llamaindex_demote.messages import CallNames, to_core

__all__ = [
    "LLM_WINDOW_RATIO",
    "REFUSED_MEMORY_OPTIONS",
    "build_demoter",
    "check_insert_method",
    "check_options",
    "conversation_key",
    "feed_blocks",
    "memory_parts",
    "refuse_options",
    "tokenizer_of",
    "tokenizer_policy",
    "with_blocks",
]


def build_demoter(
    demoter: Demoter | None,
    policy: SlidingWindow | None,
    hook: object | None,
    state: StateStore | None,
    token_limit: int | None,
    llm: LLM | None,
    *,
    stacklevel: int = 3,
) -> Demoter:
    """The shared ``demoter``, or a private one (see the module docstring).

    ``stacklevel`` points the no-hook warning at the caller of ``from_defaults``.

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
    built = Demoter(policy, hook, state=state)  # (a bad option fails before the warning)
    if hook is None:
        warnings.warn(
            "DemotingMemory.from_defaults without hook= or demoter=: messages that leave the "
            "window stay in the chat store but go to no long tail (nothing can recall "
            "them); pass hook=SQLiteArchive('archive.db') (and recall= the same archive) "
            "to keep them searchable, or hook=NoopHook() if a window alone is meant",
            DemoteWarning,
            stacklevel=stacklevel,
        )
    return built


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


#: ``Memory.from_defaults`` options that ``DemotingMemory.from_defaults`` does not take,
#: and what to use instead (the others carry over: see ``from_defaults``).
#: (``token_flush_size`` carries over as the size of the pieces the memory blocks are fed:
#: the window's own cuts are its policy's.)
REFUSED_MEMORY_OPTIONS = {
    "image_token_size_estimate": (
        "demote counts images as the providers bill them (by size); "
        "pass policy=SlidingWindow.last_tokens(limit, counter=...) to count otherwise"
    ),
    "audio_token_size_estimate": "demote counts audio as the providers bill it",
    "video_token_size_estimate": "demote counts video as the providers bill it",
    "table_name": "an option of Memory's SQL chat store",
    "async_database_uri": "an option of Memory's SQL chat store",
    "async_engine": "an option of Memory's SQL chat store",
    "db_schema": "an option of Memory's SQL chat store",
}

_SQL_STORE = (
    "; DemotingMemory keeps the history in any BaseChatStore (chat_store=, a "
    "SimpleChatStore by default) and what leaves the window in its hook, and survives "
    "restarts with state=SQLiteStateStore(path)"
)


def refuse_options(options: dict[str, object]) -> None:
    """Raise for options ``from_defaults`` does not take, saying what to use instead.

    Raises:
        ConfigError: Always, when ``options`` is not empty: a ``Memory`` option is named
            with its replacement, any other as unexpected.
    """
    if not options:
        return
    for name in sorted(options):
        why = REFUSED_MEMORY_OPTIONS.get(name)
        if why is not None:
            tail = _SQL_STORE if why.startswith("an option of") else ""
            raise ConfigError(f"DemotingMemory.from_defaults: {name}: {why}{tail}")
    raise ConfigError(f"DemotingMemory.from_defaults: unexpected options {sorted(options)}")


def check_options(options: dict[str, object], insert_method: object, chat_store: object) -> None:
    """Refuse what ``from_defaults`` does not take: other options, ``Memory``'s SQL store.

    Raises:
        ConfigError: See :func:`refuse_options` and :func:`check_insert_method`; or
            ``chat_store`` is ``Memory``'s SQL store (an ``AsyncDBChatStore``).
    """
    refuse_options(options)
    check_insert_method(insert_method)
    if isinstance(chat_store, AsyncDBChatStore):
        raise ConfigError(
            f"chat_store: {type(chat_store).__name__} is Memory's SQL store, whose "
            "archived rows are its own long tail; give DemotingMemory any BaseChatStore "
            "(SimpleChatStore by default) for the history, and hook= for what leaves "
            "the window"
        )


def tokenizer_policy(
    tokenizer_fn: object, token_limit: int | None, policy: object, demoter: object
) -> SlidingWindow:
    """The private window ``Memory``'s ``tokenizer_fn`` counts: ``token_limit`` tokens of it.

    Raises:
        ConfigError: ``tokenizer_fn`` is not callable, or comes with ``policy=`` or
            ``demoter=`` (whose counter counts), or without ``token_limit=``.
    """
    if not callable(tokenizer_fn):
        raise ConfigError(
            f"tokenizer_fn: expected a callable str -> list, got {tokenizer_fn!r:.80}"
        )
    if policy is not None or demoter is not None:
        raise ConfigError(
            "tokenizer_fn: counts the window made from token_limit=; with policy= or "
            "demoter=, give the policy counter=lambda text: len(tokenizer_fn(text))"
        )
    if token_limit is None:
        raise ConfigError("tokenizer_fn: give token_limit=, the window it counts")
    fn = tokenizer_fn
    return SlidingWindow.last_tokens(token_limit, counter=lambda text: len(fn(text)))


def tokenizer_of(policy: SlidingWindow) -> Callable[[str], Sequence[int]]:
    """``DemotingMemory.tokenizer_fn``: ``policy``'s counter, as one item per token."""
    counter = policy.resolved_counter()

    def tokenize(text: str) -> Sequence[int]:
        return range(counter(text))

    return tokenize


def check_insert_method(insert_method: object) -> None:
    """Accept ``Memory``'s ``insert_method="user"``; refuse ``"system"``, saying why.

    Raises:
        ConfigError: ``insert_method`` is ``"system"`` or not an insert method.
    """
    value = getattr(insert_method, "value", insert_method)
    if value == "user":
        return
    if value == "system":
        raise ConfigError(
            "insert_method='system': demote never changes the system block; with the blocks "
            "in the system message, the system prompt would change whenever a block does "
            "(a vector block: every question) and the provider's prompt cache would be "
            "written again from its first token at every such turn; the memory blocks are "
            "sent as user messages placed by when they change: use insert_method='user' "
            "(the default)"
        )
    raise ConfigError(f"insert_method: must be 'user' (or 'system', refused), got {value!r:.40}")


def feed_blocks(
    memory_blocks: Sequence[BaseMemoryBlock[Any]] | None,
    token_flush_size: int | None,
    demoter: Demoter | None,
    hook: object | None,
    policy: SlidingWindow | None,
    token_limit: int | None,
    llm: LLM | None,
) -> tuple[object | None, Sequence[BaseMemoryBlock[Any]] | None]:
    """A private demoter's ``hook`` with the feed of ``memory_blocks``, and the blocks fed.

    Raises:
        ConfigError: ``token_flush_size`` without blocks the memory feeds itself.
    """
    if memory_blocks and demoter is None:
        feed = blocks_hook(memory_blocks, token_flush_size, policy, token_limit, llm)
        hook = feed if hook is None else FanOutHook(hook, feed)
        memory_blocks = feed.blocks
    elif token_flush_size is not None:
        raise ConfigError(
            "token_flush_size: sizes the pieces a memory made here feeds its memory "
            "blocks; with demoter= give its MemoryBlocksHook(blocks, flush_tokens=...)"
            if memory_blocks
            else "token_flush_size: sizes the pieces the memory blocks are fed; give "
            "memory_blocks= (the window's own cuts are its policy's)"
        )
    return hook, memory_blocks


def memory_parts(
    demoter: Demoter,
    chat_store: BaseChatStore | None,
    recall: Recall | None,
    recall_k: int,
    capture: Capture | None,
    recall_budget_tokens: int | None,
    recall_role: str,
) -> Parts:
    """The parts a ``DemotingMemory`` made with these options uses (``DemotingMemory._p``).

    Its memory blocks are added by :func:`with_blocks`.

    Raises:
        ConfigError: An option is invalid.
    """
    if not isinstance(demoter, Demoter):
        raise ConfigError(f"demoter: expected a Demoter, got {type(demoter).__name__}")
    if capture is not None and not callable(getattr(capture, "capture", None)):
        raise ConfigError(f"capture: {capture!r} has no capture(turn)")
    if chat_store is not None and not isinstance(chat_store, BaseChatStore):
        raise ConfigError(f"chat_store: expected a BaseChatStore, got {chat_store!r:.80}")
    describe = functools.partial(to_core, describe=demoter.describe, names=CallNames())
    return Parts(demoter, describe, recall, recall_k, capture, recall_budget_tokens, recall_role)


def with_blocks(
    parts: Parts,
    memory_blocks: Sequence[BaseMemoryBlock[Any]] | None,
    memory_blocks_template: BasePromptTemplate | str | None,
    chat_history_token_ratio: float | None,
    block_changes: Mapping[str, str] | None,
) -> Parts:
    """``parts`` with the settings of a memory's block options (as they are without blocks).

    Raises:
        ConfigError: A block option is invalid, or the demoter's hook does not feed the
            blocks.
    """
    demoter = parts.demoter
    blocks = BlockSettings.make(
        memory_blocks,
        demoter.policy,
        ratio=chat_history_token_ratio,
        template=memory_blocks_template,
        declared=block_changes,
        recall_reserve=parts.reserve(),
    )
    if blocks is not None:
        if feeding_hook(demoter.hook, blocks.blocks) is None:
            raise ConfigError(
                "memory_blocks: the demoter's hook does not feed these blocks; build it "
                "with hook=MemoryBlocksHook(blocks) (or FanOutHook(archive, "
                "MemoryBlocksHook(blocks))), or leave demoter= out and from_defaults "
                "makes one"
            )
        parts = dataclasses.replace(parts, blocks=blocks)
    return parts
