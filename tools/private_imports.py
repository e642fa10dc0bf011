"""List imports of another package's private module (``_name``), bench included.

An import of ``X._y`` (``from X._y import ...``, ``import X._y``, ``from X import _y``
where ``_y`` is a module) is private when the importing module is outside package ``X``:
``demote.engine`` may use ``demote._validate`` (it is inside ``demote``) but not
``demote.archive._lexical`` (``demote.engine`` is outside ``demote.archive``).

Usage: ``python tools/private_imports.py [--count] [paths...]`` (default: the three
packages and bench). Exits 0; prints one ``file:line  importer -> module`` per import.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("demote", "langchain_demote", "llamaindex_demote", "bench")
OURS = frozenset(DEFAULT)


def module_name(path: Path) -> str:
    """The dotted name of the module at ``path``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str, path: Path) -> str:
    """The package a module lives in (a package's ``__init__`` is inside itself)."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def is_module(name: str) -> bool:
    """Whether ``name`` is one of our modules or packages (not a name inside one)."""
    rel = Path(*name.split("."))
    return (ROOT / rel.with_suffix(".py")).exists() or (ROOT / rel / "__init__.py").exists()


def private_targets(tree: ast.AST, package: str) -> Iterator[tuple[int, str]]:
    """``(line, private module)`` of each import in ``tree`` that names one of ours."""
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base]
            names += [f"{base}.{a.name}" for a in node.names if is_module(f"{base}.{a.name}")]
        for name in names:
            if name.split(".")[0] not in OURS:
                continue  # a third party's private module is its business
            parts = name.split(".")
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__") and i > 0:
                    yield node.lineno, ".".join(parts[: i + 1])
                    break


def crossing(paths: list[str]) -> list[tuple[str, int, str, str]]:
    """``(file, line, importer, private module)`` of each import from outside its owner."""
    found = []
    for top in paths:
        for path in sorted((ROOT / top).rglob("*.py")):
            module = module_name(path)
            package = package_of(module, path)
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for line, target in private_targets(tree, package):
                owner = target.rpartition(".")[0]
                if package == owner or package.startswith(owner + "."):
                    continue  # inside the owner's package
                found.append((str(path.relative_to(ROOT)), line, module, target))
    return found


def main(argv: list[str]) -> int:
    """Print the imports (or only their count, with ``--count``)."""
    count = "--count" in argv
    paths = [a for a in argv if not a.startswith("--")] or list(DEFAULT)
    found = sorted(set(crossing(paths)))
    if not count:
        for file, line, importer, target in found:
            print(f"{file}:{line}  {importer} -> {target}")
    print(f"{len(found)} private cross-package imports")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
