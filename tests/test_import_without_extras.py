"""The core imports with no framework installed, and its source never imports one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import demote

BLOCKER = """
import importlib.abc, sys

class Blocker(importlib.abc.MetaPathFinder):
    BLOCKED = ("langchain", "langchain_core", "llama_index", "mem0")

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top.startswith("langchain") or top in self.BLOCKED:
            raise ImportError(f"blocked for this test: {name}")
        return None

sys.meta_path.insert(0, Blocker())
for mod in list(sys.modules):
    if mod.split(".")[0].startswith(("langchain", "llama_index", "mem0")):
        del sys.modules[mod]

import demote
import demote.engine, demote.window.planner, demote.window.policy, demote.state, demote.hooks.simple
import demote.window.tokens, demote.records, demote.errors, demote.flow

loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("langchain", "langchain_core",
                "llama_index", "mem0"))
assert not loaded, loaded
from demote import Demoter, SlidingWindow
d = Demoter(SlidingWindow.last_messages(2))
w = d.load("c", ["a", "b", "c"], lambda m: d.describe("user", m))
assert len(w.messages) <= 2, w
try:
    import langchain_core
except ImportError:
    pass
else:
    raise AssertionError("the blocker did not block")
print("ok")
"""


def test_core_imports_with_frameworks_blocked() -> None:
    out = subprocess.run(
        [sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


FRAMEWORK_IMPORT = re.compile(
    r"^\s*(?:import|from)\s+(langchain\w*|llama_index\w*|mem0\w*)\b", re.MULTILINE
)


def test_core_source_never_imports_a_framework() -> None:
    root = Path(demote.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for match in FRAMEWORK_IMPORT.finditer(source):
            line = source[source.rfind("\n", 0, match.start() + 1) + 1 : match.end()]
            indented = line[:1].isspace()
            # demote/mem0/ may import mem0 lazily inside functions; nothing else may.
            if path.parent.name == "mem0" and match.group(1).startswith("mem0") and indented:
                continue
            offenders.append(f"{path.relative_to(root)}: {line.strip()}")
    assert offenders == []


def test_planner_has_no_concurrency_or_io() -> None:
    window = Path(demote.__file__).parent / "window"
    for name in ("planner.py", "groups.py", "steps.py", "clearing.py"):
        source = (window / name).read_text(encoding="utf-8")
        assert not re.search(r"async def|asyncio|threading", source), name
