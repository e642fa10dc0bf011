"""``with`` support for the core's resources that have a ``close()``."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Closing"]


class Closing:
    """Mixin: ``with Resource(...) as r:`` closes ``r`` on the way out."""

    def close(self) -> None:
        """Release the resource (subclasses implement it; idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
