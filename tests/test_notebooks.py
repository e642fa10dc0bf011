"""Every notebook in ``notebooks/`` runs offline, top to bottom, in a fresh kernel.

The kernel is this interpreter (``sys.executable -m ipykernel_launcher``, from a private
kernelspec), whatever kernelspecs the machine has, with telemetry and tracing off. It runs
in an empty temporary folder, not beside the repository, so a notebook that reads a file
outside the installed package fails here as it would for a user. A notebook that raises
fails its test with the failing cell's error; plots must come out as images. Notebooks are
kept in git without outputs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

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


def _kernel(tmp_path: Path) -> tuple[Any, dict[str, str]]:
    """A kernel manager running this interpreter, and the kernel's environment."""
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
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MEM0_API_KEY"):
        env.pop(key, None)
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
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_outputs_are_stripped(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    km, env = _kernel(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    client = nbclient.NotebookClient(
        nb, km=km, timeout=TIMEOUT, kernel_name=KERNEL, resources={"metadata": {"path": str(work)}}
    )
    try:
        client.execute(cwd=str(work), env=env)
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name} failed:\n{exc}")
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
