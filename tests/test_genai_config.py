"""genai_config.json next to a KV-cache ONNX model: onnxruntime-genai can drive it.

The config's names must be the model's inputs and outputs, its sizes those of the cache the
model takes; when onnxruntime-genai is installed (it pulls its own onnxruntime, so .ci/run
installs it in a venv of its own, .venv-genai, named by $TFGRAPH_GENAI_PYTHON),
``og.Generator`` must produce the tokens ``tfgraph generate`` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner

from tfgraph.cli import main

from conftest import ROOT

SPEC = ROOT / "specs" / "tiny-llama.yaml"
PROMPT = [5, 17, 42, 7]


def build(tmp_path: Path, fused: bool = False) -> Path:
    out = tmp_path / "model" / "model.onnx"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["build", str(SPEC), "--to", "onnx", "--kv-cache",
                                       "-o", str(out), "--seed", "2"]
                                + (["--fused-attention"] if fused else []))
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


def test_a_fused_models_config_shares_its_cache_buffers(tmp_path: Path) -> None:
    """Issue 24 item 2: the fused model's kernel writes into the buffer bound as its past, so
    onnxruntime-genai allocates one buffer per layer (its own GQA models' setting); where the
    fused kernel is refused (ALiBi) the written-out model's cache still grows."""
    config = json.loads((build(tmp_path, fused=True).parent / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    out = tmp_path / "alibi" / "model.onnx"
    result = CliRunner().invoke(main, ["build", str(ROOT / "specs" / "tiny-bloom.yaml"),
                                       "--to", "onnx", "--kv-cache", "--fused-attention",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    alibi = json.loads((out.parent / "genai_config.json").read_text())
    assert alibi["search"]["past_present_share_buffer"] is False


OG_SCRIPT = """
import json, sys
import numpy as np
import onnxruntime_genai as og
folder, rows, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
width = max(map(len, rows))
model = og.Model(folder)
params = og.GeneratorParams(model)
params.set_search_options(max_length=width + new, min_length=width + new, do_sample=False,
                          batch_size=len(rows))
generator = og.Generator(model, params)
# its batches of uneven prompts: each row's tokens first, then the pad id (0 here)
generator.append_tokens(np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.int32))
out = [[] for _ in rows]
while not generator.is_done():
    generator.generate_next_token()
    for row, token in zip(out, generator.get_next_tokens()):
        row.append(int(token))
print(json.dumps(out))
"""


def genai_python() -> str | None:
    """A Python that has onnxruntime-genai: this one, or $TFGRAPH_GENAI_PYTHON (CI's
    .venv-genai/bin/python, made by .ci/run; or the venv benchmarks/hf_build.py makes,
    benchmarks/.cache/genai-venv/bin/python)."""
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec("onnxruntime_genai") is not None:
        return sys.executable
    return os.environ.get("TFGRAPH_GENAI_PYTHON")


@pytest.mark.parametrize("rows", [[PROMPT], [PROMPT, [9, 8, 7, 6, 5, 4, 3]]],
                         ids=["one-prompt", "uneven-batch"])
@pytest.mark.parametrize("fused", [False, True], ids=["written-out", "fused"])
def test_onnxruntime_genai_generates_tfgraphs_tokens(tmp_path: Path, fused: bool,
                                                     rows: list[list[int]]) -> None:
    """Written out (cache concatenated) and fused (one shared buffer per layer, written in
    place by GroupQueryAttention): the generator's tokens are ``tfgraph generate``'s, for one
    prompt and for a batch of prompts of different lengths."""
    import subprocess

    python = genai_python()
    if python is None:
        pytest.skip("onnxruntime-genai is not installed (set TFGRAPH_GENAI_PYTHON to a Python "
                    "that has it)")
    out = build(tmp_path, fused)
    prompts = [a for row in rows for a in ("--prompt-ids", ",".join(map(str, row)))]
    want = json.loads(CliRunner().invoke(main, [
        "generate", str(SPEC), "--weights-seed", "2", *prompts, "--max-new-tokens", "20",
        "--ignore-eos", "--json"]).stdout)["tokens"]
    # tiny-llama names no end token: the config's stand-in, id 0, is one onnxruntime-genai
    # never emits (test_a_model_without_an_end_token_is_told_the_stand_in); these prompts'
    # tokens do not include it, or the comparison would not be like with like
    assert all(0 not in row for row in want), want
    ran = subprocess.run([python, "-c", OG_SCRIPT, str(out.parent), json.dumps(rows), "20"],
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


def test_a_bfloat16_config_for_the_cpu_comes_with_a_note(tmp_path: Path) -> None:
    """onnxruntime's CPU provider has no bfloat16 MatMul: a bfloat16 model whose config asks
    for the CPU (the default) is still written, with one note saying so; a CUDA config, or a
    float16 model on the CPU, gets none."""
    import onnxruntime as ort

    spec = str(ROOT / "specs" / "tiny-bf16.yaml")
    runs = {}
    for name, flags in (("cpu", []), ("cuda", ["--genai-provider", "cuda"]),
                        ("half", ["--dtype", "float16"])):
        (tmp_path / name).mkdir()
        runs[name] = CliRunner().invoke(main, ["build", spec, "--to", "onnx", "--kv-cache",
                                               "-o", str(tmp_path / name / "m.onnx"), *flags])
        assert runs[name].exit_code == 0, runs[name].output
        assert (tmp_path / name / "genai_config.json").is_file()
    notes = [line for line in runs["cpu"].stderr.splitlines() if "bfloat16 kernels" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "CPU" in notes[0], notes
    assert "--genai-provider cuda" in notes[0]
    assert "CPU provider" not in runs["cuda"].stderr + runs["half"].stderr
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):  # what the note forestalls
        ort.InferenceSession(str(tmp_path / "cpu" / "m.onnx"),
                             providers=["CPUExecutionProvider"])


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


def test_a_rebuild_replaces_its_own_config_and_no_other(tmp_path: Path) -> None:
    """The folder's genai_config.json belongs to the model it names: rebuilding that model
    (here fused, which turns the shared buffer on) replaces it; another model into the same
    folder is refused naming the first (onnxruntime-genai reads one config per folder), and
    writes nothing; a file of that name that is no such config is left alone."""
    out = build(tmp_path)
    config = out.parent / "genai_config.json"
    assert json.loads(config.read_text())["search"]["past_present_share_buffer"] is False
    fused = build_into(out, ["--fused-attention"])
    assert fused.exit_code == 0, fused.output
    assert json.loads(config.read_text())["search"]["past_present_share_buffer"] is True
    before = config.read_bytes()
    other = build_into(out.parent / "other.onnx", [])
    assert other.exit_code == 2, other.output
    assert "config of 'model.onnx'" in other.output and "folder of its own" in other.output
    assert not (out.parent / "other.onnx").exists() and config.read_bytes() == before
    config.write_text('{"mine": true}\n')
    foreign = build_into(out, [])
    assert foreign.exit_code == 2 and "exists with other content" in foreign.output
    assert config.read_text() == '{"mine": true}\n'


def build_into(out: Path, flags: list[str]) -> Any:
    return CliRunner().invoke(main, ["build", str(SPEC), "--to", "onnx", "--kv-cache", "-o",
                                     str(out), "--seed", "2", *flags])


@pytest.mark.parametrize(("tokens", "stand_in"), [(None, 0), ("{pad: 7}", 7), ("{eos: 9}", None)])
def test_a_model_without_an_end_token_is_told_the_stand_in(tmp_path: Path, tokens: str | None,
                                                           stand_in: int | None) -> None:
    """onnxruntime-genai refuses an end token outside the vocabulary: a model without one
    gets a stand-in (its padding id, else 0) that min_length = max_length keeps from ending
    a run, and so from ever being emitted; the build says so on stderr. A model with an end
    token gets none of it."""
    spec = tmp_path / "spec.yaml"
    text = SPEC.read_text()
    spec.write_text(text + (f"tokens: {tokens}\n" if tokens else ""))
    out = tmp_path / "m" / "model.onnx"
    result = CliRunner().invoke(main, ["build", str(spec), "--to", "onnx", "--kv-cache", "-o",
                                       str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out.parent / "genai_config.json").read_text())
    search = config["search"]
    if stand_in is None:
        assert "stands in" not in result.output
        assert config["model"]["eos_token_id"] == 9 and search["min_length"] == 0
    else:
        assert f"id {stand_in} stands in" in result.output
        assert config["model"]["eos_token_id"] == stand_in
        assert search["min_length"] == search["max_length"]


def test_a_probabilities_model_gets_no_config(tmp_path: Path) -> None:
    """``output: probs`` (tiny-sandwich): the KV-cache model's first output is ``probs``, and
    onnxruntime-genai's search reads its model's first output as logits (softmax, temperature,
    top-p over it), and by name ("Model output was not found: logits"): the model is written
    and tfgraph generate drives it, but without genai_config.json, a note on stderr says why;
    asking for a genai provider is refused."""
    from tfgraph.errors import TfgraphError
    from tfgraph.exporters.onnx.genai_config import genai_config, refusal

    import tfgraph

    spec = ROOT / "specs" / "tiny-sandwich.yaml"
    out = tmp_path / "d" / "m.onnx"
    result = CliRunner().invoke(main, ["build", str(spec), "--to", "onnx", "--kv-cache", "-o",
                                       str(out)])
    assert result.exit_code == 0, result.output
    assert [o.name for o in onnx.load(str(out)).graph.output][0] == "probs"
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.onnx"]
    notes = [line for line in result.stderr.splitlines() if "genai_config.json" in line]
    assert len(notes) == 1 and "probabilities" in notes[0], result.stderr
    generated = CliRunner().invoke(main, ["generate", str(out), "--prompt-ids", "5,6,7",
                                          "--max-new-tokens", "3", "--json", "--ignore-eos"])
    assert generated.exit_code == 0, generated.output
    assert len(json.loads(generated.stdout)["tokens"][0]) == 3
    refused = CliRunner().invoke(main, ["build", str(spec), "--to", "onnx", "--kv-cache",
                                        "--genai-provider", "cpu", "-o",
                                        str(tmp_path / "e" / "m.onnx")])
    assert refused.exit_code == 2 and "probabilities" in refused.output
    assert not (tmp_path / "e" / "m.onnx").exists()
    graph = tfgraph.compile(tfgraph.load_spec(spec), cache=True)
    assert refusal(graph) is not None
    with pytest.raises(TfgraphError, match="probabilities"):
        genai_config(graph, "m.onnx")


def test_a_genai_config_nested_too_deeply_is_a_foreign_file(tmp_path: Path) -> None:
    """A genai_config.json nested past Python's recursion limit is no config of a model:
    a file of the user's, left alone and named in one line (not an internal error)."""
    folder = tmp_path / "model"
    folder.mkdir()
    nested = "[" * 200_000
    (folder / "genai_config.json").write_text(nested)
    result = build_into(folder / "model.onnx", [])
    assert result.exit_code == 2, result.output
    assert "exists with other content" in result.output and "internal" not in result.output
    assert (folder / "genai_config.json").read_text() == nested
