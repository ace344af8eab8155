"""Generating with trained weights (issue 28 item 6): ``tfgraph generate SPEC --weights
FILE.safetensors`` and ``tfgraph.generate(module, ...)`` with a module from ``to_torch``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch

from cli_support import refused
from cli_support import tfgraph as run_cli
from conftest import ROOT

LLAMA = ROOT / "specs" / "tiny-llama.yaml"
T5 = ROOT / "specs" / "tiny-t5.yaml"
PROMPTS = [[5, 17, 42], [7, 9]]


def trained(spec: Path, path: Path) -> torch.nn.Module:
    """A module whose weights no seed gives (a stand-in for training), saved to ``path``."""
    model = to_torch(tfgraph.compile(spec), seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5).add_(0.01)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model


@pytest.mark.parametrize("spec", [LLAMA, T5], ids=["decoder", "encoder-decoder"])
def test_a_module_and_its_saved_weights_generate_alike(spec: Path, tmp_path: Path) -> None:
    model = trained(spec, tmp_path / "w.safetensors")
    kw = {"max_new_tokens": 8, "eos_token_id": None}
    from_module = tfgraph.generate(model, PROMPTS, **kw).tokens
    for backend in ("onnx", "torch"):
        got = tfgraph.generate(spec, PROMPTS, weights=tmp_path / "w.safetensors",
                               backend=backend, **kw).tokens
        assert got == from_module, backend
    # not what random weights give: the file's values were used
    assert tfgraph.generate(spec, PROMPTS, weights_seed=3, **kw).tokens != from_module


def test_a_module_in_training_mode_generates_without_dropout_and_stays_in_it() -> None:
    model = to_torch(tfgraph.compile(T5), seed=1)  # tiny-t5: dropout 0.1
    want = tfgraph.generate(model.eval(), PROMPTS, max_new_tokens=6, eos_token_id=None).tokens
    model.train()
    got = tfgraph.generate(model, PROMPTS, max_new_tokens=6, eos_token_id=None).tokens
    assert got == want
    assert model.training


def test_the_cli_takes_weights(tmp_path: Path) -> None:
    model = trained(LLAMA, tmp_path / "w.safetensors")
    want = tfgraph.generate(model, [[5, 17, 42]], max_new_tokens=5, eos_token_id=None).tokens
    out = run_cli("generate", str(LLAMA), "--weights", str(tmp_path / "w.safetensors"),
                  "--prompt-ids", "5,17,42", "--max-new-tokens", "5", "--ignore-eos", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tokens"] == want


def test_weights_refusals(tmp_path: Path) -> None:
    trained(LLAMA, tmp_path / "w.safetensors")
    refused(run_cli("generate", str(LLAMA), "--weights", str(tmp_path / "w.safetensors"),
                    "--weights-seed", "2", "--prompt-ids", "1"), "--weights-seed")
    model = tmp_path / "m.onnx"
    assert run_cli("build", str(LLAMA), "--to", "onnx", "-o", str(model)).returncode == 0
    refused(run_cli("generate", str(model), "--weights", str(tmp_path / "w.safetensors"),
                    "--prompt-ids", "1"), "own weights")
    # --weights-seed would be ignored by the model's initializers: refused the same way
    refused(run_cli("generate", str(model), "--weights-seed", "3", "--prompt-ids", "1"),
            "--weights-seed: an .onnx model carries its own weights")
    # a file for another spec: every mismatch named, before any work
    refused(run_cli("generate", str(ROOT / "specs" / "tiny-gemma.yaml"), "--weights",
                    str(tmp_path / "w.safetensors"), "--prompt-ids", "1"), "w.safetensors")
    with pytest.raises(TfgraphError, match="own weights"):
        tfgraph.generate(to_torch(tfgraph.compile(LLAMA)), [[1]], weights=tmp_path / "w.safetensors")
    with pytest.raises(TfgraphError, match="not a tfgraph model"):
        tfgraph.generate(torch.nn.Linear(2, 2), [[1]])  # type: ignore[arg-type]
