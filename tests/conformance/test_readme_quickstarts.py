"""The README's quick starts run as written, print what the README shows, every time.

Each ``python`` block of the README that shows its output (``#> `` lines after a print) is
run as a script in one temporary folder, twice, and after the others (agent, chain,
LlamaIndex, then all three again): every run must print exactly the ``#>`` lines and
nothing on stderr but LangChain's own deprecation warnings for the classes the chain
snippet uses on purpose (the README says so). A second run meeting the first run's files
must not log a re-sync or anything else.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance._snippets import child_env, snippets, unexpected_stderr

#: The headings whose snippets must run, in README order.
SECTIONS = (
    "## Quick start: LangChain",
    "### Chains on RunnableWithMessageHistory (deprecated by LangChain)",
    "## Quick start: LlamaIndex",
)


def test_the_readme_has_the_three_quick_starts() -> None:
    assert tuple(snippets()) == SECTIONS


@pytest.mark.slow
def test_quick_starts_print_the_same_on_every_run_and_after_each_other(tmp_path: Path) -> None:
    found = snippets()
    (tmp_path / "mem0").mkdir()
    env = child_env(tmp_path / "mem0")  # a new user's, importing this checkout
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
