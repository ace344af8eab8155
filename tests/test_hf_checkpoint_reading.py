"""Which tensors a Hugging Face folder holds, read as transformers 5.24's ``from_pretrained``
reads them (review: checkpoint reading).

- ``model.safetensors`` beside an index is the checkpoint (transformers'
  ``modeling_utils._get_resolved_checkpoint_files`` looks for the single file first);
- a tensor in two of the checkpoint's files, or in a shard the index does not list it in, is
  refused, naming the tensor and the files (transformers loads every tensor of every shard, a
  later copy replacing an earlier one);
- names without the model class's ``base_model_prefix`` (the hub's gpt2) are read with it,
  old names under transformers' legacy renames (an old BERT's ``LayerNorm.gamma``/``beta``),
  and the tensors the class ignores on load (``_keys_to_ignore_on_load_unexpected``, old
  checkpoints' ``rotary_emb.inv_freq``) are skipped, also by the note on tensors stored in
  another dtype; any other tensor stays refused, as is a legacy name beside its new one;
- links that loop, a model_type that is not a string, files that are not UTF-8 and token ids
  that are not integers are one line on stderr, exit 2 (tfgraph.hf.load_rules is checked
  against transformers in tests/test_hf_load_rules.py).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from test_hf_hostile_folders import (DOWN, Q, SHARD_1, SHARD_2, built, copy_of, edit_config,
                                     edit_index, edit_tensors, import_refused, pristine,
                                     refused, run)

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

__all__ = ["pristine"]  # the module's fixture, shared with test_hf_hostile_folders


def initializer(path: Path, name: str) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    found = {i.name: i for i in onnx.load(str(path)).graph.initializer}
    return numpy_helper.to_array(found[name])


# ---- which files --------------------------------------------------------------------------------


def test_the_single_file_beside_an_index_is_what_is_read(pristine: dict[str, Path],
                                                         tmp_path: Path) -> None:
    """(was: the index's shards read, transformers reading model.safetensors)"""
    from safetensors.numpy import load_file

    folder = copy_of(pristine, "sharded", tmp_path)
    shutil.copy(pristine["single"] / "model.safetensors", folder / "model.safetensors")
    edit_tensors(folder / "model.safetensors", lambda t: t.update({Q: t[Q] * 2}))
    _, out = built(folder, tmp_path)
    want = load_file(str(folder / "model.safetensors"))[Q]
    assert not np.array_equal(want, load_file(str(folder / SHARD_1))[Q])
    np.testing.assert_array_equal(initializer(out, "decoder.layers.0.self_attn.q.weight"), want)


def test_a_tensor_in_two_shards_is_refused(pristine: dict[str, Path], tmp_path: Path) -> None:
    """The index lists Q in SHARD_1 only; transformers loads both files, the second copy last
    (was: accepted, tfgraph reading the index's copy)."""
    from safetensors.numpy import load_file

    folder = copy_of(pristine, "sharded", tmp_path)
    q = load_file(str(folder / SHARD_1))[Q]
    edit_tensors(folder / SHARD_2, lambda t: t.update({Q: q + 1}))
    refused(folder, Q, SHARD_1, SHARD_2)


def test_a_tensor_the_index_does_not_list(pristine: dict[str, Path], tmp_path: Path) -> None:
    """(was: "no file holds ...", of a tensor a file holds)"""
    folder = copy_of(pristine, "sharded", tmp_path)
    shard = edit_index(folder, lambda data: data["weight_map"].pop(DOWN))
    message = refused(folder, DOWN, "model.safetensors.index.json")
    assert "does not list" in message and "no file holds" not in message, message
    assert shard.name in message


# ---- links that loop, config values of the wrong kind, bytes that are not UTF-8 ----------------


@pytest.mark.parametrize("kind,name", [("single", "config.json"),
                                       ("single", "model.safetensors"),
                                       ("sharded", "model.safetensors.index.json")])
def test_a_link_to_itself(pristine: dict[str, Path], tmp_path: Path, kind: str,
                          name: str) -> None:
    """``ln -s NAME DIR/NAME`` (was: internal error, RuntimeError: Symlink loop)."""
    folder = copy_of(pristine, kind, tmp_path)
    (folder / name).unlink()
    os.symlink(name, folder / name)
    refused(folder, name, "loop")


@pytest.mark.parametrize("value", [["llama"], {"type": "llama"}, 7])
def test_a_model_type_that_is_not_a_name(pristine: dict[str, Path], tmp_path: Path,
                                         value: Any) -> None:
    """(was: internal error, TypeError: unhashable type)"""
    folder = tmp_path / "tiny"
    folder.mkdir()
    shutil.copy(pristine["single"] / "config.json", folder)
    edit_config(folder, model_type=value)
    import_refused(folder, "config.json", "model_type = ", "string")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_a_json_file_that_is_not_utf8(pristine: dict[str, Path], tmp_path: Path,
                                      name: str) -> None:
    folder = copy_of(pristine, "sharded", tmp_path)
    path = folder / name
    path.write_bytes(path.read_bytes().replace(b'"', b'\xff"', 1))
    message = refused(folder, name, "not UTF-8 JSON")
    assert "YAML" not in message


@pytest.mark.parametrize("file,content,key", [
    ("config.json", {"eos_token_id": "2"}, "eos_token_id"),
    ("config.json", {"bos_token_id": 1.0}, "bos_token_id"),
    ("config.json", {"eos_token_id": [2, "3"]}, "eos_token_id"),
    ("config.json", {"pad_token_id": True}, "pad_token_id"),
    ("generation_config.json", [1], "generation_config.json"),
    ("generation_config.json", {"eos_token_id": "2"}, "eos_token_id"),
    ("generation_config.json", {"decoder_start_token_id": [0]}, "decoder_start_token_id"),
])
def test_token_ids_that_are_not_integers(pristine: dict[str, Path], tmp_path: Path, file: str,
                                         content: Any, key: str) -> None:
    """transformers refuses both folders (StrictDataclassFieldValidationError; a
    generation_config.json that is not an object: TypeError) (was: exit 0, copied through)."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    shutil.copy(pristine["single"] / "config.json", folder)
    if file == "config.json":
        edit_config(folder, **content)
    else:
        (folder / file).write_text(json.dumps(content))
    import_refused(folder, file, key)


def test_integer_token_ids_past_the_vocabulary_still_import(pristine: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """Published configs name ids past a small vocabulary (transformers warns): left out of the
    spec's tokens as before, not refused."""
    folder = copy_of(pristine, "single", tmp_path)
    edit_config(folder, eos_token_id=50256, pad_token_id=None)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 50256]}))
    result = run("import", str(folder))
    assert result.exit_code == 0, result.stderr
    tokens = yaml.safe_load(result.stdout).get("tokens") or {}
    assert "eos" not in tokens and tokens.get("bos") == 1, tokens


# ---- names as transformers matches them -----------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A tiny GPT-2 written as the hub's gpt2 stores it: no ``transformer.`` prefix, no tied
    ``lm_head.weight``, and each layer's causal-mask buffer ``h.N.attn.bias``."""
    from safetensors.torch import load_file, save_file

    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64,
                                     n_positions=16, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    folder = tmp_path_factory.mktemp("gpt2") / "gpt2"
    model.save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    bare = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    assert not any(k.startswith("transformer.") for k in bare) and "wte.weight" in bare
    mask = torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16)
    for i in range(2):
        bare[f"h.{i}.attn.bias"] = mask.clone()
    save_file(bare, folder / "model.safetensors", metadata={"format": "pt"})
    return folder, model


def test_names_without_the_base_model_prefix(gpt2: tuple[Path, Any], tmp_path: Path) -> None:
    """(was: "no tfgraph parameter for this Hugging Face tensor", of h.0.attn.c_attn.bias)"""
    folder, model = gpt2
    loaded, info = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"], info
    _, out = built(folder, tmp_path)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"input_ids": ids.numpy()})[0])
    with torch.no_grad():
        want = loaded.eval()(ids).logits
        torch.testing.assert_close(want, model(ids).logits)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_prefixed_and_a_bare_copy_of_one_tensor(gpt2: tuple[Path, Any],
                                                  tmp_path: Path) -> None:
    folder = tmp_path / "gpt2"
    shutil.copytree(gpt2[0], folder)
    edit_tensors(folder / "model.safetensors",
                 lambda t: t.update({"transformer.wte.weight": t["wte.weight"]}))
    refused(folder, "wte.weight", "transformer.wte.weight")


@pytest.mark.parametrize("extra", ["h.0.attn.masked_bias", "h.0.mlp.mystery", "h.5.attn.bias"])
def test_a_tensor_transformers_would_not_ignore(gpt2: tuple[Path, Any], tmp_path: Path,
                                                extra: str) -> None:
    """GPT2PreTrainedModel ignores ``attn.bias`` and ``crossattention.bias`` only: transformers
    5.24 reports ``masked_bias`` as UNEXPECTED (it matches no pattern). ``h.5.attn.bias``
    matches one: ignored, as transformers ignores it."""
    folder = tmp_path / "gpt2"
    shutil.copytree(gpt2[0], folder)
    edit_tensors(folder / "model.safetensors",
                 lambda t: t.update({extra: np.zeros((), np.float32)}))
    if extra == "h.5.attn.bias":
        built(folder, tmp_path)
    else:
        refused(folder, extra)


def test_an_old_llama_checkpoints_rotary_tables_are_ignored(pristine: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """Llama checkpoints before transformers 4.3x stored each layer's ``inv_freq``
    (``modeling_utils._adjust_missing_and_unexpected_keys`` ignores them)."""
    folder = copy_of(pristine, "single", tmp_path)
    name = "model.layers.0.self_attn.rotary_emb.inv_freq"
    edit_tensors(folder / "model.safetensors",
                 lambda t: t.update({name: np.ones(4, np.float32)}))
    built(folder, tmp_path)


def test_an_ignored_buffer_of_another_dtype(pristine: dict[str, Path], tmp_path: Path) -> None:
    """An ignored tensor is not read, whatever its dtype; a read one of an unread dtype is
    still refused."""
    folder = copy_of(pristine, "single", tmp_path)
    name = "model.layers.1.self_attn.rotary_emb.inv_freq"
    edit_tensors(folder / "model.safetensors",
                 lambda t: t.update({name: np.ones(4, np.int64)}))
    built(folder, tmp_path)
    edit_tensors(folder / "model.safetensors", lambda t: t.update({Q: t[Q].astype(np.int64)}))
    (tmp_path / "built.onnx").unlink()
    refused(folder, Q, "I64")


def test_an_ignored_float32_buffer_of_a_float16_folder_is_not_noted(
        pristine: dict[str, Path], tmp_path: Path) -> None:
    """A float16 folder with an old float32 ``inv_freq``: transformers skips the buffer, and
    so does the note on tensors stored in a dtype the build rounds (it was "1 of 22 tensors are
    stored in float32 (first ...inv_freq): computed in float16"). A float32 tensor the model
    loads is still noted."""
    folder = copy_of(pristine, "single", tmp_path)
    name = "model.layers.0.self_attn.rotary_emb.inv_freq"

    def half(tensors: dict[str, np.ndarray]) -> None:
        tensors.update({k: v.astype(np.float16) for k, v in tensors.items()})
        tensors[name] = np.ones(4, np.float32)

    edit_tensors(folder / "model.safetensors", half)
    for to, extra in (("onnx", ()), ("hf", ("--dtype", "float16"))):
        out = tmp_path / f"{to}-out"
        result = run("build", str(folder), "--to", to, "-o", str(out), *extra)
        assert result.exit_code == 0, result.stderr
        assert "note:" not in result.stderr and "float16" in result.stdout, result.stderr
    edit_tensors(folder / "model.safetensors",
                 lambda t: t.update({Q: t[Q].astype(np.float32)}))
    result = run("build", str(folder), "--to", "onnx", "-o", str(tmp_path / "noted-out"))
    assert result.exit_code == 0, result.stderr
    assert f"1 of 21 tensors are stored in float32 (first {Q})" in result.stderr


@pytest.fixture(scope="module")
def old_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BertForMaskedLM saved with the names of pre-2020 BERT checkpoints (the hub's
    bert-base-uncased has ``bert.embeddings.LayerNorm.gamma``): every ``LayerNorm.weight``
    and ``LayerNorm.bias`` stored as ``LayerNorm.gamma`` and ``LayerNorm.beta``, the norms
    random so that a wrong or missing one shows in the logits."""
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48,
                                     max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name:
                param.normal_()
    folder = tmp_path_factory.mktemp("old-bert") / "bert"
    model.save_pretrained(folder)

    def legacy(tensors: dict[str, np.ndarray]) -> None:
        for key in [k for k in tensors if ".LayerNorm." in k]:
            old = key.replace("LayerNorm.weight", "LayerNorm.gamma")
            tensors[old.replace("LayerNorm.bias", "LayerNorm.beta")] = tensors.pop(key)

    edit_tensors(folder / "model.safetensors", legacy)
    return folder


def test_an_old_berts_gamma_and_beta(old_bert: Path, tmp_path: Path) -> None:
    """(was: "bert.embeddings.LayerNorm.beta: no tfgraph parameter for this Hugging Face
    tensor", exit 2) transformers' legacy renames read them as weight and bias: the logits are
    those of transformers' from_pretrained of the same folder."""
    from safetensors import safe_open

    with safe_open(str(old_bert / "model.safetensors"), framework="np") as f:
        assert "bert.embeddings.LayerNorm.gamma" in f.keys()
        assert not any(k.endswith("LayerNorm.weight") for k in f.keys())
    loaded, info = transformers.BertForMaskedLM.from_pretrained(old_bert,
                                                                output_loading_info=True)
    assert not any(info.values()), info
    _, out = built(old_bert, tmp_path)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids.numpy()}
    if "token_type_ids" in [i.name for i in session.get_inputs()]:
        feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
    got = torch.from_numpy(session.run(["logits"], feed)[0])
    with torch.no_grad():
        want = loaded.eval()(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_legacy_name_beside_its_new_one(old_bert: Path, tmp_path: Path) -> None:
    """``LayerNorm.gamma`` beside ``LayerNorm.weight`` are one tensor to transformers, which
    keeps the first of its sort of the names and drops the other without a word: refused."""
    folder = tmp_path / "bert"
    shutil.copytree(old_bert, folder)
    gamma = "bert.encoder.layer.1.output.LayerNorm.gamma"
    weight = gamma.replace("gamma", "weight")
    edit_tensors(folder / "model.safetensors",
                 lambda t: t.update({weight: t[gamma] + 1}))
    message = refused(folder, gamma, weight)
    assert "legacy" in message


def test_a_base_model_checkpoint_of_another_family(pristine: dict[str, Path],
                                                   tmp_path: Path) -> None:
    """The prefix is each class's (LlamaForCausalLM's is ``model``), not a GPT-2 rule: a
    LlamaModel's names (``layers.0...``, ``embed_tokens.weight``) beside the head's
    ``lm_head.weight`` build the very same model."""
    from safetensors.numpy import load_file

    folder = copy_of(pristine, "single", tmp_path)
    edit_tensors(folder / "model.safetensors", lambda t: t.update(
        {k.removeprefix("model."): t.pop(k) for k in list(t) if k.startswith("model.")}))
    assert "layers.0.self_attn.q_proj.weight" in load_file(str(folder / "model.safetensors"))
    _, out = built(folder, tmp_path)
    want = load_file(str(pristine["single"] / "model.safetensors"))
    np.testing.assert_array_equal(initializer(out, "decoder.layers.0.self_attn.q.weight"),
                                  want[Q])
    np.testing.assert_array_equal(initializer(out, "embed.tokens.weight"),
                                  want["model.embed_tokens.weight"])


def test_a_bare_gpt2_to_hf_writes_the_named_folder(gpt2: tuple[Path, Any],
                                                   tmp_path: Path) -> None:
    """--to hf from the hub's layout writes save_pretrained's (prefixed names, no mask
    buffers), each tensor in its stored dtype: transformers loads it to the same logits."""
    from safetensors.numpy import load_file

    folder, model = gpt2
    out = tmp_path / "out"
    result = run("build", str(folder), "--to", "hf", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert "as stored" not in result.stdout, result.stdout
    names = set(load_file(str(out / "model.safetensors")))
    assert "transformer.h.0.attn.c_attn.weight" in names
    assert not any(".attn.bias" in n and "c_attn" not in n for n in names), names
    back = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    ids = torch.arange(7).view(1, 7)
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits)
