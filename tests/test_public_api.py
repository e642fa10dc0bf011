"""The public API, checked like httpx's test_exported_members: __all__ sorted, complete,
every name real, nothing private."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from types import ModuleType

import pytest

import demote
import demote.errors
import demote.hooks.simple
import demote.state
import demote.window.policy


def check_all(module: ModuleType, *, sort: bool = True) -> None:
    names = module.__all__
    if sort:
        assert names == sorted(names), f"{module.__name__}.__all__ is not sorted"
    assert len(names) == len(set(names)), "duplicates in __all__"
    for name in names:
        assert not name.startswith("_"), f"private name {name!r} exported"
        assert hasattr(module, name), f"{module.__name__}.{name} does not exist"


def test_demote_all_is_sorted_and_real() -> None:
    check_all(demote)


def test_demote_all_is_complete() -> None:
    exported = set(demote.__all__)
    # Every error of the tree, the stores, the simple hooks and the policies.
    wanted = (
        set(demote.errors.__all__)
        | (set(demote.state.__all__) - {"validate_conversation_id"})
        | set(demote.hooks.simple.__all__) - {"deliver_async", "deliver_sync", "native_async"}
        | {"Bulk", "Compact", "PerItem", "SlidingWindow"}
        | {"Demoter", "Window", "Plan", "plan"}
    )
    assert wanted <= exported, wanted - exported
    # Every public class or function the package namespace holds is in __all__.
    public = {
        name
        for name, obj in vars(demote).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", "").startswith("demote")
    }
    assert public <= exported, public - exported


def test_demote_exports_come_from_demote() -> None:
    for name in demote.__all__:
        obj = getattr(demote, name)
        assert getattr(obj, "__module__", "demote").startswith("demote"), name


@pytest.mark.parametrize(
    "module",
    [
        "demote.errors",
        "demote.window.policy",
        "demote.records",
        "demote.window.planner",
        "demote.engine",
        "demote.window.tokens",
        "demote.state",
        "demote.hooks.simple",
        "demote.hooks.base",
        "demote.archive.options",
        "demote.archive.context",
        "demote.archive.sqlite",
        "demote.archive.postgres",
        "demote.archive.args",
        "demote.archive.ranking",
        "demote.flow",
        "demote.kit",
        "demote.backends.flow",
    ],
)
def test_core_module_all(module: str) -> None:
    # Submodules list constants first (isort style, RUF022 is off): order not checked.
    check_all(importlib.import_module(module), sort=False)


@pytest.mark.parametrize("package", ["langchain_demote", "llamaindex_demote"])
def test_adapter_all(package: str) -> None:
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        pytest.skip(f"{package} is not importable here: {exc}")
    if not hasattr(module, "__all__"):
        pytest.skip(f"{package} does not define __all__ yet")
    check_all(module)


def test_version_and_archive_at_the_top() -> None:
    from importlib.metadata import version

    from demote.archive.sqlite import SQLiteArchive

    assert demote.__version__ == version("demote")
    assert demote.SQLiteArchive is SQLiteArchive and "SQLiteArchive" in demote.__all__


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("demote.replay", "demote.cli.replay"),
        ("demote.transcript", "demote.cli.transcript"),
        ("demote.cachecost", "demote.cli.cachecost"),
        ("demote.offline", "demote.cli.offline"),
        ("demote.commands", "demote.cli.commands"),
        ("demote.demo", "demote.cli.demo"),
        ("demote.demo", "demote.cli.demo_parts"),
    ],
)
def test_command_line_modules_live_only_under_cli(old: str, new: str) -> None:
    # The package was never released with the old paths: no re-export shim is kept.
    check_all(importlib.import_module(new), sort=False)
    assert importlib.util.find_spec(old) is None, f"{old} still exists"


def test_the_old_flow_module_is_the_new_one() -> None:
    """``demote.backends.flow`` (kept for old imports) gives the objects of ``demote.flow``."""
    import demote.backends.flow as old
    import demote.flow as new

    assert all(getattr(old, name) is getattr(new, name) for name in new.__all__)
