"""Type hints throughout: ``python3 -m mypy tfgraph exporters`` reports no issue.

The settings are [tool.mypy] in pyproject.toml (every function in tfgraph/ and exporters/
annotated). mypy keeps its cache in .mypy_cache/ at the top of the repository, so a rerun checks
only what changed (about 2 s); a first run takes about 20 s. It runs in a child process, not
through ``mypy.api.run``: in-process, the pytest worker would keep mypy's heap (about 1 GB of
objects) to the end, slowing its garbage collections and adding 10-25 s to its exit, which the
command line skips (mypy leaves with ``os._exit``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_path_links_tfgraph_exporters_to_exporters() -> None:
    # mypy resolves imports of tfgraph.exporters.* through this link (see [tool.mypy]).
    link = ROOT / ".mypy_path" / "tfgraph" / "exporters"
    assert link.is_symlink() and link.resolve() == (ROOT / "exporters").resolve(), (
        f"{link} must be a symbolic link to exporters/ (git clone with symlinks enabled)")


def test_mypy_is_clean() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "tfgraph", "exporters"],
        cwd=ROOT, capture_output=True, text=True, check=False)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mypy tfgraph exporters found problems:\n{report}"
