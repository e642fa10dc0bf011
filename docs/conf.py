"""Sphinx configuration of the demote documentation (``make docs``).

Offline by design: no intersphinx (it would download inventories), a theme installed from
the package index, pages in Markdown (MyST) and the API reference from the docstrings
(autodoc + napoleon for Google style). ``make test`` builds with ``-W -n`` (warnings are
errors, every cross-reference must resolve), so a broken reference to demote's own API
fails the run. References to other libraries' types (LangChain, LlamaIndex, pydantic, the
standard library) cannot be checked without their inventories and are let through.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

import demote

project = "demote"
author = "the demote authors"
copyright = "the demote authors"
release = demote.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"demote {release}"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_class_signature = "separated"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # dataclass "Attributes:" as a field list, not duplicate entries
napoleon_use_rtype = False

nitpicky = True
# Our own packages are checked; everything else has no inventory offline.
_OURS = ("demote", "langchain_demote", "llamaindex_demote")
nitpick_ignore_regex = [
    (r"py:.*", r"(?!(demote|langchain_demote|llamaindex_demote)(\.|$)).*"),
    (r"py:.*", r"(demote|langchain_demote|llamaindex_demote)\..*\.[A-Z]$"),  # TypeVars
    (r"py:.*", r".*\._[A-Za-z].*"),  # private names are not in the reference
]

_log = logging.getLogger("demote.docs")


def _resolve_reexport(app: Sphinx, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve ``demote.Demoter`` to ``demote.engine.Demoter`` and the like.

    Docstrings and annotations name an object by its public path or by the module that
    defines it; the reference documents it once. Try the target's tail ("Demoter",
    "Demoter.load") against the documented objects of the same package.
    """
    if node.get("refdomain") != "py":
        return None
    target = str(node.get("reftarget", ""))
    root = target.split(".", 1)[0]
    if root not in _OURS:
        return None
    py = env.get_domain("py")
    parts = target.split(".")
    for i in range(1, len(parts)):
        tail = "." + ".".join(parts[i:])
        found = [name for name in py.objects if name.startswith(root + ".") and name.endswith(tail)]
        if found:
            new = min(found, key=len)
            for typ in (node.get("reftype", "obj"), "obj"):
                ref = py.resolve_xref(
                    env, node.get("refdoc", ""), app.builder, typ, new, node, contnode
                )
                if ref is not None:
                    return ref
    return None


_UNDERLINE = re.compile(r"^([-=~^\"'`#*+])\1{2,}$")


def _headings_to_rubrics(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Show a docstring's section headings ("Theory of operation") as rubrics.

    A heading inside an autodoc entry would open a section of the page and add a label
    that collides with the same heading of another module.
    """
    for i in range(len(lines) - 1):
        title, rule = lines[i].strip(), lines[i + 1].strip()
        if title and _UNDERLINE.match(rule) and len(rule) >= len(title):
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            lines[i], lines[i + 1] = f"{indent}.. rubric:: {title}", ""


def _public_bases(app: Sphinx, name: str, obj: Any, options: Any, bases: list[Any]) -> None:
    """Leave private helper bases (``_Model``, ``demote._closing.Closing``) out of "Bases"."""
    bases[:] = [
        b
        for b in bases
        if not any(part.startswith("_") for part in f"{b.__module__}.{b.__qualname__}".split("."))
    ] or [object]


def _check_complete(app: Sphinx, env: Any) -> None:
    """Every name a public package exports has an entry in the API reference."""
    py = env.get_domain("py")
    documented = set(py.objects)
    for package in _OURS:
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            canonical = (
                f"{getattr(obj, '__module__', package)}.{getattr(obj, '__qualname__', name)}"
            )
            if f"{package}.{name}" not in documented and canonical not in documented:
                _log.warning("API reference: %s.%s is exported but not documented", package, name)


def setup(app: Sphinx) -> None:
    """Connect the reference checks and docstring tweaks above."""
    app.connect("missing-reference", _resolve_reexport)
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-process-docstring", _headings_to_rubrics)
    app.connect("env-check-consistency", _check_complete)
