"""Packaging: what ``import tfgraph`` pulls in, the installed package list, the entry points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tfgraph

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


def test_import_tfgraph_needs_no_back_end_library() -> None:
    code = (
        "import sys, tfgraph, tfgraph.cli, tfgraph.exporters\n"
        "heavy = sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'graphviz', 'matplotlib')"
        " if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


def test_public_api() -> None:
    assert {"Spec", "load_spec", "__version__"} <= set(dir(tfgraph))
    assert tfgraph.__version__.count(".") >= 2
    spec = tfgraph.load_spec(ROOT / "specs" / "tiny.yaml")
    assert isinstance(spec, tfgraph.Spec)


def _package_dirs() -> set[str]:
    """Every folder with an __init__.py, named as it is installed."""
    found = set()
    for top, installed in (("tfgraph", "tfgraph"), ("exporters", "tfgraph.exporters")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((installed, *rel)))
    return found


def test_every_package_folder_is_installed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"]["tfgraph.exporters"] == "exporters"
    missing = _package_dirs() - set(config["packages"])
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"


def test_console_script_points_at_the_click_group() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["tfgraph"] == "tfgraph.cli:main"
    assert {"test"} <= set(project["optional-dependencies"])


def test_python_dash_m_tfgraph(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tfgraph", "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == f"tfgraph, version {tfgraph.__version__}"
