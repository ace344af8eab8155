"""Golden DOT files: every spec in specs/ at model and layer level (tests/golden/*.dot).

DOT output is deterministic (graph order, palette order), so any change to a drawing shows up
here as a reviewable text diff. After an intended change, regenerate the files with

    TFGRAPH_REGEN_GOLDEN=1 python3 -m pytest -q tests/test_diagram_golden.py

and commit them with the change. A missing golden file is a failure, not a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ROOT, SPEC_FILES

import tfgraph
from tfgraph.exporters.diagram.draw import diagram_source

GOLDEN = ROOT / "tests" / "golden"
LEVELS = ("model", "layer")
REGEN = os.environ.get("TFGRAPH_REGEN_GOLDEN") == "1"
CASES = [(spec, level) for spec in SPEC_FILES for level in LEVELS]


def golden_path(spec: Path, level: str) -> Path:
    return GOLDEN / f"{spec.stem}-{level}.dot"


@pytest.mark.parametrize(("spec", "level"), CASES,
                         ids=[f"{s.stem}-{lv}" for s, lv in CASES])
def test_dot_matches_golden(spec: Path, level: str) -> None:
    source = diagram_source(tfgraph.compile(spec), level)
    path = golden_path(spec, level)
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(source, encoding="utf-8")
    assert path.exists(), f"{path.name} missing: regenerate with TFGRAPH_REGEN_GOLDEN=1"
    assert source == path.read_text(encoding="utf-8"), (
        f"{path.name} differs from the drawing; if the change is intended, regenerate with "
        "TFGRAPH_REGEN_GOLDEN=1 python3 -m pytest -q tests/test_diagram_golden.py")


def test_no_stale_golden_files() -> None:
    expected = {golden_path(s, lv).name for s, lv in CASES}
    present = {p.name for p in GOLDEN.glob("*.dot")}
    assert present == expected, f"stale: {sorted(present - expected)}, " \
                                f"missing: {sorted(expected - present)}"
