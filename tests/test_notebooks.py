"""Every notebook in ``notebooks/`` runs offline, top to bottom, in a fresh kernel.

The kernel is this interpreter (``sys.executable -m ipykernel_launcher``, from a private
kernelspec), whatever kernelspecs the machine has, with telemetry and tracing off. It runs
in an empty temporary folder, not beside the repository, so a notebook that reads a file
outside the installed package fails here as it would for a user. A notebook that raises
fails its test with the failing cell's error; plots must come out as images. Notebooks are
kept in git without outputs.

Notebooks teach what a user writes, so they import only public API: the modules the API
reference documents (not the ``demote demo`` command's own modules), and of each only
the names its ``__all__`` exports. Models are the frameworks' own offline stand-ins.

A notebook section that needs PostgreSQL runs when ``DATABASE_URL`` is set, and says that
it is skipped otherwise. The plain runs here give notebooks no service; the durable agent
notebook runs once more on ``DEMOTE_TEST_POSTGRES_URL`` (in a schema of its own), skipped
with the service tests' reason when it is not set.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.pg_schema import schema_of_its_own

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
TIMEOUT = 180  # seconds per cell
KERNEL = "demote-tests"


# jupyter_client leaves zmq sockets to the garbage collector; that is not our failure.
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


#: The project's packages, whose imports must be public API.
PACKAGES = ("demote", "langchain_demote", "llamaindex_demote")
DOCUMENTED = {
    name
    for page in (REPO / "docs" / "api").glob("*.md")
    for name in re.findall(r"^\.\. automodule:: (\S+)", page.read_text(), re.MULTILINE)
}


def _kernel(tmp_path: Path, services: dict[str, str]) -> tuple[Any, dict[str, str]]:
    """A kernel manager running this interpreter, and the kernel's environment.

    ``services`` are the only service URLs the kernel sees (``DATABASE_URL``).
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    env = {
        **os.environ,
        "MEM0_TELEMETRY": "False",
        "MEM0_DIR": str(tmp_path / "mem0"),
        "TMPDIR": str(tmp_path),  # the notebooks' mkdtemp folders go where pytest cleans up
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "ANONYMIZED_TELEMETRY": "False",
        "HF_HUB_OFFLINE": "1",
        "DEMOTE_LOCOMO": "",  # the optional LoCoMo replay stays off: built-in data only
        # The repository itself first, so the packages import from this checkout.
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
    }
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MEM0_API_KEY", "DATABASE_URL", "REDIS_URL"):
        env.pop(key, None)
    env.update(services)
    # A private kernelspec whose argv is this interpreter, whatever is installed elsewhere.
    spec = tmp_path / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "demote tests", "language": "python"})
    )
    specs = KernelSpecManager(kernel_dirs=[str(spec.parent)])
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs), env


def test_notebooks_exist() -> None:
    names = [p.name for p in NOTEBOOKS]
    assert names == [
        "01_langchain_quickstart.ipynb",
        "02_llamaindex.ipynb",
        "03_strategies_and_caches.ipynb",
        "04_mem0.ipynb",
        "05_durable_agent.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_outputs_are_stripped(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs"


def imports(source: str) -> list[tuple[str, str | None]]:
    """``(module, name)`` for each import of the project's packages in ``source``.

    ``import demote.x`` gives ``("demote.x", None)``. IPython lines (``%matplotlib``,
    top-level ``await``) are fine: the cell is parsed as the body of an async function.
    """
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%"))
    tree = ast.parse("async def cell():\n" + "\n".join("    " + line for line in code.splitlines()))
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
    return [(m, n) for m, n in found if m.split(".")[0] in PACKAGES]


def not_public(module: str, name: str | None) -> str | None:
    """Why importing ``name`` from ``module`` is not public API (``None``: it is)."""
    if re.fullmatch(r"demo(_\w+)?", module.rsplit(".", 1)[-1]):
        return f"{module} is the demo command's own module"
    if module not in DOCUMENTED and module not in PACKAGES:
        return f"{module} is not in the API reference (docs/api)"
    exported = getattr(importlib.import_module(module), "__all__", None)
    if name is not None and (exported is None or name not in exported):
        return f"{module}.{name} is not in {module}.__all__"
    return None


def test_imports_are_found_and_judged() -> None:
    cell = (
        "%matplotlib inline\nfrom demote.cli.demo import builtin_script\nawait f()\nimport demote.x"
    )
    assert imports(cell) == [("demote.cli.demo", "builtin_script"), ("demote.x", None)]
    assert not_public("demote.cli.demo", "builtin_script") is not None
    assert not_public("demote.cli.demo_parts", "Script") is not None
    assert not_public("langchain_demote.demo", "OfflineChatModel") is not None
    assert not_public("demote.cli.offline", "OfflineResponder") is None  # documented, exported
    assert not_public("demote.engine._work", "Work") is not None
    assert not_public("demote", "_built") is not None
    assert not_public("langchain_demote", "DemotingMiddleware") is None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_uses_only_public_api(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    found = [i for cell in nb.cells if cell.cell_type == "code" for i in imports(cell.source)]
    assert found, f"{path.name} imports nothing of demote"
    problems = [why for module, name in found if (why := not_public(module, name))]
    assert problems == [], f"{path.name}: {problems}"


def _execute(path: Path, tmp_path: Path, services: dict[str, str]) -> Any:
    """Run the notebook in a fresh kernel in an empty folder; the executed notebook."""
    nb = nbformat.read(path, as_version=4)
    km, env = _kernel(tmp_path, services)
    work = tmp_path / "work"
    work.mkdir()
    client = nbclient.NotebookClient(
        nb, km=km, timeout=TIMEOUT, kernel_name=KERNEL, resources={"metadata": {"path": str(work)}}
    )
    try:
        client.execute(cwd=str(work), env=env)
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name} failed:\n{exc}")
    return nb


def _stdout(nb: Any) -> list[str]:
    """The lines the notebook's cells printed."""
    return [
        line
        for cell in nb.cells
        if cell.cell_type == "code"
        for o in cell.outputs
        if o.get("name") == "stdout"
        for line in o["text"].splitlines()
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    nb = _execute(path, tmp_path, services={})
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    plotted = sum(1 for cell in nb.cells if "plt." in cell.source or "plot_windows" in cell.source)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= (2 if path.name.startswith("03") else 0), path.name
    # A figure shown as its text repr ("<Figure size 900x450 with 1 Axes>") is not a plot.
    texts = [
        o.get("data", {}).get("text/plain", "")
        for o in outputs
        if "image/png" not in o.get("data", {})
    ]
    assert not any(t.startswith("<Figure") for t in texts), texts
    assert plotted == 0 or images, path.name
    if any("DATABASE_URL" in cell.source for cell in nb.cells):
        assert "DATABASE_URL is not set: the PostgreSQL section is skipped" in _stdout(nb)


DURABLE = REPO / "notebooks" / "05_durable_agent.ipynb"


@pytest.mark.slow
@pytest.mark.postgres
def test_durable_agent_notebook_on_postgres(postgres_url: str, tmp_path: Path) -> None:
    url, drop = schema_of_its_own(postgres_url, "notebook")
    try:
        lines = _stdout(_execute(DURABLE, tmp_path, services={"DATABASE_URL": url}))
    finally:
        drop()
    postgres = [line for line in lines if line.startswith("PostgreSQL")]
    assert postgres == [
        "PostgreSQL: 22 messages in the thread; 14 archived",
        "PostgreSQL, restarted: 24 messages in the thread; 2 delivered by this process",
        "PostgreSQL, erased: True 0 0",
    ], lines
    # The SQLite section ran as in the plain run: the restart delivered only what was new.
    assert "24 messages in the thread; 2 delivered by this process; 16 archived" in lines


def test_the_langchain_notebook_leads_with_agents() -> None:
    nb = nbformat.read(REPO / "notebooks" / "01_langchain_quickstart.ipynb", as_version=4)
    code = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    agent = next(i for i, c in enumerate(code) if "DemotingMiddleware(" in c)
    chain = next(i for i, c in enumerate(code) if "RunnableWithMessageHistory(" in c)
    assert agent < chain and "create_agent(" in code[agent]
    headings = [
        line
        for cell in nb.cells
        if cell.cell_type == "markdown"
        for line in cell.source.splitlines()
        if line.startswith("#")
    ]
    assert "create_agent" in nb.cells[0].source and "agent" in headings[0].lower(), headings[0]
    chain_heading = next(h for h in headings if "RunnableWithMessageHistory" in h)
    assert "deprecated" in chain_heading, chain_heading
