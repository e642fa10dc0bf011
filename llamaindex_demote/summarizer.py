"""``LLMSummarizer``: any LlamaIndex LLM folds demoted groups into a summary.

Used with the ``Compact`` strategy: ``Demoter(policy, hook, summarizer=LLMSummarizer(llm))``.
The engine calls it off the hot path; the prompt, the length bound and the cut live in the
core's :class:`~demote.summarize.ModelSummarizer`.
"""

from __future__ import annotations

from collections.abc import Callable

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.llms import LLM

from demote.summarize import DEFAULT_SUMMARY_PROMPT, ModelSummarizer
from demote.window.tokens import approximate_tokens

__all__ = ["LLMSummarizer"]


class LLMSummarizer(ModelSummarizer):
    """Summarizes with a LlamaIndex LLM (sync ``chat``, async ``achat``).

    Args:
        llm: Any LlamaIndex ``LLM``.
        prompt: Instructions replacing the default (``{max_words}`` is filled in).
        max_summary_tokens: Bound on the summary; a longer answer is cut (newest kept).
        counter: Counts tokens for that bound (default: chars / 4).
    """

    def __init__(
        self,
        llm: LLM,
        *,
        prompt: str = DEFAULT_SUMMARY_PROMPT,
        max_summary_tokens: int = 512,
        counter: Callable[[str], int] = approximate_tokens,
    ) -> None:
        super().__init__(prompt=prompt, max_summary_tokens=max_summary_tokens, counter=counter)
        self.llm = llm

    @staticmethod
    def _messages(instructions: str, body: str) -> list[ChatMessage]:
        return [
            ChatMessage(role=MessageRole.SYSTEM, content=instructions),
            ChatMessage(role=MessageRole.USER, content=body),
        ]

    def _complete(self, instructions: str, body: str) -> str:
        return self.llm.chat(self._messages(instructions, body)).message.content or ""

    async def _acomplete(self, instructions: str, body: str) -> str:
        return (await self.llm.achat(self._messages(instructions, body))).message.content or ""
