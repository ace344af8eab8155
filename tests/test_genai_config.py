"""genai_config.json next to a KV-cache ONNX model: onnxruntime-genai can drive it.

The config's names must be the model's inputs and outputs, its sizes those of the cache the
model takes; when onnxruntime-genai is installed (it is not in CI: it pulls its own
onnxruntime; benchmarks/decode.py installs it in a venv of its own), ``og.Generator`` must
produce the tokens ``tfgraph generate`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from tfgraph.cli import main

from conftest import ROOT

SPEC = ROOT / "specs" / "tiny-llama.yaml"
PROMPT = [5, 17, 42, 7]


def build(tmp_path: Path) -> Path:
    out = tmp_path / "model" / "model.onnx"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["build", str(SPEC), "--to", "onnx", "--kv-cache",
                                       "-o", str(out), "--seed", "2"])
    assert result.exit_code == 0, result.output
    return out


def test_the_config_names_the_models_interface(tmp_path: Path) -> None:
    out = build(tmp_path)
    config = json.loads((out.parent / "genai_config.json").read_text())
    model = onnx.load(str(out))
    inputs = {i.name: i for i in model.graph.input}
    outputs = [o.name for o in model.graph.output]
    decoder = config["model"]["decoder"]
    assert decoder["filename"] == "model.onnx"
    layers = decoder["num_hidden_layers"]
    names = decoder["inputs"]
    assert {names[k] for k in ("input_ids", "attention_mask", "position_ids")} <= set(inputs)
    for i in range(layers):
        for kind in ("key", "value"):
            past = inputs[names[f"past_{kind}_names"] % i]
            dims = [d.dim_param or d.dim_value for d in past.type.tensor_type.shape.dim]
            assert dims == ["batch", decoder["num_key_value_heads"], "past_len",
                            decoder["head_size"]]
            assert decoder["outputs"][f"present_{kind}_names"] % i in outputs
    assert f"past_key_values.{layers}.key" not in inputs  # every layer, no more
    assert decoder["outputs"]["logits"] == outputs[0]
    assert config["search"]["past_present_share_buffer"] is False  # the cache is concatenated


OG_SCRIPT = """
import json, sys
import numpy as np
import onnxruntime_genai as og
folder, prompt, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
model = og.Model(folder)
params = og.GeneratorParams(model)
params.set_search_options(max_length=len(prompt) + new, do_sample=False)
generator = og.Generator(model, params)
generator.append_tokens(np.array([prompt], dtype=np.int32))
out = []
while not generator.is_done():
    generator.generate_next_token()
    out.append(int(generator.get_next_tokens()[0]))
print(json.dumps(out))
"""


def genai_python() -> str | None:
    """A Python that has onnxruntime-genai: this one, or $TFGRAPH_GENAI_PYTHON (the venv
    benchmarks/hf_build.py makes: benchmarks/.cache/genai-venv/bin/python)."""
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec("onnxruntime_genai") is not None:
        return sys.executable
    return os.environ.get("TFGRAPH_GENAI_PYTHON")


def test_onnxruntime_genai_generates_tfgraphs_tokens(tmp_path: Path) -> None:
    import subprocess

    python = genai_python()
    if python is None:
        pytest.skip("onnxruntime-genai is not installed (set TFGRAPH_GENAI_PYTHON to a Python "
                    "that has it)")
    out = build(tmp_path)
    want = json.loads(CliRunner().invoke(main, [
        "generate", str(SPEC), "--weights-seed", "2", "--prompt-ids",
        ",".join(map(str, PROMPT)), "--max-new-tokens", "20", "--ignore-eos", "--json",
    ]).stdout)["tokens"][0]
    ran = subprocess.run([python, "-c", OG_SCRIPT, str(out.parent), json.dumps(PROMPT), "20"],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == want


def test_the_config_asks_for_cuda_when_told(tmp_path: Path) -> None:
    """Issue 24 item 2: ``--genai-provider cuda`` selects onnxruntime-genai's CUDA provider
    (measured on an H200: its generator on tfgraph's float16 model went from 22 tokens/s, the
    CPU, to 250 at batch 1); the default asks for none, the CPU."""
    out = tmp_path / "model.onnx"
    result = CliRunner().invoke(main, ["build", str(SPEC), "--to", "onnx", "--kv-cache",
                                       "--genai-provider", "cuda", "-o", str(out)])
    assert result.exit_code == 0, result.output
    options = json.loads((tmp_path / "genai_config.json").read_text())
    assert options["model"]["decoder"]["session_options"]["provider_options"] == [{"cuda": {}}]
    (tmp_path / "cpu").mkdir()
    default = json.loads((build(tmp_path / "cpu").parent / "genai_config.json").read_text())
    assert default["model"]["decoder"]["session_options"]["provider_options"] == []


def test_genai_provider_needs_a_kv_cache_build(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["build", str(SPEC), "--to", "onnx", "--genai-provider",
                                       "cuda", "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 2 and "--kv-cache" in result.output
    assert not (tmp_path / "m.onnx").exists()


def test_a_model_without_position_ids_lists_none(tmp_path: Path) -> None:
    """ALiBi (BLOOM) adds its bias from the mask: the model has no position_ids input, so the
    config names none (onnxruntime-genai would feed a name the model lacks)."""
    out = tmp_path / "model.onnx"
    result = CliRunner().invoke(main, ["build", str(ROOT / "specs" / "tiny-bloom.yaml"),
                                       "--to", "onnx", "--kv-cache", "-o", str(out)])
    assert result.exit_code == 0, result.output
    inputs = {i.name for i in onnx.load(str(out)).graph.input}
    assert "position_ids" not in inputs
    names = json.loads((tmp_path / "genai_config.json").read_text())["model"]["decoder"]["inputs"]
    assert "position_ids" not in names
    assert {names["input_ids"], names["attention_mask"]} <= inputs
