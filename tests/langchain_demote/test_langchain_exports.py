"""The public API of langchain_demote: __all__ sorted, complete, documented."""

from __future__ import annotations

import inspect

import langchain_demote


def test_all_is_sorted_and_complete() -> None:
    public = {
        name
        for name, value in vars(langchain_demote).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    # Loaded on first use: the full `langchain` package, and `langgraph` for the store pair.
    lazy = {"DemotingMiddleware", "StoreHook", "StoreRecall"}
    assert langchain_demote.__all__ == sorted(langchain_demote.__all__)
    assert set(langchain_demote.__all__) == public | lazy
    for name in lazy:
        assert getattr(langchain_demote, name).__name__ == name


def test_every_export_is_documented() -> None:
    for name in langchain_demote.__all__:
        assert inspect.getdoc(getattr(langchain_demote, name)), name
