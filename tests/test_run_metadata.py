"""`run MODEL.onnx --check` and `generate --backend torch` read the spec a model carries in its
metadata as untrusted input (issue 15, item 10): malformed or disagreeing metadata is one line
on stderr and exit 2, found before anything big is compiled."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import tfgraph
from tfgraph.cli import main
from tfgraph.exporters import to_onnx
from tfgraph.exporters.onnx.model import SPEC_METADATA_KEY

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def tiny_model() -> onnx.ModelProto:
    return to_onnx(tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / "tiny-llama.yaml")))


def tampered(model: onnx.ModelProto, path: Path, edit: Callable[[str], str]) -> Path:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for prop in copy.metadata_props:
        if prop.key == SPEC_METADATA_KEY:
            prop.value = edit(prop.value)
    onnx.save(copy, str(path))
    return path


def with_spec(change: Callable[[dict], None]) -> Callable[[str], str]:
    def edit(text: str) -> str:
        spec = json.loads(text)
        change(spec)
        return json.dumps(spec)
    return edit


def test_the_untampered_model_checks(tiny_model: onnx.ModelProto, tmp_path: Path) -> None:
    path = tampered(tiny_model, tmp_path / "m.onnx", lambda text: text)
    result = cli("run", str(path), "--check", "--repeat", "1", "--seq", "4")
    assert result.exit_code == 0, result.stderr
    assert ": ok" in result.stdout


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"name": "x"}', "{}" * 100_000])
def test_malformed_metadata_is_one_line_exit_2(tiny_model: onnx.ModelProto, tmp_path: Path,
                                               text: str) -> None:
    path = tampered(tiny_model, tmp_path / "m.onnx", lambda _: text)
    for args in (("run", str(path), "--repeat", "1"), ("run", str(path), "--check"),
                 ("generate", str(path), "--backend", "torch", "--prompt-ids", "1,2")):
        result = cli(*args)
        assert result.exit_code == 2, (args, result.stderr)
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"{path}[tfgraph.spec]") and len(line) < 300, line


def test_a_10000_layer_spec_in_a_tiny_model_is_refused_before_compiling(
        tiny_model: onnx.ModelProto, tmp_path: Path) -> None:
    path = tampered(tiny_model, tmp_path / "m.onnx",
                    with_spec(lambda spec: spec.update(layers=10_000)))
    for args in (("run", str(path), "--check"),
                 ("generate", str(path), "--backend", "torch", "--prompt-ids", "1,2")):
        # refused before compiling 10,000 layers (which took ~30 s and 1.6 GB); its time:
        # benchmarks/hostile_inputs.py
        result = cli(*args)
        assert result.exit_code == 2
        (line,) = result.stderr.splitlines()
        assert "metadata has 10000 decoder layers, its weights 2" in line


@pytest.mark.parametrize("cache", [False, True])
def test_generate_on_onnxruntime_refuses_a_vocabulary_the_logits_lack(tmp_path: Path,
                                                                       cache: bool) -> None:
    """The onnx back end reads only the vocabulary and lengths from the metadata; one that
    disagrees with the logits' own size is refused when the model is opened (was: a
    ValueError from the sampler's indexing, or the loop's mismatch after the prefill)."""
    model = to_onnx(tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / "tiny-llama.yaml"),
                                    cache=cache))
    path = tampered(model, tmp_path / "m.onnx",
                    with_spec(lambda spec: spec.update(vocab=1 << 24)))
    result = cli("generate", str(path), "--prompt-ids", "1,2", "--max-new-tokens", "2")
    assert result.exit_code == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line == (f"{path}: the spec in its metadata has a vocabulary of 16,777,216, its "
                    "logits 256; the metadata does not describe this model"), line


def test_a_disagreeing_width_is_summarised(tiny_model: onnx.ModelProto, tmp_path: Path) -> None:
    def wider(spec: dict) -> None:
        spec["d_model"] *= 2
        spec["ffn"].pop("hidden", None)
        spec["attention"].pop("head_dim", None)
    path = tampered(tiny_model, tmp_path / "m.onnx", with_spec(wider))
    result = cli("run", str(path), "--check", "--repeat", "1")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "does not match the model's weights:" in line and "mis-shaped (" in line
    assert "more)" in line and len(line) < 300, line


def test_torch_backend_reads_an_encoder_decoders_two_kv_cache_files(tmp_path: Path) -> None:
    # decoder_model.onnx holds part of the weights; encoder_model.onnx beside it the rest (the
    # torch back end was refused: "weights do not match: missing encoder.*").
    folder = tmp_path / "s2s"
    assert cli("build", str(ROOT / "specs" / "tiny-seq2seq.yaml"), "--to", "onnx",
               "--kv-cache", "-o", str(folder)).exit_code == 0
    args = ["generate", str(folder / "decoder_model.onnx"), "--prompt-ids", "3,4,5",
            "--prompt-ids", "7,8", "--max-new-tokens", "6", "--ignore-eos", "--json"]
    tokens = {}
    for backend in ("onnx", "torch"):
        for beams in ("1", "3"):
            result = cli(*args, "--backend", backend, "--beams", beams)
            assert result.exit_code == 0, result.stderr
            tokens[backend, beams] = json.loads(result.stdout)["tokens"]
    assert tokens["onnx", "1"] == tokens["torch", "1"]
    assert tokens["onnx", "3"] == tokens["torch", "3"]
    (folder / "encoder_model.onnx").unlink()
    result = cli(*args, "--backend", "torch")
    assert result.exit_code == 2 and "no encoder_model.onnx beside" in result.stderr
