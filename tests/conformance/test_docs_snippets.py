"""Every ``python`` block of the README and the docs runs as written and prints what it shows.

The convention (docs/development.md, "Code blocks"): a page's blocks run in order in one
new Python process, in an empty folder of the page's own, sharing one namespace, as a
reader runs the page from top to bottom. A block may use what an earlier block of its page
made, never what another page made. A block that shows output (``#> `` lines) must print
exactly those lines, one that shows none must print nothing, and the page's process must
leave nothing on stderr but LangChain's deprecation warnings for the classes the chain
snippets use on purpose. Blocks a page includes from another file (MyST ``{include}``) run
with that file.

The README's quick starts (its blocks with output) are run by test_readme_quickstarts,
each alone and twice; here they are only checked to be those, and the README's other
blocks run as its page. Nothing reaches the network: the processes get no API keys, no
telemetry, no tracing, and refuse connections beyond this machine. A page whose blocks
read ``os.environ["REDIS_URL"]`` or ``os.environ["DATABASE_URL"]`` runs on the test
services (``DEMOTE_TEST_REDIS_URL``, ``DEMOTE_TEST_POSTGRES_URL``, in a schema of its own)
and is skipped without them, like the other service tests.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conformance._run_blocks import END
from tests.conformance._snippets import (
    README,
    ROOT,
    Fence,
    child_env,
    fences,
    pages,
    python_blocks,
    snippets,
    unexpected_stderr,
)
from tests.support.pg_schema import schema_of_its_own

BLOCKS = [block for page in pages() for block in python_blocks(page)]

#: Fence languages that are not Python code: shell lines, sample output, Sphinx directives.
#: A fence of any other language fails the census, so no Python block escapes under
#: another name (``py``, ``{code-block} python``).
NOT_PYTHON = {"bash", "text", "", "{toctree}", "{eval-rst}", "{include}"}

#: Environment variables a block may read for a service URL: the service they name.
SERVICES = {"REDIS_URL": "redis", "DATABASE_URL": "postgres"}


def quick_start(block: Fence) -> bool:
    """Whether test_readme_quickstarts runs ``block`` (a README block with output)."""
    return block.path == README and bool(block.expected)


def services(page: str) -> list[str]:
    """The service variables the page's blocks read, in :data:`SERVICES` order."""
    code = "".join(b.code for b in BLOCKS if b.page == page)
    return [name for name in SERVICES if re.search(rf"os\.environ\[\"{name}\"\]", code)]


def test_every_python_block_of_every_page_is_found() -> None:
    assert BLOCKS
    assert {b.page for b in BLOCKS} >= {"README.md", "docs/strategies.md"}
    for page in pages():
        text = page.read_text()
        assert len(python_blocks(page)) == text.count("```python"), page  # as grep counts
        for fence in fences(page):
            where = f"{fence.page}:{fence.line}"
            assert fence.language in NOT_PYTHON | {"python"}, (
                f"{where}: a {fence.language!r} block; make it python (it is run) or name "
                "its language in NOT_PYTHON"
            )
            if fence.language == "{include}":
                included = (page.parent / fence.info.split(maxsplit=1)[1]).resolve()
                assert included in pages(), f"{where}: includes {included}, whose blocks never run"


def test_the_readme_quick_starts_are_the_ones_its_test_runs() -> None:
    ran = sorted(code for code, _ in snippets().values())
    assert sorted(b.code for b in BLOCKS if quick_start(b)) == ran


def test_blocks_import_this_checkout(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import demote; print(demote.__file__)"],
        cwd=tmp_path,
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert Path(done.stdout.strip()).is_relative_to(ROOT / "demote"), done.stdout


@dataclass(frozen=True)
class PageRun:
    """What one page's process did: each finished block's stdout lines, stderr, exit code."""

    outputs: list[list[str]]
    stderr: str
    returncode: int


def _run_page(page: str, folder: Path, scratch: Path, extra_env: dict[str, str]) -> PageRun:
    """Run the page's blocks in ``folder`` (empty), with its blocks file and mem0 in ``scratch``."""
    blocks = [
        {"path": str(b.path), "line": b.line, "code": b.code}
        for b in BLOCKS
        if b.page == page and not quick_start(b)
    ]
    (scratch / "blocks.json").write_text(json.dumps(blocks))
    (scratch / "mem0").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "tests.conformance._run_blocks", str(scratch / "blocks.json")],
        cwd=folder,
        env={**child_env(scratch / "mem0"), **extra_env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    chunks = done.stdout.split(END + "\n")
    return PageRun([c.splitlines() for c in chunks[:-1]], done.stderr, done.returncode)


@pytest.fixture(scope="module")
def page_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[str, dict[str, str]], PageRun]]:
    """Runs a page once (the first of its blocks' tests asks), then returns that run."""
    done: dict[str, PageRun] = {}
    cleanups: list[Callable[[], None]] = []

    def run(page: str, urls: dict[str, str]) -> PageRun:
        if page not in done:
            extra = dict(urls)
            if "DATABASE_URL" in extra:
                extra["DATABASE_URL"], drop = schema_of_its_own(extra["DATABASE_URL"])
                cleanups.append(drop)
            folder = tmp_path_factory.mktemp(re.sub(r"\W", "-", page))
            done[page] = _run_page(page, folder, tmp_path_factory.mktemp("run"), extra)
        return done[page]

    yield run
    for cleanup in cleanups:
        cleanup()


def _service_urls(page: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """The page's service URLs, from conftest's fixtures (which skip, or fail under CI)."""
    return {name: request.getfixturevalue(f"{SERVICES[name]}_url") for name in services(page)}


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.page}:{b.index}" for b in BLOCKS])
def test_block_runs_and_prints_what_it_shows(
    block: Fence,
    page_runs: Callable[[str, dict[str, str]], PageRun],
    request: pytest.FixtureRequest,
) -> None:
    if quick_start(block):
        return  # test_readme_quickstarts runs it (checked above)
    run = page_runs(block.page, _service_urls(block.page, request))
    order = [b for b in BLOCKS if b.page == block.page and not quick_start(b)].index(block)
    where = f"{block.page}:{block.line} ({block.heading})"
    if order > len(run.outputs):
        pytest.fail(f"{where}: not reached, an earlier block of the page failed")
    if order == len(run.outputs):
        pytest.fail(f"{where} failed (exit code {run.returncode}):\n{run.stderr}")
    hint = ""
    if re.search(r"^# > ", block.code, re.MULTILINE):  # what `ruff format` makes of "#> "
        hint = " (its '# > ' lines were '#> ': put the block between <!-- fmt: off/on -->)"
    assert run.outputs[order] == block.expected, where + hint


PAGES_RUN = sorted({b.page for b in BLOCKS if not quick_start(b)})


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_RUN)
def test_page_runs_to_its_end_with_a_clean_stderr(
    page: str, page_runs: Callable[[str, dict[str, str]], PageRun], request: pytest.FixtureRequest
) -> None:
    run = page_runs(page, _service_urls(page, request))
    assert run.returncode == 0, run.stderr
    assert unexpected_stderr(run.stderr) == [], run.stderr
