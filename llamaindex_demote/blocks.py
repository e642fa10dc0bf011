"""LlamaIndex memory blocks as demote's long tail: :class:`MemoryBlocksHook`.

Theory of operation
-------------------
LlamaIndex's ``Memory`` keeps a FIFO queue of messages; when it grows past its share of
the token limit, the oldest are flushed and handed to every memory block
(``block.aput(messages, from_short_term_memory=True, session_id=...)``), and each read
renders the blocks' content (``block.aget(messages, session_id=...)``) into the request.
With ``DemotingMemory`` the engine decides what leaves the window, and hands each
demoted message to its hook exactly once, in order, off the request path; so the blocks
are fed by a hook, :class:`MemoryBlocksHook`, and never by the memory's reads:

- **each batch once, in order.** The engine delivers one conversation's batches one
  at a time, in order; the hook gives every block the whole batch in one ``aput`` (all
  blocks at once, as ``Memory`` does), as fresh ``ChatMessage`` objects rebuilt from
  the messages' JSON form (``aput`` writes ``session_id`` into the messages it is
  given: the chat store's own objects are never handed over). A block that fails makes
  the batch fail, so the engine keeps it pending and offers it again with backoff; the
  blocks that took it are not given it again (the hook remembers which took which
  message until the batch goes through). Across restarts the engine re-delivers only
  what it never committed: with a durable state store (``SQLiteStateStore``, ...) a
  batch reaches a block again only if the process died between the block's ``aput``
  and the commit.
- **in ``Memory``'s pieces.** ``Memory`` flushes about ``token_flush_size`` tokens at a
  time, and a ``VectorMemoryBlock`` stores one node per flush; demote's cuts are larger
  (a token window is cut well below its limit at once, to keep prompt caches warm), so
  the hook hands the blocks each batch in pieces of about ``flush_tokens`` tokens,
  whole turns each (:func:`pieces`).
- **what changes when.** :func:`changes_of` says when a block's content changes,
  which decides where a read places it (see :mod:`llamaindex_demote._block_slots`):
  a ``StaticMemoryBlock`` never changes, a ``FactExtractionMemoryBlock`` changes when
  it is fed, a ``VectorMemoryBlock`` (and, unless declared otherwise, a block of your
  own) answers each question.
- **erase.** Each block is a tier of the hook (:meth:`MemoryBlocksHook.parts`), so
  ``DemotingMemory.erase`` and ``Demoter.erase`` reach them: a ``StaticMemoryBlock``
  holds nothing of a conversation (erased, 0 removed); a ``FactExtractionMemoryBlock``
  cannot tell whose a fact is, so it forgets all its facts (one block per conversation,
  as ``Memory`` has, forgets exactly that conversation); a ``VectorMemoryBlock``
  deletes the nodes its vector store holds with the conversation's ``session_id``
  (through the store's ``delete_nodes``; a store that cannot delete by metadata reports
  the tier failed); a block of your own is asked through ``erase(conversation_id, *,
  fence=None, keys=None)`` (or ``aerase``), like any demote tier, and is reported
  ``unsupported`` without one.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.llms.llm import LLM
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.memory.memory_blocks import (
    FactExtractionMemoryBlock,
    StaticMemoryBlock,
    VectorMemoryBlock,
)
from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

from demote.errors import ConfigError
from demote.flow import run_sync
from demote.kit import count
from demote.records import DemotedMessage, Demotion
from demote.window.policy import SlidingWindow
from demote.window.tokens import approximate_tokens
from llamaindex_demote.messages import from_core, from_data

__all__ = [
    "BLOCK_CHANGES",
    "BlockChanges",
    "MemoryBlocksHook",
    "blocks_hooks",
    "changes_of",
    "check_blocks",
    "FLUSH_SHARE",
    "blocks_hook",
    "feeding_hook",
    "pieces",
]

#: When a block's content changes: ``never`` (a ``StaticMemoryBlock``), ``when_fed`` (a
#: ``FactExtractionMemoryBlock``: when demoted messages reach it) or ``per_question`` (a
#: ``VectorMemoryBlock``: it answers what is asked).
BlockChanges = Literal["never", "when_fed", "per_question"]
BLOCK_CHANGES: tuple[BlockChanges, ...] = ("never", "when_fed", "per_question")

_KNOWN: tuple[tuple[type[BaseMemoryBlock[Any]], BlockChanges], ...] = (
    (StaticMemoryBlock, "never"),
    (FactExtractionMemoryBlock, "when_fed"),
    (VectorMemoryBlock, "per_question"),
)


def changes_of(block: BaseMemoryBlock[Any], declared: Mapping[str, str] | None = None) -> str:
    """When ``block``'s content changes (:data:`BlockChanges`).

    A kind LlamaIndex ships is known by its class, unless a subclass reads its content
    its own way (overrides ``_aget``); any other block answers per question (the only
    safe guess: its content may depend on what is asked), unless ``declared`` (the
    memory's ``block_changes``) names it.
    """
    if declared and block.name in declared:
        return declared[block.name]
    for kind, changes in _KNOWN:
        if isinstance(block, kind) and type(block)._aget is kind._aget:
            return changes
    return "per_question"


def check_blocks(blocks: object, declared: object = None) -> tuple[BaseMemoryBlock[Any], ...]:
    """``blocks`` as a tuple, checked as ``Memory`` checks them (and ``declared`` against them).

    Raises:
        ConfigError: ``blocks`` is not a list of ``BaseMemoryBlock`` with unique names,
            or ``declared`` (``block_changes``) is not a mapping of their names to
            :data:`BlockChanges`.
    """
    if not isinstance(blocks, list | tuple):
        raise ConfigError(f"memory_blocks: expected a list of memory blocks, got {blocks!r:.80}")
    for i, block in enumerate(blocks):
        if not isinstance(block, BaseMemoryBlock):
            raise ConfigError(
                f"memory_blocks[{i}]: expected a llama_index BaseMemoryBlock, got {block!r:.80}"
            )
    names = [b.name for b in blocks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"memory_blocks: every block needs a name of its own; twice: {twice}")
    if declared is not None:
        if not isinstance(declared, Mapping):
            raise ConfigError(f"block_changes: expected a mapping, got {declared!r:.80}")
        for name, changes in declared.items():
            if name not in names:
                raise ConfigError(f"block_changes: no memory block is named {name!r}")
            if changes not in BLOCK_CHANGES:
                raise ConfigError(
                    f"block_changes[{name!r}]: must be one of {list(BLOCK_CHANGES)}, "
                    f"got {changes!r:.40}"
                )
    return tuple(blocks)


def _messages(messages: Sequence[DemotedMessage]) -> list[ChatMessage]:
    """Fresh ``ChatMessage`` copies of demoted messages (their JSON form, else their text).

    Each block gets copies of its own: ``aput`` writes into the messages it is given.
    """
    return [
        from_data(m.data) if m.data is not None else from_core(m.role, m.text) for m in messages
    ]


def pieces(
    messages: Sequence[DemotedMessage], flush_tokens: int | None, counter: Callable[[str], int]
) -> list[list[DemotedMessage]]:
    """``messages`` in the pieces ``Memory`` would flush them in: about ``flush_tokens`` each.

    A piece closes once it holds ``flush_tokens`` tokens, at the next user message (a turn
    stays whole); ``None`` gives one piece.
    """
    if flush_tokens is None:
        return [list(messages)] if messages else []
    out: list[list[DemotedMessage]] = []
    piece: list[DemotedMessage] = []
    size = 0
    for m in messages:
        if piece and size >= flush_tokens and m.role == "user":
            out.append(piece)
            piece, size = [], 0
        piece.append(m)
        size += counter(m.text)
    if piece:
        out.append(piece)
    return out


class MemoryBlocksHook:
    """Feeds demoted messages to LlamaIndex memory blocks, each message once, in order.

    ``DemotingMemory.from_defaults(memory_blocks=[...])`` makes one for its private
    demoter; with a shared demoter, build it with this hook (or ``FanOutHook(archive,
    MemoryBlocksHook(blocks))``) and give the memory the same blocks::

        blocks = [FactExtractionMemoryBlock(llm=llm), VectorMemoryBlock(vector_store=vs)]
        hook = MemoryBlocksHook(blocks, flush_tokens=800)
        demoter = Demoter(SlidingWindow.last_tokens(8000), hook)
        memory = DemotingMemory.from_defaults(demoter=demoter, memory_blocks=blocks)

    Every block gets the demoted messages as LlamaIndex's ``Memory`` hands it a flush:
    ``aput(messages, from_short_term_memory=True, session_id=conversation_id)`` (a block
    with ``accept_short_term_memory=False`` ignores it), in pieces of about
    ``flush_tokens`` tokens (``Memory``'s ``token_flush_size``: a ``VectorMemoryBlock``
    stores one node per piece, so the pieces are what it can retrieve). See the module
    docstring for what happens on failure, across restarts and on erase.

    Args:
        blocks: The memory blocks, each with a name of its own.
        flush_tokens: The size of the pieces, in tokens (whole turns); ``None`` (default)
            hands each batch the engine delivers in one piece.
        counter: Counts a message's text for ``flush_tokens`` (demote's approximate
            count if omitted; ``from_defaults`` passes its window's).

    Raises:
        ConfigError: ``blocks`` is not a list of ``BaseMemoryBlock`` with unique names,
            or ``flush_tokens`` is not a positive int.
    """

    #: The blocks' ``aput`` is awaited (LlamaIndex's blocks are async).
    native_async = True

    def __init__(
        self,
        blocks: Sequence[BaseMemoryBlock[Any]],
        *,
        flush_tokens: int | None = None,
        counter: Callable[[str], int] | None = None,
    ) -> None:
        self.blocks = check_blocks(blocks)
        self.flush_tokens = None if flush_tokens is None else count("flush_tokens", flush_tokens)
        self._counter = counter or approximate_tokens
        self._lock = threading.Lock()
        # conversation -> block position -> keys it took of a batch that then failed
        # elsewhere: not given to it again when the batch is offered again.
        self._took: dict[str, dict[int, set[str]]] = {}

    def deliver(self, batch: Demotion) -> None:
        """Feed ``batch`` to every block (their async ``aput``, run to completion)."""
        run_sync(self.adeliver(batch))

    async def adeliver(self, batch: Demotion) -> None:
        """Feed ``batch`` to every block at once, piece by piece; raise the first failure.

        A block that failed is given the rest of the batch, and only that, when the
        engine offers the batch again.
        """
        cid = batch.conversation_id
        with self._lock:
            took = {i: set(keys) for i, keys in self._took.get(cid, {}).items()}
        pieces_of = functools.partial(pieces, flush_tokens=self.flush_tokens, counter=self._counter)

        async def feed(i: int, block: BaseMemoryBlock[Any]) -> None:
            done = took.setdefault(i, set())
            for piece in pieces_of([m for m in batch.messages if m.key not in done]):
                await block.aput(_messages(piece), from_short_term_memory=True, session_id=cid)
                done.update(m.key for m in piece)

        results = await asyncio.gather(
            *(feed(i, block) for i, block in enumerate(self.blocks)), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        with self._lock:
            if failures:
                self._took[cid] = took
            else:
                self._took.pop(cid, None)
        if failures:
            raise failures[0]

    def forget(self, conversation_id: str) -> None:
        """Drop what the hook remembers of the conversation (its tiers call it on erase)."""
        with self._lock:
            self._took.pop(conversation_id, None)

    def parts(self) -> tuple[object, ...]:
        """One tier per block, for erase (see the module docstring)."""
        return tuple(_tier(self, block) for block in self.blocks)


class _Tier:
    """A block as a tier of :class:`MemoryBlocksHook`: what its ``erase`` does, by kind."""

    def __init__(self, hook: MemoryBlocksHook, block: Any) -> None:
        self.hook = hook
        self.block = block

    async def aerase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int | None:
        """Forget ``conversation_id``; how many items went (``None``: unknown)."""
        self.hook.forget(conversation_id)
        return await self._forget(conversation_id)

    async def _forget(self, conversation_id: str) -> int | None:
        raise NotImplementedError


class StaticBlockTier(_Tier):
    """A ``StaticMemoryBlock``: it holds nothing of any conversation."""

    async def _forget(self, conversation_id: str) -> int | None:
        return 0


class FactsBlockTier(_Tier):
    """A ``FactExtractionMemoryBlock``: its facts are the block's, whoever fed them."""

    async def _forget(self, conversation_id: str) -> int | None:
        removed = len(self.block.facts)
        self.block.facts = []
        return removed


class VectorBlockTier(_Tier):
    """A ``VectorMemoryBlock``: the nodes its store holds with the conversation's id."""

    async def _forget(self, conversation_id: str) -> int | None:
        store = self.block.vector_store
        filters = MetadataFilters(filters=[MetadataFilter(key="session_id", value=conversation_id)])
        try:
            removed = len(await store.aget_nodes(filters=filters))
        except NotImplementedError:  # a store that cannot list: it still deletes
            removed = None
        await store.adelete_nodes(filters=filters)
        return removed


class OwnBlockTier(_Tier):
    """A block of your own with ``erase`` or ``aerase`` (demote's tier protocol)."""

    async def _forget(self, conversation_id: str) -> int | None:
        block = self.block
        if callable(getattr(block, "aerase", None)):
            removed = await block.aerase(conversation_id, fence=None, keys=None)
        else:
            removed = await asyncio.to_thread(block.erase, conversation_id, fence=None, keys=None)
        return removed if isinstance(removed, int) and not isinstance(removed, bool) else None


def _tier(hook: MemoryBlocksHook, block: BaseMemoryBlock[Any]) -> object:
    for kind, tier in (
        (StaticMemoryBlock, StaticBlockTier),
        (FactExtractionMemoryBlock, FactsBlockTier),
        (VectorMemoryBlock, VectorBlockTier),
    ):
        if isinstance(block, kind) and type(block)._aput is kind._aput:
            return tier(hook, block)
    if callable(getattr(block, "erase", None)) or callable(getattr(block, "aerase", None)):
        return OwnBlockTier(hook, block)
    return block  # cannot erase: reported as unsupported


def feeding_hook(hook: object, blocks: Sequence[BaseMemoryBlock[Any]]) -> MemoryBlocksHook | None:
    """The :class:`MemoryBlocksHook` behind ``hook`` that feeds exactly ``blocks``, if any."""
    for found in blocks_hooks(hook):
        if len(found.blocks) == len(blocks) and all(
            a is b for a, b in zip(found.blocks, blocks, strict=True)
        ):
            return found
    return None


def blocks_hooks(hook: object) -> list[MemoryBlocksHook]:
    """Every :class:`MemoryBlocksHook` behind ``hook``, depth first (a fan-out's parts)."""
    if isinstance(hook, MemoryBlocksHook):
        return [hook]
    parts = getattr(hook, "parts", None)
    return [found for part in (parts() if callable(parts) else ()) for found in blocks_hooks(part)]


#: Share of an LLM's context window used for the window when only ``llm=`` sizes it
#: (what LlamaIndex's ``ChatMemoryBuffer`` uses).
LLM_WINDOW_RATIO = 0.75

#: ``Memory``'s default ``token_flush_size``: a tenth of its token limit.
FLUSH_SHARE = 0.1


def blocks_hook(
    blocks: Sequence[BaseMemoryBlock[Any]],
    token_flush_size: int | None,
    policy: SlidingWindow | None,
    token_limit: int | None,
    llm: LLM | None,
) -> MemoryBlocksHook:
    """The hook that feeds a private demoter's memory blocks, in ``Memory``'s pieces.

    The pieces are ``token_flush_size`` tokens (whole turns), or a tenth of the token
    limit, counted by the window's counter; a window counted in messages or turns feeds
    each batch whole.

    Raises:
        ConfigError: The blocks are invalid, or ``token_flush_size`` is not a positive int.
    """
    counter = None if policy is None else policy.resolved_counter()
    limit = token_limit
    if policy is not None:
        limit = policy.limit if policy.unit == "tokens" else None
    elif limit is None and llm is not None:
        limit = int(llm.metadata.context_window * LLM_WINDOW_RATIO)
    if token_flush_size is None and limit is not None:
        token_flush_size = max(1, int(limit * FLUSH_SHARE))
    return MemoryBlocksHook(blocks, flush_tokens=token_flush_size, counter=counter)
