"""examples/hf-checkpoint/roundtrip.py --quick, run as a user runs it (issue 14).

The script makes a random Llama folder with save_pretrained, builds it to ONNX with the KV
cache, and checks `tfgraph generate`'s greedy tokens against transformers' `generate`; then
builds a sliding-window variant `--to hf` and checks its logits and tokens in transformers
against tfgraph. It exits 0 only when every check holds; this test also reads its --json-out
report, so a check that silently disappeared would fail here too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "examples" / "hf-checkpoint" / "roundtrip.py"
CHECKS = (
    ["prompt token counts equal"]
    + [f"prompt {i}: {what} equal" for i in (1, 2, 3) for what in ("tokens", "text")]
    + ["transformers loads it as a sliding-window model",
       "logits: transformers == tfgraph torch module (atol 1e-4)",
       "the window matters (logits differ from no window only beyond it)"]
    + [f"variant prompt {i}: tokens equal" for i in (1, 2, 3)]
)


def test_quick_roundtrip(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path / "out"),
         "--json-out", str(report)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(f"ok: {len(CHECKS)} checks hold")
    data = json.loads(report.read_text())
    assert data["ok"] is True and data["mode"] == "quick"
    assert data["checks"] == {name: True for name in CHECKS}
    assert data["variant_logits_max_abs_diff"] <= 1e-4
    # what it wrote: the HF folder with its tokenizer, the cached ONNX model, the variant
    out = tmp_path / "out"
    assert (out / "llama-hf" / "tokenizer.json").is_file()
    assert (out / "llama-onnx" / "model.onnx").is_file()
    assert (out / "llama-onnx" / "tokenizer.json").is_file()  # copied by `tfgraph build`
    assert json.loads((out / "llama-window-hf" / "config.json").read_text())[
        "model_type"] == "mistral"
    assert "window: 8" in (out / "llama-window.yaml").read_text()
