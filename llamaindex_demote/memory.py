"""``DemotingMemory``: a LlamaIndex ``BaseMemory`` with a bounded window and a long tail.

The full conversation lives in a LlamaIndex chat store (any ``BaseChatStore``; a
``SimpleChatStore`` by default) under ``chat_store_key``, which is also the conversation
id the :class:`~demote.Demoter` tracks. Writes (``put``, ``put_messages``, ``set``) only
touch the chat store. Every read (``get``) loads the history through the demoter, which
plans the window, hands whatever fell out of it to the hook exactly once, and returns the
window. The memory then assembles what the model sees::

    pinned system messages
    one system message with the running summary (if any)
    the kept messages ...
    one system message with recalled messages   <- only with recall=, right before the
    the newest user message ...                    newest user message (or at the end,
                                                   when that message is not stored yet)

When the window starts inside a turn (an agent run of many tool steps, put into memory
when it ended), the summary line above is replaced by the turn's opener, which carries the
summary of the earlier steps as a progress note, and old tool results come as
placeholders naming their archived key (see :mod:`llamaindex_demote._prompt`).

LlamaIndex's agents (``FunctionAgent``, ``ReActAgent``, ``AgentWorkflow``) read the memory
before each model call of a run but keep that run's own steps in their scratchpad, which
they send after the memory's messages and put into memory only when the run ends. So
across runs the window cuts at steps like every other window; inside one run, what the
model is sent is the window plus the run's scratchpad, which grows with every tool call,
unless the agent's LLM is wrapped in :class:`~llamaindex_demote.DemotingLLM`: every read
records what it returned (:mod:`llamaindex_demote._reads`), so that LLM finds the
conversation in each request and bounds the whole of it, the run's steps included.

Recall sits next to the question rather than at the head, so the prompt prefix (pinned,
summary, older kept messages) stays byte-identical between calls and provider prompt
caches keep hitting. Recalled text is never written to the chat store, so it is never
demoted, archived or captured again.

``reset`` is LlamaIndex's: the chat store and the demotion state are cleared, the long
tail keeps what it holds. ``erase`` also deletes the conversation from every tier behind
the demoter's hook and from the capture (see :mod:`demote.erase`).

A recall or capture that fails never fails the read or the write: the window goes without
recall, the turn is not captured, and a ``degraded`` event says so (to the instrumentation
and the demoter's observers, with a warning logged at most once a minute). A state store
that fails gives a degraded window (see :attr:`demote.Window.degraded`).

Sync and async share everything but the awaited calls: the async methods await the chat
store's async methods, :meth:`~demote.Demoter.aload` and the recall's ``asearch`` (or run
its ``search`` in a thread). LlamaIndex agents only call the async methods.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms.llm import LLM
from llama_index.core.memory.types import DEFAULT_CHAT_STORE_KEY, BaseChatStoreMemory
from llama_index.core.storage.chat_store import BaseChatStore, SimpleChatStore

from demote._checks import check_message, check_messages
from demote._validate import count
from demote.backends.flow import Flow, drive_async, drive_sync
from demote.engine import Demoter, Window
from demote.erase import EraseReport
from demote.errors import ConfigError
from demote.hooks.base import Capture, Recall
from demote.state.base import StateStore, validate_conversation_id
from demote.window.policy import SlidingWindow
from llamaindex_demote import _reads as reads
from llamaindex_demote import persist
from llamaindex_demote._capturing import capture_users, needs_index
from llamaindex_demote._defaults import build_demoter, conversation_key
from llamaindex_demote._erasing import erase_chat
from llamaindex_demote._prompt import Parts, assemble
from llamaindex_demote._recalling import with_recall
from llamaindex_demote.instrumentation import dispatcher, emit_events
from llamaindex_demote.messages import to_core

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
    ) -> None:
        validate_conversation_id(chat_store_key, "chat_store_key")
        if not isinstance(demoter, Demoter):
            raise ConfigError(f"demoter: expected a Demoter, got {type(demoter).__name__}")
        if recall is not None and not callable(getattr(recall, "search", None)):
            raise ConfigError(f"recall: {recall!r} has no search(conversation_id, query, k)")
        count("recall_k", recall_k)
        if capture is not None and not callable(getattr(capture, "capture", None)):
            raise ConfigError(f"capture: {capture!r} has no capture(turn)")
        if chat_store is not None and not isinstance(chat_store, BaseChatStore):
            raise ConfigError(f"chat_store: expected a BaseChatStore, got {chat_store!r:.80}")
        super().__init__(chat_store=chat_store or SimpleChatStore(), chat_store_key=chat_store_key)
        describe = functools.partial(to_core, describe=demoter.describe)
        if recall_budget_tokens is not None:
            recall_budget_tokens = count("recall_budget_tokens", recall_budget_tokens)
        self._parts = Parts(demoter, describe, recall, recall_k, capture, recall_budget_tokens)

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
        session_id: str | None = None,
        **kwargs: Any,
    ) -> DemotingMemory:
        """Build a memory over a shared demoter, or over a private one built here.

        Args:
            chat_history: Messages to store first (replacing what the key holds).
            llm: Only sizes the window when nothing else does: 75% of its context
                window, in tokens (as LlamaIndex's ``ChatMemoryBuffer``).
            demoter: A :class:`~demote.Demoter` to share (several memories may use one).
            policy: Window policy of a private demoter (instead of ``demoter``).
            hook: Where a private demoter demotes to (``NoopHook`` if omitted).
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
            recall_budget_tokens: At most this many tokens of recalled text (counted by
                the recall, e.g. the archive's counter), best hits first; ``None``: only
                ``recall_k`` bounds it.
            session_id: The name LlamaIndex's ``Memory`` gives the conversation id: the
                same as ``chat_store_key`` (give one, or both equal).
            **kwargs: Rejected: an unknown option raises :class:`~demote.errors.ConfigError`.

        Returns:
            The memory.

        Raises:
            ConfigError: Conflicting or invalid options, or nothing sizes the window.
            MessageTypeError: ``chat_history`` holds something that is not a ChatMessage.
        """
        if kwargs:
            raise ConfigError(f"DemotingMemory.from_defaults: unexpected options {sorted(kwargs)}")
        chat_store_key = conversation_key(chat_store_key, session_id)
        if chat_history is not None:
            chat_history = check_messages(chat_history, ChatMessage, "chat_history")
        memory = cls(
            demoter=build_demoter(demoter, policy, hook, state, token_limit, llm),
            chat_store=chat_store,
            chat_store_key=chat_store_key,
            recall=recall,
            recall_k=recall_k,
            capture=capture,
            recall_budget_tokens=recall_budget_tokens,
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
        return self._dump(store_as_json=True)

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
        return cls(**persist.load(data, **kwargs))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by reference: the chat store as an object, live parts by name."""
        return (restore_pickled, (self._dump(store_as_json=False),))

    def _dump(self, *, store_as_json: bool) -> dict[str, Any]:
        return persist.dump(
            self.class_name(),
            self.chat_store,
            self.chat_store_key,
            self._p,
            store_as_json=store_as_json,
        )

    @property
    def tokenizer_fn(self) -> Callable[[str], Sequence[int]]:
        """Counts text with the policy's counter, the way LlamaIndex engines expect.

        Chat engines call ``len(memory.tokenizer_fn(prefix))`` to compute the
        ``initial_token_count`` they pass to :meth:`get`; the returned sequence has one
        item per token (a ``range``: only its length means anything).
        """
        counter = self._p.demoter.policy.resolved_counter()

        def tokenize(text: str) -> Sequence[int]:
            return range(counter(text))

        return tokenize

    @staticmethod
    def _check_initial(initial_token_count: int) -> None:
        count("initial_token_count", initial_token_count, minimum=0)

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
                prefix). Validated, but it does not shrink the window: the window is the
                policy's alone, so what is demoted does not depend on which engine reads
                (budget the prefix into the policy's limit).
            **kwargs: Accepted for LlamaIndex compatibility and ignored.

        Returns:
            New list; the memory's own messages are the chat store's objects.
        """
        if initial_token_count.__class__ is not int or initial_token_count:
            self._check_initial(initial_token_count)  # (an int 0, the usual, is valid)
        parts = self._p
        out = assemble(self._load(parts)) if parts.recall is None else self._recalling_get(input)
        reads.note(self, out, input)
        return out

    async def aget(
        self, input: str | None = None, initial_token_count: int = 0, **kwargs: Any
    ) -> list[ChatMessage]:
        """Async :meth:`get`: awaits the chat store, the demoter and the recall."""
        if initial_token_count.__class__ is not int or initial_token_count:
            self._check_initial(initial_token_count)
        if self._p.recall is None:
            out = assemble(await self._aload())
        else:
            out = await self._arecalling_get(input)
        reads.note(self, out, input)
        return out

    def _load(self, parts: Parts) -> Window[ChatMessage]:
        cid = self.chat_store_key
        messages = self.chat_store.get_messages(cid)
        run = None
        if reads.RUNS:  # (only a DemotingLLM records runs: a chat engine's memory has none)
            run = reads.run_history(parts.demoter, cid, messages, parts.describe)
        if run is None:
            window = parts.demoter.load(cid, messages, parts.describe)
        else:  # inside a DemotingLLM run: read what its newest LLM call read
            window = reads.stored_part(parts.demoter.load(cid, *run), len(messages))
        if window.events:
            emit_events(window.events)
        return window

    async def _aload(self) -> Window[ChatMessage]:
        parts, cid = self._p, self.chat_store_key
        messages = await self.chat_store.aget_messages(cid)
        run = None
        if reads.RUNS:
            run = reads.run_history(parts.demoter, cid, messages, parts.describe)
        if run is None:
            window = await parts.demoter.aload(cid, messages, parts.describe)
        else:  # inside a DemotingLLM run: read what its newest LLM call read
            window = reads.stored_part(await parts.demoter.aload(cid, *run), len(messages))
        if window.events:
            emit_events(window.events)
        return window

    @dispatcher.span
    def _recalling_get(self, input: str | None) -> list[ChatMessage]:
        """:meth:`get` with recall, in a span (the load's and recall's events are in it)."""
        parts = self._p
        window = self._load(parts)
        return drive_sync(with_recall(parts, self.chat_store_key, window, input))

    @dispatcher.span
    async def _arecalling_get(self, input: str | None) -> list[ChatMessage]:
        """Async :meth:`_recalling_get`: awaits ``asearch``, or runs ``search`` in a thread."""
        parts, window = self._p, await self._aload()
        return await drive_async(with_recall(parts, self.chat_store_key, window, input))

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
        if self._p.capture is None:  # nothing else to do: store it
            self.chat_store.add_message(self.chat_store_key, message)
        else:
            self._store([message])

    async def aput(self, message: ChatMessage) -> None:
        """Async :meth:`put`."""
        await self.aput_messages([check_message(message, ChatMessage, "message")])

    def put_messages(self, messages: list[ChatMessage]) -> None:
        """Append messages in order (user messages also go to ``capture``).

        Raises:
            MessageTypeError: ``messages`` is not a list of ChatMessage; nothing is stored.
        """
        self._store(check_messages(messages, ChatMessage, "messages"))

    def _store(self, messages: list[ChatMessage]) -> None:
        """:meth:`put_messages` of checked ``messages``."""
        parts, cid, store = self._p, self.chat_store_key, self.chat_store
        base = len(store.get_messages(cid)) if needs_index(parts, messages) else 0
        for message in messages:
            store.add_message(cid, message)
        if parts.capture is not None:
            capture_users(parts, cid, base, messages)

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        """Async :meth:`put_messages`."""
        messages = check_messages(messages, ChatMessage, "messages")
        parts, cid = self._p, self.chat_store_key
        needs = needs_index(parts, messages)
        base = len(await self.chat_store.aget_messages(cid)) if needs else 0
        for message in messages:
            await self.chat_store.async_add_message(cid, message)
        capture_users(parts, cid, base, messages)

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
        return drive_sync(self._erase(inner, wait))

    async def aerase(self, *, inner: bool = True, wait: float | None = None) -> EraseReport:
        """Async :meth:`erase`: awaits the chat store, the engine and the tiers."""
        return await drive_async(self._erase(inner, wait))

    def _erase(self, inner: bool, wait: float | None) -> Flow[EraseReport]:
        return erase_chat(self._p, self.chat_store, self.chat_store_key, inner, wait)


def restore_pickled(data: dict[str, Any]) -> DemotingMemory:
    """Rebuild a pickled memory (``DemotingMemory.__reduce__`` names this function)."""
    return DemotingMemory(**persist.load(data))
