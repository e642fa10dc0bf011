"""No package reaches into another package's private modules (tools/private_imports.py).

An exception would be named in ``KNOWN`` with its reason; a new one fails this test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (importer, private module): why it is still there. Empty: none is left; one added here
#: needs its reason, and goes when the importer uses a public name instead.
KNOWN: dict[tuple[str, str], str] = {}


def test_private_imports_across_packages_are_only_the_known_ones() -> None:
    spec = importlib.util.spec_from_file_location(
        "private_imports", ROOT / "tools/private_imports.py"
    )
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    found = {(importer, target) for _, _, importer, target in tool.crossing(list(tool.DEFAULT))}
    assert found <= set(KNOWN), sorted(found - set(KNOWN))
