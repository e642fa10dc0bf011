"""``ChatModelSummarizer``: any LangChain chat model folds demoted groups into a summary.

Used with the ``Compact`` strategy: ``Demoter(policy, hook, summarizer=
ChatModelSummarizer(model))``. The engine calls it off the hot path; the prompt, the
length bound and the cut live in the core's :class:`~demote.summarize.ModelSummarizer`.
"""

from __future__ import annotations

from collections.abc import Callable

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from demote.summarize import DEFAULT_SUMMARY_PROMPT, ModelSummarizer
from demote.window.tokens import approximate_tokens

__all__ = ["ChatModelSummarizer"]


class ChatModelSummarizer(ModelSummarizer):
    """Summarizes with a LangChain chat model (sync ``invoke``, async ``ainvoke``).

    Args:
        model: Any ``BaseChatModel``.
        prompt: Instructions replacing the default (``{max_words}`` is filled in).
        max_summary_tokens: Bound on the summary; a longer answer is cut (newest kept).
        counter: Counts tokens for that bound (default: chars / 4).
    """

    def __init__(
        self,
        model: BaseChatModel,
        *,
        prompt: str = DEFAULT_SUMMARY_PROMPT,
        max_summary_tokens: int = 512,
        counter: Callable[[str], int] = approximate_tokens,
    ) -> None:
        super().__init__(prompt=prompt, max_summary_tokens=max_summary_tokens, counter=counter)
        self.model = model

    @staticmethod
    def _messages(instructions: str, body: str) -> list[BaseMessage]:
        return [SystemMessage(instructions), HumanMessage(body)]

    def _complete(self, instructions: str, body: str) -> str:
        return self.model.invoke(self._messages(instructions, body)).text

    async def _acomplete(self, instructions: str, body: str) -> str:
        return (await self.model.ainvoke(self._messages(instructions, body))).text
