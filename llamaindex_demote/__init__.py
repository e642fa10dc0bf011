"""LlamaIndex adapter for demote: ``DemotingMemory``, a ``BaseMemory`` with a long tail.

Install with ``pip install 'demote[llamaindex]'``::

    from llamaindex_demote import DemotingMemory

    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="user-42")
    chat_engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)

- :mod:`llamaindex_demote.memory`: :class:`DemotingMemory`.
- :mod:`llamaindex_demote.blocks`: :class:`MemoryBlocksHook`, which feeds LlamaIndex memory
  blocks what leaves the window (``from_defaults(memory_blocks=[...])`` makes one).
- :mod:`llamaindex_demote.llm`: :class:`DemotingLLM`, which bounds every LLM call of an
  agent run (``FunctionAgent(tools, llm=DemotingLLM(llm))``), the run's own steps included.
- :mod:`llamaindex_demote.persist`: how a memory is saved and restored (``to_dict``,
  pickle; live parts by the names :mod:`demote.registry` gives them).
- :mod:`llamaindex_demote.instrumentation`: what each read did, as LlamaIndex
  instrumentation events (``DemoteDemotedEvent``, ...) any registered handler sees.
- :mod:`llamaindex_demote.messages`: pure ``to_core`` / ``from_core`` conversion.
- :mod:`llamaindex_demote.summarizer`: :class:`LLMSummarizer` for the ``Compact`` strategy.
- :mod:`llamaindex_demote.tools`: ``recall_tool``, with which an agent searches its archive.
"""

from __future__ import annotations

try:
    import llama_index.core  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from demote.errors import MissingExtraError

    raise MissingExtraError("llama-index-core", "llamaindex") from exc

from llamaindex_demote.blocks import MemoryBlocksHook
from llamaindex_demote.llm import DemotingLLM
from llamaindex_demote.memory import DemotingMemory
from llamaindex_demote.messages import RECALL_PREFIX, from_core, to_core
from llamaindex_demote.summarizer import LLMSummarizer
from llamaindex_demote.tools import recall_tool

__all__ = [
    "DemotingLLM",
    "DemotingMemory",
    "LLMSummarizer",
    "MemoryBlocksHook",
    "RECALL_PREFIX",
    "from_core",
    "recall_tool",
    "to_core",
]
