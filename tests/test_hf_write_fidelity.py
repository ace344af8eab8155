"""What `tfgraph build DIR` writes keeps what the folder holds (README.md, "Hugging Face
models"): no value silently turned into infinity by `--dtype` (every target), each tensor's
stored dtype kept by `--to hf` (transformers saves a float16 T5 with its `wo` in float32), and
the folder's tokenizer and generation files carried along whether or not it has a
tokenizer.json. Tiny folders written by transformers' `save_pretrained`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli_support import refused, tfgraph
from test_cli_validate import runner  # stderr kept apart from stdout

WO = "DenseReluDense.wo.weight"
SETTINGS = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "max_length": 4096}


def invoke(*args: str) -> Any:
    from tfgraph.cli import main

    return runner().invoke(main, list(args))  # exceptions caught: exit codes are checked


def one_line(result: Any, *words: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return str(lines[0])


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("folders")
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)
    with torch.no_grad():  # bfloat16 holds it; float16 stops at 65504
        llama.model.norm.weight[0] = 1e6
    llama.save_pretrained(root / "big")
    t5 = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                               num_heads=4, decoder_start_token_id=0)
    transformers.T5ForConditionalGeneration(t5).save_pretrained(root / "t5f32")
    # transformers loads a float16 T5 with wo in float32 (_keep_in_fp32_modules) and saves
    # it so: a checkpoint of mixed dtypes, as published fp16 T5 folders are.
    mixed = transformers.T5ForConditionalGeneration.from_pretrained(root / "t5f32",
                                                                    dtype=torch.float16)
    assert mixed.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype == torch.float32
    mixed.save_pretrained(root / "t5mix")
    # an older Llama 2 folder: a sentencepiece tokenizer.model, no tokenizer.json, and a
    # generation_config.json of its own (GenerationConfig.save_pretrained writes no token ids
    # when none were given)
    sp = root / "sp"
    llama.to(torch.float32).save_pretrained(sp)
    (sp / "generation_config.json").unlink()
    transformers.GenerationConfig(**SETTINGS).save_pretrained(sp)
    (sp / "tokenizer.model").write_bytes(b"\n\x0bsentencepiece model bytes")
    (sp / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer"}')
    (sp / "special_tokens_map.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return {"big": root / "big", "t5mix": root / "t5mix", "sp": sp}


# ---- 1. no silent overflow --------------------------------------------------------------------


@pytest.mark.parametrize("to,name", [("hf", "model.norm.weight"),
                                     ("torch", "decoder.norm.weight")])
@pytest.mark.parametrize("finite", [False, True])
def test_float16_overflow_is_refused(folders: dict[str, Path], tmp_path: Path, to: str,
                                     name: str, finite: bool) -> None:
    out = tmp_path / "out"
    args = ["build", str(folders["big"]), "--to", to, "--dtype", "float16", "-o", str(out)]
    line = one_line(invoke(*args, *(["--check-finite"] if finite else [])),
                    name, "999424", "65504", "float16")
    assert "infinity" in line
    assert list(tmp_path.iterdir()) == []  # nothing kept, not even staging


def test_float16_overflow_onnx_one_line_no_numpy_warning(folders: dict[str, Path],
                                                         tmp_path: Path) -> None:
    result = tfgraph("build", str(folders["big"]), "--to", "onnx", "--dtype", "float16",
                     "-o", str(tmp_path / "m.onnx"))
    refused(result, "decoder.norm.weight", "65504")
    assert "RuntimeWarning" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_float16_overflow_encoder_decoder_kv_cache(tmp_path: Path) -> None:
    """The two models of an encoder-decoder's KV cache: refused, and no empty folder left."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    t5 = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                               num_heads=4, decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(t5).eval()
    with torch.no_grad():
        model.decoder.final_layer_norm.weight[0] = 1e6
    model.save_pretrained(tmp_path / "t5")
    out = tmp_path / "out"
    one_line(invoke("build", str(tmp_path / "t5"), "--to", "onnx", "--kv-cache", "--dtype",
                    "float16", "-o", str(out)), "decoder.norm.weight", "65504")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t5"]


def test_bfloat16_overflow_is_refused() -> None:
    from tfgraph.errors import TfgraphError
    from tfgraph.exporters.onnx.tensors import cast_array

    with pytest.raises(TfgraphError, match="w: .*3.4e\\+38.*bfloat16"):
        cast_array(np.array([1.0, 3.4e38], np.float32), "bfloat16", "w")
    # infinities already there are --check-finite's to refuse where they are read
    assert np.isinf(cast_array(np.array([np.inf], np.float32), "float16", "w")).all()


# ---- 2. each tensor keeps its stored dtype ------------------------------------------------------


def test_mixed_dtypes_round_trip_bit_identical(folders: dict[str, Path],
                                               tmp_path: Path) -> None:
    from safetensors import safe_open

    result = invoke("build", str(folders["t5mix"]), "--to", "hf", "-o", str(tmp_path / "hf"))
    assert result.exit_code == 0, result.stderr
    assert "note:" not in result.stderr
    assert "float16 (4 tensors float32 as stored)" in result.stdout + result.stderr

    def tensors(folder: Path) -> dict[str, tuple[str, bytes]]:
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            return {k: (str(f.get_tensor(k).dtype), f.get_tensor(k).numpy().tobytes())
                    for k in f.keys()}

    source, written = tensors(folders["t5mix"]), tensors(tmp_path / "hf")
    assert written == source
    assert sorted(k for k, (d, _) in written.items() if d == "torch.float32") == sorted(
        k for k in source if k.endswith(WO))
    # transformers loads both alike: float16 (config.json's dtype), wo kept in float32
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ids = torch.tensor([[3, 5, 7, 1]])
    logits = []
    for folder in (folders["t5mix"], tmp_path / "hf"):
        model = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
        assert model.dtype == torch.float16
        assert model.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype == torch.float32
        with torch.no_grad():
            logits.append(model(input_ids=ids, decoder_input_ids=ids).logits)
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=0)


@pytest.mark.parametrize("to,extra", [("onnx", []), ("torch", []),
                                      ("hf", ["--dtype", "float16"])])
def test_rounding_the_fp32_tensors_is_said(folders: dict[str, Path], tmp_path: Path,
                                           to: str, extra: list[str]) -> None:
    result = invoke("build", str(folders["t5mix"]), "--to", to, "-o", str(tmp_path / "out"),
                    *extra)
    assert result.exit_code == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "_keep_in_fp32_modules" in line]
    assert len(notes) == 1 and "4 of 47 tensors are stored in float32" in notes[0]
    assert ("computed in float16" if to != "hf" else "written in float16") in notes[0]


# ---- 3. tokenizer and generation files ----------------------------------------------------------


def test_tokenizer_files_without_tokenizer_json(folders: dict[str, Path],
                                                tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    sp, out = folders["sp"], tmp_path / "hf"
    result = invoke("build", str(sp), "--to", "hf", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    copied = ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
              "generation_config.json")
    assert f"copied {', '.join(copied)}" in result.stdout + result.stderr
    for name in copied[:3]:
        assert (out / name).read_bytes() == (sp / name).read_bytes()
    # copied as it is, without config.json's ids: transformers reads a folder's generation
    # config as it is, so the export stops (or not) where the source does
    assert (out / "generation_config.json").read_bytes() == (
        sp / "generation_config.json").read_bytes()
    generation = json.loads((out / "generation_config.json").read_text())
    assert "eos_token_id" not in generation
    assert json.loads((out / "config.json").read_text())["eos_token_id"] is not None
    loaded = transformers.GenerationConfig.from_pretrained(out)
    source = transformers.GenerationConfig.from_pretrained(sp)
    assert (loaded.temperature, loaded.top_p, loaded.max_length) == (0.6, 0.9, 4096)
    assert loaded.eos_token_id == source.eos_token_id is None
    # next to an ONNX model as well, the generation config the same
    result = invoke("build", str(sp), "--to", "onnx", "-o", str(tmp_path / "o" / "m.onnx"))
    assert result.exit_code == 0, result.stderr
    for name in copied[:3]:
        assert (tmp_path / "o" / name).read_bytes() == (sp / name).read_bytes()
    assert json.loads((tmp_path / "o" / "generation_config.json").read_text()) == generation
    # a rebuild finds the files it wrote and replaces them
    again = invoke("build", str(sp), "--to", "onnx", "-o", str(tmp_path / "o" / "m.onnx"))
    assert again.exit_code == 0, again.stderr


def test_generation_config_with_ids_is_copied_unchanged(folders: dict[str, Path],
                                                        tmp_path: Path) -> None:
    source = folders["big"] / "generation_config.json"  # save_pretrained's, ids included
    result = invoke("build", str(folders["big"]), "--to", "hf", "-o", str(tmp_path / "hf"))
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "hf" / "generation_config.json").read_bytes() == source.read_bytes()


def test_tokenizer_file_leading_out_is_refused(folders: dict[str, Path],
                                               tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "sp"
    shutil.copytree(folders["sp"], folder)
    secret = tmp_path / "secret.txt"
    secret.write_text("not the folder's")
    (folder / "tokenizer.model").unlink()
    os.symlink(secret, folder / "tokenizer.model")
    one_line(invoke("build", str(folder), "--to", "hf", "-o", str(tmp_path / "hf")),
             "tokenizer.model", "outside the folder")
    assert not (tmp_path / "hf").exists()


def test_bad_generation_config_is_refused(folders: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "sp"
    shutil.copytree(folders["sp"], folder)
    (folder / "generation_config.json").write_text("[1, 2]")
    one_line(invoke("build", str(folder), "--to", "hf", "-o", str(tmp_path / "hf")),
             "generation_config.json")
    assert not (tmp_path / "hf").exists()


def test_a_folder_without_tokenizer_json_generates_from_ids(folders: dict[str, Path]) -> None:
    """The files carried for transformers (generation_config.json, tokenizer_config.json, a
    sentencepiece model) are not tokenizer.json: ids generate, a text prompt asks for one."""
    for name in ("big", "sp"):  # save_pretrained's generation config only; an old Llama 2
        folder = folders[name]
        result = invoke("generate", str(folder), "--prompt-ids", "1,5,6",
                        "--max-new-tokens", "2", "--json")
        assert result.exit_code == 0, result.stderr
        assert len(json.loads(result.stdout)["tokens"][0]) == 2
        for command in ("generate", "run"):  # (a bfloat16 folder's float32 note first)
            result = invoke(command, str(folder), "--prompt", "hello")
            assert result.exit_code == 2 and "Traceback" not in result.stderr, result.stderr
            assert "needs a tokenizer.json" in result.stderr.strip().splitlines()[-1]
