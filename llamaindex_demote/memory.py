"""``DemotingMemory``: a LlamaIndex ``BaseMemory`` with a bounded window and a long tail.

The full conversation lives in a LlamaIndex chat store (any ``BaseChatStore``; a
``SimpleChatStore`` by default) under ``chat_store_key``, which is also the conversation
id the :class:`~demote.Demoter` tracks. Writes (``put``, ``put_messages``, ``set``) only
touch the chat store. Every read (``get``) loads the history through the demoter, which
plans the window, hands whatever fell out of it to the hook exactly once, and returns the
window. The memory then assembles what the model sees (:func:`demote.request.compose`, the
same order in every adapter)::

    pinned system messages
    one user message with the running summary (if any)
    the kept messages ...
    the newest user message (the question)
    one user message with recalled messages   <- only with recall=, right after the
    ...                                          question (or at the end, when the
                                                 question is not stored yet)

demote adds no system message: a chat engine's system prompt (its prefix) stays the only
system block, and never changes. In a token window the prefix (``initial_token_count``,
which chat engines pass) and the recall's token budget are counted toward the limit, so
the whole request stays within it.

When the window starts inside a turn (an agent run of many tool steps, put into memory
when it ended), the turn's opener comes first, with the summary of the earlier steps as
a progress note after it, and old tool results come as placeholders naming their
archived key (see :mod:`llamaindex_demote._rendering`).

LlamaIndex's agents (``FunctionAgent``, ``ReActAgent``, ``AgentWorkflow``) read the memory
before each model call of a run but keep that run's own steps in their scratchpad, which
they send after the memory's messages and put into memory only when the run ends. So
across runs the window cuts at steps like every other window; inside one run, what the
model is sent is the window plus the run's scratchpad, which grows with every tool call,
unless the agent's LLM is wrapped in :class:`~llamaindex_demote.DemotingLLM`, which finds
the conversation in each request and bounds the whole of it, the run's steps included.

Recalled text goes right after the question, so the prompt's prefix stays the same
between calls, and it is never written to the chat store (never demoted or captured
again). ``reset`` clears the chat store and the demotion state, the long tail keeps what
it holds; ``erase`` deletes the conversation from every tier too (see :mod:`demote.erase`).

A recall or capture that fails never fails the read or the write: the window goes without
recall, the turn is not captured, and a ``degraded`` event says so (to the instrumentation
and the demoter's observers, with a warning logged at most once a minute). A state store
that fails gives a degraded window (see :attr:`demote.Window.degraded`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms.llm import LLM
from llama_index.core.memory.memory import BaseMemoryBlock, InsertMethod
from llama_index.core.memory.types import DEFAULT_CHAT_STORE_KEY, BaseChatStoreMemory
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.storage.chat_store import BaseChatStore, SimpleChatStore

from demote.engine import Demoter
from demote.erase import EraseReport
from demote.flow import drive_async, drive_sync
from demote.hooks.base import Capture, Recall
from demote.kit import check_message, check_messages
from demote.restarts import check_restarts
from demote.state.base import StateStore, validate_conversation_id
from demote.window.policy import SlidingWindow
from llamaindex_demote import _capturing as capturing
from llamaindex_demote import _conversations as reads
from llamaindex_demote import _defaults as defaults
from llamaindex_demote import _loading as loading
from llamaindex_demote import persist
from llamaindex_demote._block_slots import load_blocks
from llamaindex_demote._erasing import erase_chat
from llamaindex_demote._rendering import Parts
from llamaindex_demote._shaping import shape
from llamaindex_demote.instrumentation import dispatcher

__all__ = ["DemotingMemory", "restore_pickled"]


class DemotingMemory(BaseChatStoreMemory):
    """A LlamaIndex memory that keeps a bounded window and demotes the rest, once.

    Build it with :meth:`from_defaults`; pass it to any chat engine or agent::

        memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="user-42")
        chat_engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
        await agent.run("hi", memory=memory)

    It survives ``to_dict``/``from_dict`` and pickle (so an ``AgentWorkflow`` context can
    be saved and resumed, in another process too) when its demoter, and its recall and
    capture if any, are registered by name in every process that saves or restores it;
    see :mod:`llamaindex_demote.persist`::

        demoter = register("support", Demoter(policy, archive, state=state))

    Attributes:
        chat_store: Where the full history lives (any ``BaseChatStore``).
        chat_store_key: The conversation id.
    """

    _parts: Parts = PrivateAttr()

    def __init__(
        self,
        *,
        demoter: Demoter,
        chat_store: BaseChatStore | None = None,
        chat_store_key: str = DEFAULT_CHAT_STORE_KEY,
        recall: Recall | None = None,
        recall_k: int = 5,
        capture: Capture | None = None,
        recall_budget_tokens: int | None = None,
        recall_role: Literal["user", "system"] = "user",
        memory_blocks: Sequence[BaseMemoryBlock[Any]] | None = None,
        memory_blocks_template: BasePromptTemplate | str | None = None,
        chat_history_token_ratio: float | None = None,
        block_changes: Mapping[str, str] | None = None,
    ) -> None:
        validate_conversation_id(chat_store_key, "chat_store_key")
        parts = defaults.memory_parts(
            demoter, chat_store, recall, recall_k, capture, recall_budget_tokens, recall_role
        )
        parts = defaults.with_blocks(
            parts, memory_blocks, memory_blocks_template, chat_history_token_ratio, block_changes
        )
        super().__init__(chat_store=chat_store or SimpleChatStore(), chat_store_key=chat_store_key)
        durable = not isinstance(self.chat_store, SimpleChatStore)  # (warned once per process)
        check_restarts(demoter, self.chat_store, durable=durable)
        self._parts = parts

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serializes this memory under."""
        return "DemotingMemory"

    @classmethod
    def from_defaults(
        cls,
        chat_history: list[ChatMessage] | None = None,
        llm: LLM | None = None,
        *,
        demoter: Demoter | None = None,
        policy: SlidingWindow | None = None,
        hook: object | None = None,
        state: StateStore | None = None,
        token_limit: int | None = None,
        chat_store: BaseChatStore | None = None,
        chat_store_key: str = DEFAULT_CHAT_STORE_KEY,
        recall: Recall | None = None,
        recall_k: int = 5,
        capture: Capture | None = None,
        recall_budget_tokens: int | None = None,
        recall_role: Literal["user", "system"] = "user",
        session_id: str | None = None,
        memory_blocks: Sequence[BaseMemoryBlock[Any]] | None = None,
        insert_method: InsertMethod | str = "user",
        memory_blocks_template: BasePromptTemplate | str | None = None,
        chat_history_token_ratio: float | None = None,
        block_changes: Mapping[str, str] | None = None,
        tokenizer_fn: Callable[[str], Sequence[Any]] | None = None,
        token_flush_size: int | None = None,
        **kwargs: Any,
    ) -> DemotingMemory:
        """Build a memory over a shared demoter, or over a private one built here.

        Args:
            chat_history: Messages to store first (replacing what the key holds).
            llm: Only sizes the window when nothing else does: 75% of its context
                window, in tokens (as LlamaIndex's ``ChatMemoryBuffer``).
            demoter: A :class:`~demote.Demoter` to share (several memories may use one).
            policy: Window policy of a private demoter (instead of ``demoter``).
            hook: Where a private demoter demotes to (``NoopHook`` if omitted, with a
                :class:`~demote.DemoteWarning`: see :mod:`llamaindex_demote._defaults`).
            state: A private demoter's state store (``InMemoryStateStore`` if omitted;
                ``SQLiteStateStore`` survives restarts).
            token_limit: Shorthand for ``policy=SlidingWindow.last_tokens(token_limit)``,
                so ``SimpleChatEngine.from_defaults(memory_cls=DemotingMemory)`` works.
            chat_store: Where the full history lives; a new ``SimpleChatStore`` if omitted.
            chat_store_key: The conversation id (``"chat_history"`` if omitted, as in
                LlamaIndex's ``ChatMemoryBuffer``).
            recall: Anything with ``search(conversation_id, query, k)`` returning
                :class:`~demote.records.Recalled` (``SQLiteArchive``, ``Mem0Recall``);
                its ``asearch`` is used by the async methods when it has one.
            recall_k: How many recalled messages ``get`` adds at most.
            capture: Receives each new user message as a
                :class:`~demote.records.CapturedTurn` (e.g. ``Mem0Capture``).
            recall_budget_tokens: Most tokens the recall message may cost as sent
                (counted like the window). In a token window it is reserved out of the
                limit; ``None`` (default) gives a token window
                :data:`demote.request.RECALL_SHARE` of its limit (1/72: a cached chat then
                costs about 1.1x what it costs without recall; a larger budget recalls
                more for more) and a window counted in messages or turns no token budget
                (``recall_k`` only).
            recall_role: ``"user"`` (default: valid for every provider) or ``"system"``
                (only for providers that take system messages anywhere, such as
                OpenAI's; LlamaIndex's Anthropic LLM moves every system message into the
                system prompt, which then changes every turn and breaks its cache).
            session_id: The name LlamaIndex's ``Memory`` gives the conversation id: the
                same as ``chat_store_key`` (give one, or both equal).
            memory_blocks: LlamaIndex memory blocks (``StaticMemoryBlock``,
                ``FactExtractionMemoryBlock``, ``VectorMemoryBlock``, your own
                ``BaseMemoryBlock``), as ``Memory`` takes them: each demoted message is
                handed to them once, in order (a
                :class:`~llamaindex_demote.blocks.MemoryBlocksHook`, made here beside
                ``hook=``; with ``demoter=``, its hook must be one), and their content is
                sent with every request, placed by when it changes (see
                :mod:`llamaindex_demote._block_slots`).
            insert_method: ``"user"`` (``Memory``'s ``InsertMethod.USER``): the blocks
                are sent as user messages. ``"system"`` is refused: demote never adds a
                system message.
            memory_blocks_template: How the blocks are rendered (``Memory``'s
                ``memory_blocks_template``, its default if omitted).
            chat_history_token_ratio: The window's share of a token limit (``Memory``'s:
                0.7 if omitted); the memory blocks get the rest, reserved out of it.
            block_changes: When a block of your own changes, by its name: ``"never"``,
                ``"when_fed"`` or ``"per_question"`` (the default for a block demote does
                not know: it is then read once per question).
            tokenizer_fn: ``Memory``'s token counter (text to a list of tokens): counts
                the window made from ``token_limit=``.
            token_flush_size: ``Memory`` flushes this many tokens at a time to its
                blocks; here it is the size of the pieces the blocks are fed (whole
                turns; a tenth of a token limit if omitted, as ``Memory``'s default).
                How much the window itself drops at a cut is its policy's (a token
                window is cut well below its limit at once, to keep prompt caches warm;
                ``eviction=Bulk(overflow=n)`` drops ``n`` at a time).
            **kwargs: Rejected with a :class:`~demote.errors.ConfigError`; the one for a
                ``Memory`` option demote does not take (the media estimates, the SQL
                store's options) says what to use instead.

        Returns:
            The memory.

        Raises:
            ConfigError: Conflicting or invalid options, or nothing sizes the window.
            MessageTypeError: ``chat_history`` holds something that is not a ChatMessage.
        """
        defaults.check_options(kwargs, insert_method, chat_store)
        chat_store_key = defaults.conversation_key(chat_store_key, session_id)
        if chat_history is not None:
            chat_history = check_messages(chat_history, ChatMessage, "chat_history")
        if tokenizer_fn is not None:
            policy = defaults.tokenizer_policy(tokenizer_fn, token_limit, policy, demoter)
            token_limit = None
        hook, memory_blocks = defaults.feed_blocks(
            memory_blocks, token_flush_size, demoter, hook, policy, token_limit, llm
        )
        memory = cls(
            demoter=defaults.build_demoter(demoter, policy, hook, state, token_limit, llm),
            chat_store=chat_store,
            chat_store_key=chat_store_key,
            recall=recall,
            recall_k=recall_k,
            capture=capture,
            recall_budget_tokens=recall_budget_tokens,
            recall_role=recall_role,
            memory_blocks=memory_blocks,
            memory_blocks_template=memory_blocks_template,
            chat_history_token_ratio=chat_history_token_ratio,
            block_changes=block_changes,
        )
        if chat_history is not None:
            memory.set(chat_history)
        return memory

    # -- shared pieces ---------------------------------------------------------------------

    @property
    def _p(self) -> Parts:
        # Pydantic serves private attributes from ``BaseModel.__getattr__``, about 1.7 us a
        # lookup (several per turn); its documented ``__pydantic_private__`` dict is direct.
        private = self.__pydantic_private__
        parts: Parts = private["_parts"] if private is not None else self._parts
        return parts

    @property
    def demoter(self) -> Demoter:
        """The demoter that keeps this memory's window."""
        return self._p.demoter

    @property
    def session_id(self) -> str:
        """The conversation id, under the name LlamaIndex's ``Memory`` uses."""
        return self.chat_store_key

    # -- saving and restoring (see llamaindex_demote.persist) -------------------------------

    def to_dict(self, **kwargs: Any) -> dict[str, Any]:
        """The memory as JSON-ready data; live parts by their registered names.

        Raises:
            ConfigError: The demoter (recall, capture) is not registered by name, or the
                chat store is neither a ``SimpleChatStore`` nor registered.
        """
        return persist.dump(self.class_name(), self.chat_store, self.chat_store_key, self._p)

    @classmethod
    def from_dict(cls, data: dict[str, Any], **kwargs: Any) -> DemotingMemory:
        """Restore a memory saved by :meth:`to_dict`, attached to the registered objects.

        Args:
            data: What :meth:`to_dict` returned.
            **kwargs: Live parts to use instead of the registered ones (``demoter=``,
                ``recall=``, ``capture=``, ``chat_store=``).

        Raises:
            ConfigError: A name in ``data`` is not registered in this process.
        """
        args = persist.load(data, **kwargs)
        return cls(**args, **load_blocks(data.get("memory_blocks"), args["demoter"]))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by reference: the chat store as an object, live parts by name."""
        saved = persist.dump(
            self.class_name(), self.chat_store, self.chat_store_key, self._p, store_as_json=False
        )
        return (restore_pickled, (saved,))

    @property
    def tokenizer_fn(self) -> Callable[[str], Sequence[int]]:
        """Counts text with the policy's counter, the way LlamaIndex engines expect.

        Chat engines call ``len(memory.tokenizer_fn(prefix))`` to compute the
        ``initial_token_count`` they pass to :meth:`get`; the returned sequence has one
        item per token (a ``range``: only its length means anything).
        """
        return defaults.tokenizer_of(self._p.demoter.policy)

    # -- reads -----------------------------------------------------------------------------

    def get(
        self, input: str | None = None, initial_token_count: int = 0, **kwargs: Any
    ) -> list[ChatMessage]:
        """The messages to send the model: pinned, summary, window, and recall.

        Loading demotes whatever fell out of the window (once) before returning. What it
        did is sent to LlamaIndex's instrumentation (see
        :mod:`llamaindex_demote.instrumentation`); with ``recall=``, inside a span of its
        own.

        Args:
            input: The user's question, if the caller has it (recall query). Without it
                the newest stored user message is the query.
            initial_token_count: Tokens the caller puts in front of these messages (its
                prefix: ``SimpleChatEngine`` passes its system prompt's). In a token
                window the window leaves room for it (and for the recall's budget), so
                the whole request stays within the policy's limit.
            **kwargs: Accepted for LlamaIndex compatibility and ignored.

        Returns:
            New list; the memory's own messages are the chat store's objects.
        """
        parts = self._p
        reserved = loading.reserved_tokens(parts, initial_token_count)
        if parts.recalling is None and parts.blocks is None:
            out = parts.render(loading.load(self, parts, reserved), None)
        else:
            out = self._shaped_get(input, reserved)
        reads.note(self, out, input)
        return out

    async def aget(
        self, input: str | None = None, initial_token_count: int = 0, **kwargs: Any
    ) -> list[ChatMessage]:
        """Async :meth:`get`: awaits the chat store, the demoter and the recall."""
        parts = self._p
        reserved = loading.reserved_tokens(parts, initial_token_count)
        if parts.recalling is None and parts.blocks is None:
            out = parts.render(await loading.aload(self, parts, reserved), None)
        else:
            out = await self._ashaped_get(input, reserved)
        reads.note(self, out, input)
        return out

    @dispatcher.span
    def _shaped_get(self, input: str | None, reserved: int) -> list[ChatMessage]:
        """:meth:`get` with recall or memory blocks, in a span (with every event of the read)."""
        parts = self._p
        return drive_sync(shape(parts, loading.load(self, parts, reserved), input))

    @dispatcher.span
    async def _ashaped_get(self, input: str | None, reserved: int) -> list[ChatMessage]:
        """Async :meth:`_shaped_get`: awaits ``asearch`` and the blocks."""
        parts = self._p
        return await drive_async(shape(parts, await loading.aload(self, parts, reserved), input))

    def get_all(self) -> list[ChatMessage]:
        """The full history in the chat store (a new list)."""
        return list(self.chat_store.get_messages(self.chat_store_key))

    async def aget_all(self) -> list[ChatMessage]:
        """Async :meth:`get_all`."""
        return list(await self.chat_store.aget_messages(self.chat_store_key))

    # -- writes ----------------------------------------------------------------------------

    def put(self, message: ChatMessage) -> None:
        """Append one message (a user message also goes to ``capture``).

        Raises:
            MessageTypeError: ``message`` is not a ChatMessage; nothing is stored.
        """
        if message.__class__ is not ChatMessage:  # (an isinstance of a pydantic class is slow)
            message = check_message(message, ChatMessage, "message")
        capturing.put(self._p, self.chat_store, self.chat_store_key, message)

    async def aput(self, message: ChatMessage) -> None:
        """Async :meth:`put`."""
        await self.aput_messages([check_message(message, ChatMessage, "message")])

    def put_messages(self, messages: list[ChatMessage]) -> None:
        """Append messages in order (user messages also go to ``capture``).

        Raises:
            MessageTypeError: ``messages`` is not a list of ChatMessage; nothing is stored.
        """
        messages = check_messages(messages, ChatMessage, "messages")
        capturing.store(self._p, self.chat_store, self.chat_store_key, messages)

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        """Async :meth:`put_messages`."""
        messages = check_messages(messages, ChatMessage, "messages")
        await capturing.astore(self._p, self.chat_store, self.chat_store_key, messages)

    def set(self, messages: list[ChatMessage]) -> None:
        """Replace the whole conversation.

        The next read notices the rewrite and re-syncs the demotion state; messages the
        hook already holds (``has_keys``) are not delivered again. Nothing is captured.

        Raises:
            MessageTypeError: ``messages`` is not a list of ChatMessage; nothing changes.
        """
        messages = check_messages(messages, ChatMessage, "messages")
        self.chat_store.set_messages(self.chat_store_key, messages)

    async def aset(self, messages: list[ChatMessage]) -> None:
        """Async :meth:`set`."""
        messages = check_messages(messages, ChatMessage, "messages")
        await self.chat_store.aset_messages(self.chat_store_key, messages)

    def reset(self) -> None:
        """Delete the conversation from the chat store and clear its demotion state.

        What the hook already holds (the archive) is kept; :meth:`erase` deletes it too.
        """
        self.chat_store.delete_messages(self.chat_store_key)
        self._p.demoter.clear(self.chat_store_key)

    async def areset(self) -> None:
        """Async :meth:`reset`."""
        await self.chat_store.adelete_messages(self.chat_store_key)
        await self._p.demoter.aclear(self.chat_store_key)

    def erase(self, *, inner: bool = True, wait: float | None = None) -> EraseReport:
        """Forget the conversation everywhere it went: unlike :meth:`reset`, the long tail too.

        The chat store's messages of ``chat_store_key`` are deleted first (``inner=True``),
        then :meth:`demote.Demoter.erase` deletes the demotion state and asks every tier
        behind the hook (archive, outbox, mem0, vector store) to delete the conversation,
        with the dedup keys of the history for tiers that delete by id; the ``capture``
        is erased after them (see :mod:`demote.erase`).

        Args:
            inner: Also delete the messages from the chat store. With ``False`` they
                stay, and the next read demotes them again as a new conversation.
            wait: Seconds to wait for a delivery in flight (see
                :meth:`demote.Demoter.erase`).

        Returns:
            What each tier did, and how many messages left the chat store.
        """
        return drive_sync(erase_chat(self._p, self.chat_store, self.chat_store_key, inner, wait))

    async def aerase(self, *, inner: bool = True, wait: float | None = None) -> EraseReport:
        """Async :meth:`erase`: awaits the chat store, the engine and the tiers."""
        flow = erase_chat(self._p, self.chat_store, self.chat_store_key, inner, wait)
        return await drive_async(flow)


def restore_pickled(data: dict[str, Any]) -> DemotingMemory:
    """Rebuild a pickled memory (``DemotingMemory.__reduce__`` names this function)."""
    return DemotingMemory.from_dict(data)
