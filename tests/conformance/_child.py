"""Run a test's helper script in a new Python process and read the JSON line it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_child(script: Path, *args: object, timeout: float = 180) -> dict[str, Any]:
    """The last stdout line of ``python script *args`` as JSON, or ``{"error": stderr}``."""
    done = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # conftest set telemetry off
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        return {"error": done.stderr}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
