"""The one error tree of demote.

Every error demote raises on purpose derives from :class:`DemoteError`; where a builtin
says the same thing, the error subclasses it too, so ``except ValueError`` keeps working::

    DemoteError
    ├── ConfigError(ValueError)            a policy, option or argument is invalid
    │   ├── ConversationIdError            a conversation id is empty, not a str, or unsafe
    │   ├── ArgumentTypeError(TypeError)   an argument has the wrong type
    │   └── TranscriptError                a transcript line cannot be read (names the line)
    ├── MessageTypeError(TypeError)        an adapter was given something that is not a message
    ├── HookError                          a demotion hook failed (``on_hook_error="raise"``)
    │   ├── HookTimeout(TimeoutError)      a hook did not finish within ``hook_timeout``
    │   ├── HookBusy                       every hook thread is busy with earlier (hung) calls
    │   └── FencedOut                      a batch's fencing token predates its conversation's erase
    ├── SummarizerError                    a summarizer failed (``Compact`` strategy)
    ├── StoreError                         a state store, archive or outbox backend failed
    │   └── StoreUnavailable               skipped: the store failed recently (circuit open)
    ├── EmbeddingError                     an embedding model failed or returned bad vectors
    │   └── EmbeddingModelChanged          an archive holds another model's vectors
    └── MissingExtraError(ImportError)     an optional extra is not installed

Warnings about a configuration that works but is probably not what was meant are
:class:`DemoteWarning` (a ``UserWarning``).

Backend exceptions (``sqlite3.Error`` and friends) are translated at the boundary that
talks to the backend, never in the middle of the engine.
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "ConfigError",
    "ConversationIdError",
    "DemoteError",
    "DemoteWarning",
    "FencedOut",
    "HookBusy",
    "EmbeddingError",
    "EmbeddingModelChanged",
    "HookError",
    "HookTimeout",
    "MessageTypeError",
    "MissingExtraError",
    "StoreError",
    "StoreUnavailable",
    "SummarizerError",
    "TranscriptError",
]


class DemoteError(Exception):
    """Root of every error demote raises on purpose."""


class ConfigError(DemoteError, ValueError):
    """A policy, option or argument is invalid; the message names the field."""


class ConversationIdError(ConfigError):
    """A conversation id is empty, not a string, or otherwise unusable."""


class ArgumentTypeError(ConfigError, TypeError):
    """An argument has the wrong type; the message names the argument and what it got.

    Both a ``ValueError`` (as every :class:`ConfigError`) and a ``TypeError``.
    """


class TranscriptError(ConfigError):
    """A transcript cannot be read; ``line`` is the 1-based line number, if known."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


class MessageTypeError(DemoteError, TypeError):
    """An adapter was given something that is not a message; the message names the argument.

    Raised before anything is written, so the conversation stays as it was.
    """


class HookError(DemoteError):
    """A demotion hook failed; the watermark did not advance, so the next load retries."""


class HookTimeout(HookError, TimeoutError):
    """A hook did not finish within the configured ``hook_timeout``.

    A sync hook's call cannot be stopped: it runs on in the engine's own thread, and the
    conversation is not handed to the hook again until it ends (its messages stay pending).
    """


class HookBusy(HookError):
    """Every thread the engine keeps for sync hook calls is busy (a hung sink?).

    The batch was not started; its messages stay pending and are retried with backoff.
    """


class FencedOut(HookError):
    """A batch carries a fencing token older than its conversation's last erase.

    It comes from a worker whose lease was revoked while it delivered (an erase took the
    conversation over); nothing was stored. The worker's messages stay pending, and since
    the conversation was erased its state is gone, so nothing of it reaches the sink.
    """


class SummarizerError(DemoteError):
    """A summarizer failed; the summary is retried on a later load."""


class StoreError(DemoteError):
    """A state store, archive or outbox backend failed."""


class StoreUnavailable(StoreError):
    """A store call was skipped: the store failed recently and its breaker is open.

    Raised at once, without contacting the store, while :mod:`demote.backends.breaker` waits for
    the next probe; loads degrade on it (``on_store_error="degrade"``) like on any other
    store failure.
    """


class EmbeddingError(DemoteError):
    """An embedding model failed, or returned vectors of the wrong number or shape."""


class EmbeddingModelChanged(EmbeddingError):
    """An archive holds vectors of another embedding model (name or dimensions).

    Vectors of two models are never compared: open the archive with the model it was
    built with, or with ``on_model_change="reembed"`` to replace every stored vector.
    """


class MissingExtraError(DemoteError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"{module!r} is not installed; install it with: pip install 'demote[{extra}]'"
        )
        self.extra = extra


class DemoteWarning(UserWarning):
    """A configuration that works but is probably not what was meant."""
