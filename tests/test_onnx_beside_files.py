"""Files read from beside an .onnx model are untrusted input too: external weight data, the
tokenizer.json next to it and an encoder-decoder's encoder_model.onnx. Each is refused in one
line, exit 2, when it leads outside the model's folder or cannot be read, on both back ends
(onnxruntime checks the onnx back end's external data itself; the torch back end reads the
weights with onnx)."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from tfgraph.hf import spec_from_config
from tfgraph.errors import TfgraphError

from cli_support import refused, tfgraph

ROOT = Path(__file__).resolve().parent.parent
PROMPT = ("--prompt-ids", "1,2,3", "--max-new-tokens", "2")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama as a full-sequence .onnx file (weights inside it)."""
    out = tmp_path_factory.mktemp("built") / "model.onnx"
    result = tfgraph("build", str(ROOT / "specs" / "tiny-llama.yaml"), "--to", "onnx",
                     "--seed", "0", "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


def with_external(built: Path, folder: Path, location: str, data: bytes | None = None,
                  length_factor: int = 1) -> Path:
    """A copy of ``built`` in ``folder`` whose largest initializer lives in ``location``
    (relative to the folder) holding ``data`` (its own bytes unless given; None: no file)."""
    model = onnx.load(str(built))
    tensor = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    raw = numpy_helper.to_array(tensor).tobytes()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / location
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(raw if data is None else data)
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"),
                       ("length", str(len(raw) * length_factor))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_external_data_outside_the_folder_is_refused(built: Path, tmp_path: Path,
                                                     backend: str) -> None:
    model = with_external(built, tmp_path / "m", "../secret.bin")
    refused(tfgraph("generate", str(model), "--backend", backend, *PROMPT))


def test_external_data_of_the_wrong_length_is_refused(built: Path, tmp_path: Path) -> None:
    model = with_external(built, tmp_path / "m", "weights.bin", length_factor=2)
    line = refused(tfgraph("generate", str(model), "--backend", "torch", *PROMPT))
    assert "weights cannot be read" in line


def test_external_data_inside_the_folder_runs_on_torch(built: Path, tmp_path: Path) -> None:
    """The same file with its data where it belongs: the refusals above are about the data."""
    model = with_external(built, tmp_path / "m", "weights.bin")
    result = tfgraph("generate", str(model), "--backend", "torch", *PROMPT)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("command", ["generate", "run"])
def test_a_tokenizer_linked_outside_the_folder_is_refused(built: Path, tmp_path: Path,
                                                          command: str) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(built.read_bytes())
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    os.symlink(outside, folder / "tokenizer.json")
    args = PROMPT if command == "generate" else ("--prompt", "hi")
    refused(tfgraph(command, str(folder / "model.onnx"), *args), "outside the folder")


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_an_encoder_linked_outside_the_folder_is_refused(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "t5"
    result = tfgraph("build", str(ROOT / "specs" / "tiny-t5.yaml"), "--to", "onnx",
                     "--kv-cache", "--seed", "0", "-o", str(out))
    assert result.returncode == 0, result.stderr
    moved = tmp_path / "elsewhere.onnx"
    (out / "encoder_model.onnx").rename(moved)
    os.symlink(moved, out / "encoder_model.onnx")
    refused(tfgraph("generate", str(out / "decoder_model.onnx"), "--backend", backend,
                    *PROMPT), "outside the folder")


def test_a_float_past_float_range_is_a_config_error() -> None:
    """json.load reads 10**400 as an int; float() of it overflows."""
    config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
              "vocab_size": 61, "rms_norm_eps": 10**400}
    with pytest.raises(TfgraphError, match="rms_norm_eps.*float range"):
        spec_from_config(config)
