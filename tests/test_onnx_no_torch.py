"""The ONNX path never imports torch (README.md, "How it works"): checked in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def fresh(code: str, cwd: Path) -> dict:  # type: ignore[type-arg]
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_to_onnx_and_an_onnxruntime_run_leave_torch_unimported(tmp_path: Path) -> None:
    code = f"""
import json, sys
import numpy as np
import tfgraph
from tfgraph.exporters import to_onnx
from tfgraph.exporters.onnx import runtime as rt
graph = tfgraph.compile({str(ROOT / "specs" / "tiny-llama.yaml")!r})
model = to_onnx(graph, seed=1)
session, ran, why = rt.create_session(model.SerializeToString(), "auto")
iface = rt.interface(model, "m")
out = rt.run(session, rt.random_ids(iface, 2, 9))
print(json.dumps({{"torch": sorted(m for m in sys.modules if m == "torch" or
                                  m.startswith("torch.")), "shape": list(out.shape)}}))
"""
    got = fresh(code, tmp_path)
    assert got == {"torch": [], "shape": [2, 9, 256]}


def test_cli_build_to_onnx_with_weights_leaves_torch_unimported(tmp_path: Path) -> None:
    code = f"""
import json, sys
import tfgraph
from tfgraph.graph.weights import generate, save_weights
from tfgraph.cli import main
spec = {str(ROOT / "specs" / "tiny.yaml")!r}
save_weights(generate(tfgraph.compile(spec), 3), "w.safetensors")
try:
    main(["build", spec, "--to", "onnx", "--weights", "w.safetensors", "-o", "m.onnx"])
except SystemExit as e:
    code = e.code
print(json.dumps({{"torch": [m for m in sys.modules if m == "torch" or m.startswith("torch.")],
                   "code": code}}))
"""
    got = fresh(code, tmp_path)
    assert got == {"torch": [], "code": 0}
    assert (tmp_path / "m.onnx").is_file()
