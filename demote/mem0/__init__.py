"""mem0 integration: demote into mem0, recall from it, send user turns to its extractor.

Install with ``pip install 'demote[mem0]'``. Every class takes a mem0 object you built
yourself: ``mem0.Memory`` or ``mem0.AsyncMemory`` (open source) or the hosted
``mem0.MemoryClient`` / ``mem0.AsyncMemoryClient``.

- :class:`Mem0Hook`: a demotion hook. Each demoted message is stored in mem0 verbatim
  (``infer=False``, one memory per message) or sent to mem0's extractor (``infer=True``),
  with its dedup key in the memory's metadata; a repeated delivery adds nothing.
- :class:`Mem0Recall`: reads the long tail back (``search``), scoped to one conversation.
- :class:`Mem0Capture`: the per-turn flow: each new user turn goes through a
  :class:`~demote.capture.recorder.Recorder` into ``memory.add``, so a 3-second extraction
  never blocks a turn.

**Namespaces.** mem0 scopes memories by ``user_id`` / ``agent_id`` / ``run_id``. By default
a conversation maps to ``run_id = conversation id`` (verbatim when mem0 accepts it: no
whitespace, at most 128 characters; otherwise ``demote-<blake2b hex>``), plus the fixed
``user_id`` / ``agent_id`` given to the constructor. Hook, recall and capture write and read
that same namespace, so one conversation never sees another's memories. Pass
``namespace=callable`` to choose differently (e.g. ``lambda cid: {"user_id": "alice"}`` to
share one user's memories across all their conversations).

**Dedup.** Keys already written or seen are cached per conversation in this process. For
the others, the open-source ``Memory`` is asked once per batch with the filter
``demote_key in [...]`` pushed down to the vector store (cost grows with the batch, not the
conversation). The hosted API is scanned once per conversation (paged ``get_all`` on the
namespace, comparing metadata keys), then the cache answers.

**Layout.** :mod:`~demote.mem0.config` (namespaces, :func:`memory_from_config`),
:mod:`~demote.mem0.hook`, :mod:`~demote.mem0.recall`, :mod:`~demote.mem0.capture`, and
``_drivers`` (each operation written once as a flow of mem0 calls, run by the drivers of
:mod:`demote.flow`, with mem0's exceptions translated at that boundary).

Importing this package never imports mem0 (``import mem0`` takes about two seconds); objects
are duck-typed: a hosted client is recognised by the ``options`` parameter of its ``add``,
an async one by a coroutine ``add``. :func:`memory_from_config` is the one place that
imports mem0, and raises :class:`~demote.errors.MissingExtraError` if it is missing.
"""

from demote.mem0.capture import Mem0Capture
from demote.mem0.config import (
    CONVERSATION_FIELD,
    KEY_FIELD,
    KEYS_FIELD,
    Namespace,
    conversation_namespace,
    memory_from_config,
)
from demote.mem0.hook import Mem0Hook
from demote.mem0.recall import Mem0Recall

__all__ = [
    "CONVERSATION_FIELD",
    "KEY_FIELD",
    "KEYS_FIELD",
    "Mem0Capture",
    "Mem0Hook",
    "Mem0Recall",
    "Namespace",
    "conversation_namespace",
    "memory_from_config",
]
