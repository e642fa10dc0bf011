"""demote.registry: process-wide names, automatic names held weakly, clear errors."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from demote import ConfigError
from demote.registry import AUTO_PREFIX, lookup, name_for, name_of, register, unregister


class Thing:
    pass


@pytest.fixture
def names() -> Iterator[list[str]]:
    taken: list[str] = []
    yield taken
    for name in taken:
        unregister(name)


def test_register_lookup_and_name_of(names: list[str]) -> None:
    thing = Thing()
    assert register("reg-a", thing) is thing
    names.append("reg-a")
    assert lookup("reg-a") is thing and name_of(thing) == "reg-a" and name_for(thing) == "reg-a"
    unregister("reg-a")
    assert name_of(thing) is None
    with pytest.raises(ConfigError, match=r"demoter 'reg-a' is not registered in this process"):
        lookup("reg-a", "demoter")


def test_newest_registration_wins_and_aliases_survive(names: list[str]) -> None:
    old, new = Thing(), Thing()
    register("reg-b", old)
    register("reg-b-alias", old)
    register("reg-b", new)
    names.extend(["reg-b", "reg-b-alias"])
    assert lookup("reg-b") is new and name_of(new) == "reg-b"
    assert name_of(old) == "reg-b-alias", "the old object keeps its other name"
    unregister("reg-b-alias")
    assert name_of(old) is None


@pytest.mark.parametrize("bad", ["", None, 3, AUTO_PREFIX + "x"])
def test_bad_names(bad: object) -> None:
    with pytest.raises(ConfigError, match="name"):
        register(bad, Thing())  # type: ignore[arg-type]


def test_register_refuses_none() -> None:
    with pytest.raises(ConfigError, match="nothing to register"):
        register("reg-c", None)


def test_automatic_names_hold_weakly_for_this_process() -> None:
    thing = Thing()
    name = name_for(thing)
    assert name.startswith(AUTO_PREFIX) and name_for(thing) == name and lookup(name) is thing
    assert name_of(thing) is None, "an automatic name is not a registration"
    del thing
    gc.collect()
    with pytest.raises(ConfigError, match="named automatically"):
        lookup(name)


def test_objects_without_weak_references_need_a_name() -> None:
    with pytest.raises(ConfigError, match="register it under a name"):
        name_for(object(), "capture")
