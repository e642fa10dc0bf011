"""``check_restarts``: a durable inner store beside an in-memory demotion state warns, once.

The adapters' own checks (their framework's in-memory stores, a real restart's
re-delivery) are in tests/langchain_demote/test_langchain_restarts.py and
tests/llamaindex_demote/test_llamaindex_restarts.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from demote import (
    Demoter,
    DemoteWarning,
    InMemoryStateStore,
    NoopHook,
    SlidingWindow,
    SQLiteArchive,
    SQLiteStateStore,
    check_restarts,
)

LAST2 = SlidingWindow.last_messages(2)


class Shelf:
    """An inner store that keeps conversations across restarts (a database's history)."""


def test_a_durable_inner_store_beside_an_in_memory_state_warns_once_per_process(
    tmp_path: Path,
) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    demoter = Demoter(LAST2, archive)
    with pytest.warns(DemoteWarning) as caught:
        assert check_restarts(demoter, Shelf(), durable=True) is True
    (warning,) = caught
    text = str(warning.message)
    assert text.startswith("Shelf keeps conversations across restarts")
    assert "InMemoryStateStore" in text and "state=SQLiteStateStore(" in text, "names the fix"
    assert warning.filename == __file__, "at the caller's line"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_restarts(demoter, Shelf(), durable=True) is True, "still true, not said"
        assert check_restarts(Demoter(LAST2, print), Shelf(), durable=True) is True
    archive.close()


def test_what_survives_a_restart_together_or_forgets_together_is_quiet(tmp_path: Path) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    durable = Demoter(LAST2, archive, state=SQLiteStateStore(tmp_path / "state.db"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_restarts(durable, Shelf(), durable=True) is False, "both durable"
        assert check_restarts(Demoter(LAST2, archive), Shelf(), durable=False) is False
        noop = Demoter(LAST2, NoopHook(), state=InMemoryStateStore())
        assert check_restarts(noop, Shelf(), durable=True) is False, "nothing to hand twice"
    durable.state.close()
    archive.close()
