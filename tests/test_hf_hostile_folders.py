"""`tfgraph build DIR` on hostile Hugging Face folders (README.md, "Hugging Face models").

A model folder is untrusted input. Each case here starts from a tiny valid folder written by
transformers' ``save_pretrained`` (a single ``model.safetensors``, or shards with an index),
breaks one thing, and checks the rule: exit 2, exactly one line on stderr naming the
offending file (and tensor), no traceback, no hang, nothing written (no output, no temporary
file, an older output unchanged), and nothing read from outside the folder named.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from tfgraph.cli import main

SHARD_1 = "model-00001-of-00003.safetensors"
SHARD_2 = "model-00002-of-00003.safetensors"
Q = "model.layers.0.self_attn.q_proj.weight"
UP = "model.layers.0.mlp.up_proj.weight"
DOWN = "model.layers.1.mlp.down_proj.weight"
OUTPUT_NAME = {"onnx": "model.onnx", "torch": "model-torch", "hf": "model-hf"}


def runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:  # click >= 8.2 keeps stderr apart already
        return CliRunner()


def run(*args: str) -> Any:
    return runner().invoke(main, list(args))


# ---- the folders ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Valid folders, written once: float32 single file, float32 shards, bfloat16."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    root = tmp_path_factory.mktemp("pristine")
    model.save_pretrained(root / "single")
    model.save_pretrained(root / "sharded", max_shard_size="40KB")
    model.to(torch.bfloat16).save_pretrained(root / "bf16")
    index = json.loads((root / "sharded" / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values()))[:2] == [SHARD_1, SHARD_2]
    assert index["weight_map"][Q] == SHARD_1  # the shard cases below rely on it
    return {p.name: p for p in root.iterdir()}


def copy_of(pristine: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    out = tmp_path / kind / "tiny-llama"
    shutil.copytree(pristine[kind], out)
    return out


@pytest.fixture
def model(pristine: dict[str, Path], tmp_path: Path) -> Path:
    return copy_of(pristine, "single", tmp_path)


@pytest.fixture
def sharded(pristine: dict[str, Path], tmp_path: Path) -> Path:
    return copy_of(pristine, "sharded", tmp_path)


def edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def edit_index(folder: Path, change: Callable[[dict[str, Any]], Any]) -> Path:
    path = folder / "model.safetensors.index.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def edit_tensors(path: Path, change: Callable[[dict[str, np.ndarray]], Any]) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def header_length(path: Path) -> int:
    length: int = struct.unpack("<Q", path.read_bytes()[:8])[0]
    return length


# ---- the rule -----------------------------------------------------------------------------------


def contents(folder: Path) -> dict[Path, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {p.relative_to(folder): p.read_bytes() if p.is_file() else None
            for p in folder.rglob("*")}


def refused(folder: Path, *names: str, to: str = "onnx", extra: tuple[str, ...] = (),
            old: Path | None = None) -> str:
    """Build ``folder``; check the refusal and that nothing was written; the message.
    ``old``: a valid folder built to the same output first, which must survive unchanged."""
    out_dir = folder.parent / "out"
    out_dir.mkdir()
    out = out_dir / OUTPUT_NAME[to]
    if old is not None:
        first = run("build", str(old), "--to", to, "-o", str(out), *extra)
        assert first.exit_code == 0 and out.exists(), first.stderr
    before = contents(out_dir)
    result = run("build", str(folder), "--to", to, "-o", str(out), *extra)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert contents(out_dir) == before, "the failed build left or changed files"
    return lines[0]


def built(folder: Path, tmp_path: Path, *extra: str) -> tuple[Any, Path]:
    out = tmp_path / "built.onnx"
    result = run("build", str(folder), "--to", "onnx", "-o", str(out), *extra)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert out.is_file()
    return result, out


def test_the_pristine_folders_build(model: Path, sharded: Path, tmp_path: Path) -> None:
    """The corruptions below are the only reason the other cases fail."""
    for folder in (model, sharded):
        result, out = built(folder, tmp_path)
        assert "weights" in result.stdout and result.stderr == ""
        out.unlink()


# ---- config.json ----------------------------------------------------------------------------


def test_config_not_json(model: Path, pristine: dict[str, Path]) -> None:
    (model / "config.json").write_text('{"model_type": "llama",')
    assert "not valid JSON" in refused(model, str(model / "config.json"), old=pristine["single"])


def test_config_too_large(model: Path) -> None:
    edit_config(model, padding="x" * (2 << 20))
    assert "larger than 1 MiB" in refused(model, str(model / "config.json"))


@pytest.mark.parametrize("field,value", [
    ("hidden_size", 10**12), ("num_hidden_layers", -1), ("vocab_size", 0),
    ("num_attention_heads", 10**9), ("intermediate_size", 2**62),
])
def test_config_absurd_sizes(model: Path, field: str, value: int) -> None:
    edit_config(model, **{field: value})
    refused(model, "config.json", f"{field} = {value}")


def test_config_unknown_model_type(model: Path) -> None:
    edit_config(model, model_type="frobnicator")
    refused(model, "config.json", "model_type = 'frobnicator'")


@pytest.mark.parametrize("changes,field,value", [
    ({"hidden_act": "relu2"}, "hidden_act", "relu2"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
     "rope_parameters", "dynamic"),
    # transformers reads a legacy rope_scaling before rope_parameters when both are present
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling", "dynamic"),
])
def test_config_feature_tfgraph_lacks_names_the_field(model: Path, pristine: dict[str, Path],
                                                      changes: dict[str, Any], field: str,
                                                      value: str) -> None:
    edit_config(model, **changes)
    refused(model, "config.json", f"{field} = ", value, to="torch", old=pristine["single"])


# ---- model.safetensors.index.json ------------------------------------------------------------


def test_index_not_json(sharded: Path) -> None:
    (sharded / "model.safetensors.index.json").write_text("{weight_map")
    assert "not valid JSON" in refused(sharded, "model.safetensors.index.json")


@pytest.mark.parametrize("weight_map", [[SHARD_1], "x", None, {}])
def test_index_weight_map_not_an_object(sharded: Path, weight_map: Any) -> None:
    edit_index(sharded, lambda data: data.update(weight_map=weight_map))
    refused(sharded, "model.safetensors.index.json", "weight_map")


@pytest.mark.parametrize("shard", ["../x.safetensors", "/etc/passwd", "sub/../../x.safetensors",
                                   "/tmp/x.safetensors", "..", ""])
def test_index_names_a_file_outside_the_folder(sharded: Path, shard: str) -> None:
    shutil.copy(sharded / SHARD_1, sharded.parent / "x.safetensors")  # a readable bait
    (sharded / "sub").mkdir()
    edit_index(sharded, lambda data: data["weight_map"].update({Q: shard}))
    refused(sharded, "model.safetensors.index.json", repr(shard))


def test_index_names_a_missing_shard(sharded: Path, pristine: dict[str, Path]) -> None:
    edit_index(sharded, lambda data: data["weight_map"].update({Q: "model-9-of-9.safetensors"}))
    refused(sharded, "model.safetensors.index.json", "model-9-of-9.safetensors",
            "not in the folder", to="hf", old=pristine["sharded"])


def test_index_puts_a_tensor_in_a_shard_that_lacks_it(sharded: Path) -> None:
    edit_index(sharded, lambda data: data["weight_map"].update({Q: SHARD_2}))
    refused(sharded, SHARD_2, Q)


def test_a_shard_linked_outside_the_folder(sharded: Path) -> None:
    outside = sharded.parent / "elsewhere.safetensors"
    shutil.move(sharded / SHARD_1, outside)
    os.symlink(outside, sharded / SHARD_1)
    refused(sharded, SHARD_1, "outside the folder")


def test_an_index_linked_outside_the_folder(sharded: Path) -> None:
    outside = sharded.parent / "index.json"
    shutil.move(sharded / "model.safetensors.index.json", outside)
    os.symlink(outside, sharded / "model.safetensors.index.json")
    refused(sharded, "model.safetensors.index.json", "outside the folder")


@pytest.mark.parametrize("kind,name", [("sharded", SHARD_1), ("single", "model.safetensors"),
                                       ("single", "config.json"), ("single", "tokenizer.json")])
def test_a_fifo_is_refused_without_hanging(pristine: dict[str, Path], tmp_path: Path,
                                           kind: str, name: str) -> None:
    """A FIFO blocks its reader until a writer comes: the build must refuse it unopened. A
    separate process, so that a hang is a failed test, not a stuck suite."""
    folder = copy_of(pristine, kind, tmp_path)
    if (folder / name).exists():
        (folder / name).unlink()
    os.mkfifo(folder / name)
    out = tmp_path / "out.onnx"
    try:
        done = subprocess.run([sys.executable, "-m", "tfgraph", "build", str(folder), "--to",
                               "onnx", "-o", str(out)], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tfgraph build hung on a FIFO {name}")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "not a regular file" in lines[0]
    assert not out.exists()


# ---- safetensors files ------------------------------------------------------------------------


def test_header_length_enormous(model: Path) -> None:
    path = model / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 2**60) + data[8:])
    refused(model, str(path), "not a valid safetensors file")


def test_header_not_json(model: Path) -> None:
    path = model / "model.safetensors"
    data = bytearray(path.read_bytes())
    n = header_length(path)
    data[8:8 + n] = b"{not json".ljust(n)
    path.write_bytes(bytes(data))
    refused(model, str(path), "not a valid safetensors file")


def test_truncated_data(sharded: Path, pristine: dict[str, Path]) -> None:
    path = sharded / SHARD_2
    path.write_bytes(path.read_bytes()[:-100])
    refused(sharded, str(path), "not a valid safetensors file", old=pristine["sharded"])


def test_empty_file(model: Path) -> None:
    (model / "model.safetensors").write_bytes(b"")
    refused(model, str(model / "model.safetensors"))


@pytest.mark.parametrize("dtype,code", [(np.int32, "I32"), (np.float64, "F64"),
                                        (np.int8, "I8"), (np.bool_, "BOOL")])
def test_weights_of_a_dtype_tfgraph_does_not_read(model: Path, dtype: Any, code: str) -> None:
    path = model / "model.safetensors"
    edit_tensors(path, lambda t: t.update({Q: t[Q].astype(dtype)}))
    refused(model, str(path), Q, code)


def test_a_tensor_of_the_wrong_shape(model: Path) -> None:
    path = model / "model.safetensors"
    edit_tensors(path, lambda t: t.update({UP: np.ascontiguousarray(t[UP].T)}))
    assert "is [32, 64], but config.json's model needs [64, 32]" in refused(model, str(path), UP)


def test_a_tensor_of_the_wrong_rank(model: Path) -> None:
    path = model / "model.safetensors"
    edit_tensors(path, lambda t: t.update({UP: t[UP].reshape(-1)}))
    refused(model, str(path), UP, to="torch")


def test_a_tensor_with_an_unknown_name(model: Path) -> None:
    path = model / "model.safetensors"
    extra = "model.layers.0.self_attn.mystery.weight"
    edit_tensors(path, lambda t: t.update({extra: np.zeros((2, 2), np.float32)}))
    refused(model, str(path), extra)


def test_a_tensor_of_a_layer_the_config_lacks(model: Path) -> None:
    path = model / "model.safetensors"
    extra = "model.layers.7.mlp.up_proj.weight"
    edit_tensors(path, lambda t: t.update({extra: t[UP]}))
    refused(model, str(path), extra)


@pytest.mark.parametrize("to", ["onnx", "torch", "hf"])
def test_a_missing_tensor(model: Path, pristine: dict[str, Path], to: str) -> None:
    edit_tensors(model / "model.safetensors", lambda t: t.pop(DOWN))
    refused(model, str(model), DOWN, to=to, old=pristine["single"])


def test_a_missing_tensor_in_shards(sharded: Path) -> None:
    """Left out of both the index and its shard: still named."""
    shard = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"][DOWN]
    edit_tensors(sharded / shard, lambda t: t.pop(DOWN))
    edit_index(sharded, lambda data: data["weight_map"].pop(DOWN))
    refused(sharded, DOWN)


def nan_at(path: Path, name: str) -> None:
    def poison(tensors: dict[str, np.ndarray]) -> None:
        tensors[name] = tensors[name].copy()
        tensors[name][1, 2] = np.nan

    edit_tensors(path, poison)


@pytest.mark.parametrize("to", ["onnx", "hf"])
def test_nan_with_check_finite(model: Path, pristine: dict[str, Path], to: str) -> None:
    nan_at(model / "model.safetensors", Q)
    refused(model, str(model / "model.safetensors"), Q, "NaN", to=to,
            extra=("--check-finite",), old=pristine["single"])


def test_nan_without_check_finite_builds(model: Path, tmp_path: Path) -> None:
    """The flag is opt-in: the same folder builds without it, NaN and all."""
    import onnx
    from onnx import numpy_helper

    nan_at(model / "model.safetensors", Q)
    _, out = built(model, tmp_path)
    q = {i.name: i for i in onnx.load(str(out)).graph.initializer}[
        "decoder.layers.0.self_attn.q.weight"]
    assert np.isnan(numpy_helper.to_array(q)).sum() == 1


def test_a_pickled_checkpoint_only_is_refused(model: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    torch.save(load_file(str(model / "model.safetensors")), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    message = refused(model, "pytorch_model.bin", "pickle", "safetensors")
    assert "--seed" not in message  # the random-weights hint is for folders with no weights


def test_no_weights_at_all(model: Path) -> None:
    (model / "model.safetensors").unlink()
    refused(model, str(model), "no weights", to="torch")


# ---- tokenizer.json -----------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"{not json", b'{"model": {"type": "Nonsense"}}', b"",
                                     b"\xff\xfe"])
def test_corrupt_tokenizer(model: Path, pristine: dict[str, Path], content: bytes) -> None:
    (model / "tokenizer.json").write_bytes(content)
    refused(model, str(model / "tokenizer.json"), old=pristine["single"])


def test_tokenizer_linked_outside_the_folder(model: Path) -> None:
    outside = model.parent / "tokenizer.json"
    outside.write_text("{}")
    os.symlink(outside, model / "tokenizer.json")
    refused(model, "tokenizer.json", "outside the folder")


# ---- links and the hub cache ------------------------------------------------------------------


@pytest.mark.parametrize("relative", [False, True])
def test_weights_linked_outside_the_folder(model: Path, relative: bool) -> None:
    outside = model.parent / "stolen.safetensors"
    shutil.move(model / "model.safetensors", outside)
    os.symlink("../stolen.safetensors" if relative else outside, model / "model.safetensors")
    refused(model, "model.safetensors", "outside the folder")


def test_a_dangling_weights_link(model: Path) -> None:
    (model / "model.safetensors").unlink()
    os.symlink("nowhere.safetensors", model / "model.safetensors")
    refused(model, "model.safetensors")


def hub_cache(source: Path, root: Path) -> Path:
    """``source`` laid out as the hub cache lays out a download: the snapshot's files are
    relative links to content-addressed blobs two levels up."""
    repo = root / "models--org--tiny-llama"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(source.iterdir())):
        blob = f"{i:040x}"
        shutil.copy(file, repo / "blobs" / blob)
        os.symlink(f"../../blobs/{blob}", snapshot / file.name)
    return snapshot


def test_a_hub_cache_snapshot_builds(pristine: dict[str, Path], tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper
    from safetensors.numpy import load_file

    snapshot = hub_cache(pristine["sharded"], tmp_path)
    result, out = built(snapshot, tmp_path)
    assert str(snapshot) in result.stdout and result.stderr == ""
    q = {i.name: i for i in onnx.load(str(out)).graph.initializer}[
        "decoder.layers.0.self_attn.q.weight"]
    expected = load_file(str(pristine["sharded"] / SHARD_1))[Q]
    np.testing.assert_array_equal(numpy_helper.to_array(q), expected)


def test_a_hub_cache_link_to_another_repository_is_refused(pristine: dict[str, Path],
                                                           tmp_path: Path) -> None:
    """Only the snapshot's own repository's blobs are allowed, not a neighbour's."""
    snapshot = hub_cache(pristine["single"], tmp_path)
    other = tmp_path / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    shutil.move((snapshot / "model.safetensors").resolve(), other / "weights")
    (snapshot / "model.safetensors").unlink()
    os.symlink("../../../models--org--other/blobs/weights", snapshot / "model.safetensors")
    refused(snapshot, "model.safetensors", "outside the folder")


# ---- bfloat16 ---------------------------------------------------------------------------------


def test_bf16_builds_as_float32_for_onnxruntime(pristine: dict[str, Path],
                                                tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto

    folder = copy_of(pristine, "bf16", tmp_path)
    result, out = built(folder, tmp_path)
    notes = result.stderr.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: ") and "bfloat16" in notes[0]
    types = {i.data_type for i in onnx.load(str(out)).graph.initializer if i.dims}
    assert types == {TensorProto.FLOAT}
    out.unlink()
    result, out = built(folder, tmp_path, "--dtype", "bfloat16")
    assert result.stderr == "" and "bfloat16" in result.stdout
    params = [i for i in onnx.load(str(out)).graph.initializer if len(i.dims) == 2]
    assert params and {i.data_type for i in params} == {TensorProto.BFLOAT16}


# ---- tfgraph import of the newest families: values of the wrong type or size --------------------


def family_folder(tmp_path: Path, model_type: str, **changes: Any) -> Path:
    """A folder holding only the config.json of ``model_type``'s config class (its defaults:
    the full-size model), with ``changes``; a key changed to None is dropped."""
    transformers = pytest.importorskip("transformers")
    extra = {"new_decoder_architecture": True, "num_kv_heads": 2} \
        if model_type == "falcon" else {}
    config = transformers.AutoConfig.for_model(model_type, **extra).to_dict()
    config["model_type"] = model_type
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def import_refused(folder: Path, *words: str) -> str:
    """``tfgraph import DIR -o SPEC``: exit 2, one line naming ``words``, no spec written."""
    out = folder.parent / "imported.yaml"
    result = run("import", str(folder), "-o", str(out))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not out.exists() and sorted(p.name for p in folder.parent.iterdir()) == [
        folder.name]
    return lines[0]


@pytest.mark.parametrize("model_type", ["deepseek_v3", "olmo", "cohere2", "phimoe", "roberta",
                                        "xlm-roberta", "modernbert"])
@pytest.mark.parametrize("value", [{"name": "silu"}, ["gelu"]])
def test_an_activation_that_is_not_a_name(tmp_path: Path, model_type: str, value: Any) -> None:
    """A mapping or list where the activation's name goes (was: TypeError, unhashable)."""
    field = "hidden_activation" if model_type == "modernbert" else "hidden_act"
    import_refused(family_folder(tmp_path, model_type, **{field: value}), f"{field} = ",
                   "activation")


def test_falcons_activation_that_is_not_a_name(tmp_path: Path) -> None:
    import_refused(family_folder(tmp_path, "falcon", activation=["gelu"]), "activation = ")


@pytest.mark.parametrize(("model_type", "changes"), [
    ("olmo", {}), ("phimoe", {}),
    # no layer_types: the config class's rule per layer (each made a list of 10**12 first)
    ("cohere2", {"layer_types": None}), ("modernbert", {"layer_types": None}),
    ("qwen2", {"layer_types": None, "use_sliding_window": True, "sliding_window": 64}),
    ("gemma2", {"layer_types": None}),
])
def test_a_trillion_layers_is_refused_before_any_list_of_layers(
        tmp_path: Path, model_type: str, changes: dict[str, Any]) -> None:
    """(was: MemoryError, or minutes building one entry per layer)"""
    folder = family_folder(tmp_path, model_type, num_hidden_layers=10**12, **changes)
    import_refused(folder, f"num_hidden_layers = {10**12}")


@pytest.mark.parametrize(("model_type", "changes", "words"), [
    # int() took "8" and 8.5 as a window width, and a string/mapping raised
    ("cohere2", {"sliding_window": "8"}, ("sliding_window = '8'", "integer")),
    ("cohere2", {"sliding_window": 8.5}, ("sliding_window = 8.5", "integer")),
    ("phimoe", {"sliding_window": {"size": 8}}, ("sliding_window = ", "integer")),
    ("cohere2", {"layer_types": 5}, ("layer_types = 5",)),
    ("cohere2", {"layer_types": [["full_attention"]] * 4, "num_hidden_layers": 4},
     ("layer_types = ",)),
    ("modernbert", {"layer_types": 5}, ("layer_types = 5",)),
    ("modernbert", {"rope_parameters": {"full_attention": 5}},
     ("rope_parameters = ", "full_attention must be a mapping")),
    ("modernbert", {"rope_parameters": {"sliding_attention": "x"}},
     ("rope_parameters = ", "sliding_attention must be a mapping")),
    ("gemma3_text", {"rope_parameters": {"full_attention": {"rope_type": "default"},
                                         "sliding_attention": 5}},
     ("rope_parameters = ", "sliding_attention must be a mapping")),
    ("gemma3_text", {"rope_parameters": {"full_attention": "x"}},
     ("rope_parameters = ", "full_attention must be a mapping")),
    ("phi3", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": "x"}},
     ("rope_parameters = ", "partial_rotary_factor must be a number")),
    # DeepSeek's softmax scale reads the yarn factor before the spec checks it (was float('x'))
    ("deepseek_v3", {"rope_parameters": {"rope_type": "yarn", "factor": "x", "rope_theta": 1e4,
                                         "mscale_all_dim": 1.0}},
     ("rope_parameters = ", "factor must be a finite number")),
    ("deepseek_v3", {"rope_parameters": {"rope_type": "yarn", "mscale_all_dim": 1.0}},
     ("rope_parameters = ", "factor must be a finite number")),
])
def test_window_and_rotary_settings_of_the_wrong_type(tmp_path: Path, model_type: str,
                                           changes: dict[str, Any], words: tuple[str, ...]
                                           ) -> None:
    import_refused(family_folder(tmp_path, model_type, **changes), *words)


@pytest.mark.parametrize(("model_type", "field", "value"), [
    ("deepseek_v2", "kv_lora_rank", "512"), ("deepseek_v3", "v_head_dim", -64),
    ("deepseek_v3", "q_lora_rank", 10**12), ("deepseek_v3", "n_routed_experts", {"n": 8}),
    ("falcon", "num_kv_heads", 2.5), ("mpt", "n_layers", 10**12),
    ("mpt", "attn_config", {"clip_qkv": "8"}),  # named attn_config.clip_qkv
    ("olmo", "clip_qkv", -1.0),
    ("cohere2", "logit_scale", "x"), ("phimoe", "num_local_experts", 0),
    ("roberta", "max_position_embeddings", True), ("xlm-roberta", "vocab_size", 10**12),
    ("modernbert", "local_attention", [128]),
])
def test_sizes_of_the_wrong_type_name_the_field(tmp_path: Path, model_type: str, field: str,
                                                value: Any) -> None:
    """One line naming the field (a DeepSeek latent size was blamed on kv_lora_rank, the
    whole attention.latent's origin; the others behaved already and are kept so)."""
    changes = {field: value}
    if model_type == "deepseek_v2":
        changes["num_experts_per_tok"] = 6  # its config class leaves it unset
    line = import_refused(family_folder(tmp_path, model_type, **changes), f"{field}")
    assert line.split(": ", 1)[1].startswith(field), line  # that field, not its neighbour's
