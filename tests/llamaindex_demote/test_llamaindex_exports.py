"""The public API of llamaindex_demote: __all__ sorted, complete, documented."""

from __future__ import annotations

import inspect

import llamaindex_demote


def test_all_is_sorted_and_complete() -> None:
    public = {
        name
        for name, value in vars(llamaindex_demote).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert llamaindex_demote.__all__ == sorted(llamaindex_demote.__all__)
    assert set(llamaindex_demote.__all__) == public


def test_every_export_is_documented() -> None:
    for name in llamaindex_demote.__all__:
        assert inspect.getdoc(getattr(llamaindex_demote, name)), name
