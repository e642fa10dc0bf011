"""The README's quick starts run as written, print what the README shows, every time.

Each ``python`` block of the README that shows its output (``#> `` lines after a print) is
run as a script in one temporary folder, twice, and after the others (agent, chain,
LlamaIndex, then all three again): every run must print exactly the ``#>`` lines and
nothing on stderr but LangChain's own deprecation warnings for the classes the chain
snippet uses on purpose (the README says so). A second run meeting the first run's files
must not log a re-sync or anything else.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

#: The headings whose snippets must run, in README order.
SECTIONS = (
    "## Quick start: LangChain",
    "### Chains on RunnableWithMessageHistory (deprecated by LangChain)",
    "## Quick start: LlamaIndex",
)

# LangChain's deprecation warnings for the two classes the chain snippet uses: the warning
# line, and the source line Python prints under it when it has one.
_EXPECTED_WARNING = re.compile(
    r"LangChainDeprecationWarning: (RunnableWithMessageHistory is deprecated|"
    r"The class `InMemoryChatMessageHistory` was deprecated)"
)


def snippets() -> dict[str, tuple[str, list[str]]]:
    """Heading -> (code, expected output) for every block with ``#>`` output lines."""
    found: dict[str, tuple[str, list[str]]] = {}
    heading = ""
    text = README.read_text()
    for match in re.finditer(
        r"^(#+ [^\n]*)$|^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL
    ):
        if match.group(1):
            heading = match.group(1).strip()
            continue
        code = match.group(2)
        expected = [line[3:] for line in code.splitlines() if line.startswith("#> ")]
        if expected:
            assert heading not in found, f"two snippets with output under {heading!r}"
            found[heading] = (code, expected)
    return found


def unexpected_stderr(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    left: list[str] = []
    skip_source = False
    for line in lines:
        if _EXPECTED_WARNING.search(line):
            skip_source = True
            continue
        if skip_source and line.startswith("  "):
            skip_source = False
            continue
        skip_source = False
        left.append(line)
    return left


def test_the_readme_has_the_three_quick_starts() -> None:
    assert tuple(snippets()) == SECTIONS


@pytest.mark.slow
def test_quick_starts_print_the_same_on_every_run_and_after_each_other(tmp_path: Path) -> None:
    found = snippets()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # a new user's
    for run in range(2):
        for heading in SECTIONS:
            code, expected = found[heading]
            script = tmp_path / f"snippet{SECTIONS.index(heading)}.py"
            script.write_text(code)
            done = subprocess.run(
                [sys.executable, script.name],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            where = f"{heading}, run {run + 1}"
            assert done.returncode == 0, f"{where}:\n{done.stderr}"
            assert done.stdout.splitlines() == expected, where
            assert unexpected_stderr(done.stderr) == [], f"{where}:\n{done.stderr}"
            if "RunnableWithMessageHistory" not in heading:
                assert done.stderr == "", f"{where}:\n{done.stderr}"
