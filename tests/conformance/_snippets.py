"""The fenced code blocks of the README and the docs pages, and how their runs are judged.

Shared by test_readme_quickstarts (the README's quick starts) and test_docs_snippets
(every other ``python`` block). A block's shown output is its ``#> `` lines.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

_OPENING = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")

# LangChain's deprecation warnings for the two classes the chain snippets use on purpose:
# the warning line, and the source line Python prints under it when it has one.
_EXPECTED_WARNING = re.compile(
    r"LangChainDeprecationWarning: (RunnableWithMessageHistory is deprecated|"
    r"The class `InMemoryChatMessageHistory` was deprecated)"
)

#: Keys the child processes must not see (conftest drops them from this process too).
_API_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MEM0_API_KEY", "LANGSMITH_API_KEY")


@dataclass(frozen=True)
class Fence:
    """One fenced block of a page."""

    path: Path
    index: int  # 1-based, among the page's blocks of the same language
    line: int  # the page's line of the block's first code line (1-based)
    info: str  # what follows the opening fence: "python", "{include} ../../README.md"
    code: str  # dedented by the opening fence's indent
    heading: str  # the nearest heading above it

    @property
    def page(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    @property
    def language(self) -> str:
        return self.info.split(maxsplit=1)[0] if self.info else ""

    @property
    def expected(self) -> list[str]:
        """The output the block shows: its ``#> `` lines, without the marker."""
        return [line[3:] for line in self.code.splitlines() if line.startswith("#> ")]


def pages() -> list[Path]:
    """The README, then every Markdown page of the docs (not the built site)."""
    built = DOCS / "_build"
    return [README, *sorted(p for p in DOCS.rglob("*.md") if built not in p.parents)]


def fences(path: Path) -> list[Fence]:
    """Every fenced block of ``path`` (backticks or tildes, indented in a list or not)."""
    lines = path.read_text().splitlines()
    found: list[Fence] = []
    counts: dict[str, int] = {}
    heading = ""
    i = 0
    while i < len(lines):
        opening = _OPENING.match(lines[i])
        if opening is None:
            if re.match(r"#+ ", lines[i]):
                heading = lines[i].strip()
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), len(lines))
        body = [
            line[indent:] if not line[:indent].strip() else line.lstrip()
            for line in lines[i + 1 : end]
        ]
        info = opening["info"].strip()
        language = info.split(maxsplit=1)[0] if info else ""
        counts[language] = counts.get(language, 0) + 1
        code = "\n".join(body) + "\n"
        found.append(Fence(path, counts[language], i + 2, info, code, heading))
        i = end + 1
    return found


def python_blocks(path: Path) -> list[Fence]:
    """The ``python`` blocks of ``path``, in page order."""
    return [fence for fence in fences(path) if fence.language == "python"]


def snippets() -> dict[str, tuple[str, list[str]]]:
    """Heading -> (code, expected output) for every block with ``#>`` output lines."""
    found: dict[str, tuple[str, list[str]]] = {}
    for block in python_blocks(README):
        if block.expected:
            assert block.heading not in found, f"two snippets with output under {block.heading!r}"
            found[block.heading] = (block.code, block.expected)
    return found


def child_env(mem0_dir: Path) -> dict[str, str]:
    """A new user's environment for a snippet's process, importing this checkout.

    No ``PYTHONWARNINGS`` (a new user's default warnings), no API keys, no telemetry or
    tracing, mem0's home in ``mem0_dir``, and this checkout first on the path (a shared
    virtualenv may have demote installed from another one).
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS" and k not in _API_KEYS}
    env.update(
        MEM0_TELEMETRY="False",
        MEM0_DIR=str(mem0_dir),
        LANGSMITH_TRACING="false",
        LANGCHAIN_TRACING_V2="false",
        ANONYMIZED_TELEMETRY="False",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(ROOT),
    )
    return env


def unexpected_stderr(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are not the expected LangChain deprecation warnings."""
    left: list[str] = []
    skip_source = False
    for line in stderr.splitlines():
        if _EXPECTED_WARNING.search(line):
            skip_source = True
            continue
        if skip_source and line.startswith("  "):
            skip_source = False
            continue
        skip_source = False
        left.append(line)
    return left
