"""Memory blocks in the request: read, fitted into their budget, placed by when they change.

Theory of operation
-------------------
``Memory`` renders every block's content (``block.aget(messages, session_id=...)``)
through its ``memory_blocks_template`` into one piece, and puts it into the system
message (``insert_method="system"``, its default) or in front of the newest user
message (``"user"``). Either way that piece is rewritten whenever any block's content
changes: a ``VectorMemoryBlock`` answers every question anew, so the system message
(or the question) changes at every turn, and a provider's prompt cache is written again
from there on, the whole conversation after it included. LlamaIndex's Anthropic LLM
moves every system message into the system prompt, so with ``"system"`` the cache is
lost from the very first token.

A ``DemotingMemory`` read renders the blocks with the same template, one user message
per pace of change (:func:`demote.request.compose`'s :class:`~demote.request.Extra`), so
each changes no more often than the request around it already does:

=============  ===================================  ==================================
changes        placed                               LlamaIndex's kinds
=============  ===================================  ==================================
never          right after the system block         ``StaticMemoryBlock``
when fed       right after the note                 ``FactExtractionMemoryBlock``
per question   right after the question and recall  ``VectorMemoryBlock``, your own
=============  ===================================  ==================================

(:func:`llamaindex_demote.blocks.changes_of`; ``block_changes=`` declares a block of your
own.) The first two are read once per committed state (the window's start, the hook's
watermark, the summary): a block is fed by the delivery before that delivery commits, so
its new content is sent from the commit on, together with the cut that fed it, never in
between; a per-question block is read once per question and window start, like recall
(an agent's model calls within a turn reuse it, so its steps after the question stay
cached).

**Within the limit.** In a token window the blocks get ``1 - chat_history_token_ratio``
of the limit, reserved out of it (``Memory`` flushes its chat history at
``chat_history_token_ratio`` of its limit and lets the blocks have the rest). Their
content is fitted into that budget as it is sent (each slot's message counted by the
window's own counter) the way ``Memory`` truncates: priority 0 is never truncated for
the others' sake, and blocks with another priority, lowest first, are asked to
``atruncate`` by the excess, then left out, lowest first. The limit also holds for
priority 0 (``Memory`` lets those exceed it): in the order listed, each is kept as whole
as the budget allows (asked to ``atruncate`` when it does not fit), or left out, and a
later, smaller one may take the room. The blocks that never
change or change when fed are fitted first, and what answers the question gets what they
leave, so a question never changes how much of the others is sent.

**Failures.** A block whose ``aget`` raises (a vector store that is down) is left out of
that request, reported as a ``degraded`` event of source ``recall`` (the memory blocks are
the long tail read back); the chat goes on. A per-question read that failed is not
remembered, so the next request asks again.

The blocks are async (LlamaIndex's); the read is one operation of the request's flow,
awaited by async reads and run to completion by sync ones (as ``Memory.get`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock
from llama_index.core.memory.memory import DEFAULT_MEMORY_BLOCKS_TEMPLATE, BaseMemoryBlock
from llama_index.core.prompts import BasePromptTemplate, RichPromptTemplate

from demote.engine import Demoter, Window
from demote.errors import ConfigError
from demote.events import DemoteEvent
from demote.flow import Flow, Twin, run_sync
from demote.request import Extra, Memo, question_of
from demote.window.policy import SlidingWindow
from llamaindex_demote.blocks import blocks_hooks, changes_of, check_blocks, feeding_hook
from llamaindex_demote.messages import core_role, text_of

__all__ = ["DEFAULT_CHAT_HISTORY_RATIO", "BlockSettings", "blocks_flow", "load_blocks"]

#: ``Memory``'s ``chat_history_token_ratio``: the share of the limit the chat history keeps.
DEFAULT_CHAT_HISTORY_RATIO = 0.7

Content = Any  # what a block's aget returns: str, content blocks, or chat messages
Count = Callable[[ChatMessage], int]


@dataclass(frozen=True, slots=True)
class BlockSettings:
    """A memory's blocks and how they are sent: validated once, when the memory is built.

    Attributes:
        blocks: The blocks, in the order given (the order the template lists them in).
        changes: When each block's content changes (:data:`~llamaindex_demote.blocks.BlockChanges`).
        template: How a slot's blocks are rendered (``Memory``'s ``memory_blocks_template``).
        ratio: ``chat_history_token_ratio`` as given (``None``: the default).
        declared: ``block_changes`` as given.
        budget: Tokens the blocks may cost as sent (a token window), or ``None``.
    """

    blocks: tuple[BaseMemoryBlock[Any], ...]
    changes: tuple[str, ...]
    template: BasePromptTemplate
    ratio: float | None
    declared: Mapping[str, str]
    budget: int | None
    memo: Memo[ChatMessage | None] = field(default_factory=Memo, compare=False)
    held: Memo[tuple[ChatMessage | None, ChatMessage | None]] = field(
        default_factory=Memo, compare=False
    )

    @classmethod
    def make(
        cls,
        blocks: Sequence[BaseMemoryBlock[Any]] | None,
        policy: SlidingWindow,
        *,
        ratio: float | None = None,
        template: BasePromptTemplate | str | None = None,
        declared: Mapping[str, str] | None = None,
        recall_reserve: int = 0,
    ) -> BlockSettings | None:
        """The settings of a memory's block options, or ``None`` without blocks.

        Raises:
            ConfigError: The blocks or ``declared`` are invalid, ``template`` is not a
                prompt template, ``ratio`` is not in (0, 1), or given for a window not
                counted in tokens, or the budget leaves the window no room.
        """
        if ratio is not None:
            if isinstance(ratio, bool) or not isinstance(ratio, int | float):
                raise ConfigError(f"chat_history_token_ratio: expected a number, got {ratio!r:.40}")
            if not 0 < ratio < 1:
                raise ConfigError(
                    f"chat_history_token_ratio: must be between 0 and 1 (the chat history's "
                    f"share of the limit; the blocks get the rest), got {ratio}"
                )
            if policy.unit != "tokens":
                raise ConfigError(
                    f"chat_history_token_ratio: shares a token limit; the window is counted "
                    f"in {policy.unit} (use a token window: token_limit=, or "
                    "SlidingWindow.last_tokens)"
                )
        if isinstance(template, str):
            template = RichPromptTemplate(template)
        if template is not None and not isinstance(template, BasePromptTemplate):
            raise ConfigError(
                f"memory_blocks_template: expected a prompt template, got {template!r:.80}"
            )
        if not blocks:
            return None
        checked = check_blocks(blocks, declared)
        declared = dict(declared or {})
        budget = None
        if policy.unit == "tokens":
            share = 1 - (DEFAULT_CHAT_HISTORY_RATIO if ratio is None else ratio)
            budget = max(1, int(policy.limit * share))
            if budget + recall_reserve >= policy.limit:
                raise ConfigError(
                    f"chat_history_token_ratio: the memory blocks' {budget} tokens and "
                    f"recall's {recall_reserve} leave no room for the window under the "
                    f"{policy.limit}-token limit"
                )
        return cls(
            checked,
            tuple(changes_of(b, declared) for b in checked),
            template or DEFAULT_MEMORY_BLOCKS_TEMPLATE,
            ratio,
            declared,
            budget,
        )

    def reserve(self) -> int:
        """Tokens the window leaves free for the blocks (their budget, in a token window)."""
        return self.budget or 0

    def dump(self, demoter_hook: object) -> dict[str, Any]:
        """What a saved memory keeps of its blocks: their hook's place, and the options.

        The blocks are live objects: a saved memory names them as the blocks of the
        ``n``-th :class:`~llamaindex_demote.blocks.MemoryBlocksHook` of its demoter's
        hook (the demoter is saved by name), and :func:`load_blocks` finds them there.

        Raises:
            ConfigError: The template is neither ``Memory``'s default nor a
                ``RichPromptTemplate`` (only its text can be saved).
        """
        hooks = blocks_hooks(demoter_hook)
        at = next(i for i, h in enumerate(hooks) if feeding_hook(h, self.blocks) is not None)
        template = None
        if self.template is not DEFAULT_MEMORY_BLOCKS_TEMPLATE:
            if not isinstance(self.template, RichPromptTemplate):
                raise ConfigError(
                    "memory_blocks_template: only a RichPromptTemplate (or its text) can be "
                    f"saved, got {type(self.template).__name__}"
                )
            template = self.template.template_str
        return {
            "hook": at,
            "memory_blocks_template": template,
            "chat_history_token_ratio": self.ratio,
            "block_changes": dict(self.declared),
        }

    def slot(self, changes: str) -> list[BaseMemoryBlock[Any]]:
        """The blocks whose content changes at that pace, in order."""
        return [b for b, c in zip(self.blocks, self.changes, strict=True) if c == changes]


def load_blocks(saved: object, demoter: Demoter) -> dict[str, Any]:
    """The ``DemotingMemory`` block options a saved memory stands for (none without blocks).

    Raises:
        ConfigError: ``saved`` is unreadable, or the demoter has no such blocks hook.
    """
    if saved is None:
        return {}
    hooks = blocks_hooks(demoter.hook)
    at = saved.get("hook") if isinstance(saved, dict) else None
    if not isinstance(at, int) or not 0 <= at < len(hooks):
        raise ConfigError(
            f"DemotingMemory.from_dict: memory_blocks: the demoter has no MemoryBlocksHook "
            f"{at!r} (it has {len(hooks)}): {saved!r:.120}"
        )
    assert isinstance(saved, dict)
    return {
        "memory_blocks": hooks[at].blocks,
        "memory_blocks_template": saved.get("memory_blocks_template"),
        "chat_history_token_ratio": saved.get("chat_history_token_ratio"),
        "block_changes": saved.get("block_changes") or None,
    }


def _as_blocks(content: Content) -> list[Any]:
    """A block's content as content blocks (``Memory``'s template takes those)."""
    if isinstance(content, str):
        return [TextBlock(text=content)]
    if content and isinstance(content[0], ChatMessage):
        # ``Memory`` puts these in front of the chat history as they are; here they are
        # the block's text, one ``role: text`` line each (a message of any role at the
        # head of the request could break the providers' rules).
        lines = (f"{core_role(m)}: {text_of(m)}" for m in content)
        return [TextBlock(text="\n".join(lines))]
    return list(content)


def render(
    template: BasePromptTemplate,
    blocks: Sequence[BaseMemoryBlock[Any]],
    contents: Mapping[str, Content],
) -> ChatMessage | None:
    """One user message of ``blocks``' contents through ``template`` (``None``: nothing)."""
    data = [(b.name, _as_blocks(contents[b.name])) for b in blocks if b.name in contents]
    if not data:
        return None
    made = template.format_messages(memory_blocks=data)
    if not made or not made[0].blocks:
        return None
    return ChatMessage(role=MessageRole.USER, blocks=list(made[0].blocks))


async def _read(
    blocks: Sequence[BaseMemoryBlock[Any]], messages: list[ChatMessage], session_id: str
) -> tuple[dict[str, Content], list[BaseException]]:
    """Each block's content (as ``Memory`` reads them: highest priority first), and failures."""
    contents: dict[str, Content] = {}
    failed: list[BaseException] = []
    for block in sorted(blocks, key=lambda b: -b.priority):
        try:
            content = await block.aget(list(messages), session_id=session_id)
        except Exception as exc:  # left out, reported: the chat goes on
            failed.append(exc)
            continue
        if not content:
            continue
        if not isinstance(content, str | list):
            failed.append(
                ConfigError(f"memory block {block.name!r}: aget returned {type(content).__name__}")
            )
            continue
        contents[block.name] = content
    return contents, failed


async def _fit(
    blocks: Sequence[BaseMemoryBlock[Any]],
    contents: dict[str, Content],
    budget: int | None,
    cost: Callable[[Mapping[str, Content]], int],
) -> None:
    """Fit ``contents`` into ``budget`` tokens, in place (see the module docstring)."""
    if budget is None:
        return
    held = [b for b in blocks if b.name in contents]
    if cost(contents) <= budget:
        return
    # Priority 0 first (never truncated for the others' sake), and the limit holds for it
    # too: in the order listed, each as whole as the room left allows (its atruncate
    # asked for less), or left out; a later, smaller one may take the room.
    ranked = sorted((b for b in held if b.priority != 0), key=lambda b: b.priority)
    others = {b.name: contents.pop(b.name) for b in ranked}
    zero = [b for b in held if b.priority == 0]
    wanted = {b.name: contents.pop(b.name) for b in zero}
    for block in zero:
        contents[block.name] = wanted[block.name]
        over = cost(contents) - budget
        if over > 0:
            await _truncate(block, contents, over)
            if cost(contents) > budget:
                contents.pop(block.name, None)
    contents.update(others)
    for block in ranked:  # Memory's order: truncate, lowest priority first ...
        if cost(contents) <= budget:
            return
        await _truncate(block, contents, cost(contents) - budget)
    for block in ranked:  # ... then leave out, lowest priority first
        if cost(contents) <= budget:
            return
        contents.pop(block.name, None)


async def _truncate(block: BaseMemoryBlock[Any], contents: dict[str, Content], over: int) -> None:
    if block.name not in contents:
        return
    cut = await block.atruncate(contents[block.name], over)
    if cut:
        contents[block.name] = cut
    else:
        contents.pop(block.name)


async def _gather(
    slots: Sequence[Sequence[BaseMemoryBlock[Any]]],
    template: BasePromptTemplate,
    messages: list[ChatMessage],
    session_id: str,
    budget: int | None,
    count: Count,
) -> tuple[list[ChatMessage | None], list[BaseException]]:
    """Read the blocks of ``slots``, fit them into ``budget``, render one message per slot."""
    every = [b for slot in slots for b in slot]
    contents, failed = await _read(every, messages, session_id)

    def cost(held: Mapping[str, Content]) -> int:
        made = (render(template, slot, held) for slot in slots)
        return sum(count(m) for m in made if m is not None)

    await _fit(every, contents, budget, cost)
    return [render(template, slot, contents) for slot in slots], failed


def _gather_sync(*args: Any) -> tuple[list[ChatMessage | None], list[BaseException]]:
    return run_sync(_gather(*args))


def blocks_flow(
    settings: BlockSettings,
    demoter: Demoter,
    window: Window[ChatMessage],
    input: str | None,
    count: Count,
    is_user: Callable[[ChatMessage], bool],
) -> Flow[tuple[Extra[ChatMessage], tuple[DemoteEvent, ...]]]:
    """The messages ``settings``' blocks add to the request for ``window``, and events.

    Args:
        settings: The memory's blocks.
        demoter: The engine (for degraded reports).
        window: The loaded window.
        input: The caller's question, if it has one (not stored yet).
        count: What a message costs as sent (the window's own count).
        is_user: Is a message a user message?
    """
    cid = window.conversation_id
    # What ``Memory`` hands its blocks: the short-term history (here: the window as the
    # model is sent it, stored messages only) and the caller's input as a user message.
    seen = [*window.pinned, *([window.opener] if window.opener is not None else [])]
    seen.extend(window.messages)
    if input is not None:
        seen.append(ChatMessage(role=MessageRole.USER, content=input))
    template, budget = settings.template, settings.budget
    stable = (settings.slot("never"), settings.slot("when_fed"))
    failed: list[BaseException] = []
    head = noted = asked = None
    used = 0
    if stable[0] or stable[1]:
        # Read once per committed state (window start, watermark, summary): a block is fed
        # before the delivery that feeds it commits, so a read in between would change
        # the request's middle without a cut; this way it changes with the commit.
        held_key = (window.start, window.delivered, window.summary)
        found, kept = settings.held.get(cid, held_key)
        if found and kept is not None:
            head, noted = kept
        else:
            (head, noted), errors = yield Twin(
                _gather_sync, _gather, (stable, template, seen, cid, budget, count)
            )
            failed.extend(errors)
            if not errors:
                settings.held.put(cid, held_key, (head, noted))
        used = sum(count(m) for m in (head, noted) if m is not None)
    question = question_of(window, is_user, text_of, input)
    wanted = settings.slot("per_question")
    if wanted:
        key = (question, window.start, used)
        found, asked = settings.memo.get(cid, key)
        if not found:
            left = None if budget is None else max(0, budget - used)
            (asked,), errors = yield Twin(
                _gather_sync, _gather, ((wanted,), template, seen, cid, left, count)
            )
            failed.extend(errors)
            if not errors:
                settings.memo.put(cid, key, asked)
    events = tuple(demoter.report_degraded(cid, "recall", exc) for exc in failed)
    extra = Extra(
        head=() if head is None else (head,),
        noted=() if noted is None else (noted,),
        asked=() if asked is None else (asked,),
        after=None if question is None else question[0],
    )
    return extra, events
