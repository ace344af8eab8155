"""`tfgraph build DIR` from real Hugging Face folders, and `--to hf` back to one.

Every family of test_hf_families (a tiny model from its transformers config class, random
weights) is written with ``save_pretrained`` (every other family sharded with an index), then
built through the CLI:

- ``--to onnx`` in onnxruntime and ``--to torch`` (its standalone model.py) give the Hugging
  Face model's logits within 1e-4 (float32);
- ``--to hf`` gives a folder the Auto class loads to the same logits, whose model.safetensors
  holds exactly the original's tensors (names and bits, all shards merged).

A bfloat16 checkpoint stays bfloat16 in the torch folder, becomes float32 for onnxruntime (with
a note) unless ``--dtype`` says float16; spec files go to Hugging Face folders with ``--seed``;
and a 200.8M-parameter Llama folder converts to ONNX in less memory than its weights take.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result
from safetensors.torch import load_file
from torch import Tensor, nn

import tfgraph
from tfgraph.cli import main
from tfgraph.exporters import to_torch
from tfgraph.hf import name_map

from conftest import ROOT
from test_hf_families import CASES, Case, build_reference, family_seed, inputs

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

FAMILIES = sorted(CASES)
AUTO = {"causal": "AutoModelForCausalLM", "seq2seq": "AutoModelForSeq2SeqLM",
        "masked": "AutoModelForMaskedLM"}
ATOL = RTOL = 1e-4  # float32


def same(got: Tensor, want: Tensor) -> None:
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


def cli(*args: str | Path) -> Result:
    """``tfgraph build ...`` in this process; asserts success."""
    result = CliRunner().invoke(main, ["build", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result


def saved(family: str, folder: Path, dtype: torch.dtype = torch.float32
          ) -> tuple[Case, Any]:
    """The family's reference model (a transformers PreTrainedModel, seeded as in
    test_hf_families) saved to ``folder``: sharded (30 KB shards, index file) for every other
    family, one file for the rest, so both checkpoint layouts are read."""
    case = CASES[family]
    ref: Any = build_reference(case, seed=family_seed(family)).to(dtype)
    sharded = family_seed(family) % 2 == 1
    ref.save_pretrained(folder, max_shard_size="30KB" if sharded else "5GB")
    assert (folder / "model.safetensors.index.json").is_file() == sharded
    return case, ref


def checkpoint_tensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of a folder's safetensors files, shards merged."""
    merged: dict[str, Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        part = load_file(path)
        assert not merged.keys() & part.keys(), path.name
        merged |= part
    return merged


def load_torch_folder(folder: Path) -> nn.Module:
    """The model a ``--to torch`` folder's own model.py loads (as a user would import it)."""
    spec = importlib.util.spec_from_file_location(f"model_{abs(hash(folder))}",
                                                  folder / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load(str(folder)).eval()


def onnx_logits(path: Path, feeds: dict[str, Tensor]) -> Tensor:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    given = {k: v.numpy() for k, v in feeds.items()}
    for arg in session.get_inputs():  # BERT's segment ids: all zeros, as in transformers
        if arg.name == "token_type_ids":
            given["token_type_ids"] = np.zeros_like(given["input_ids"])
    return torch.from_numpy(session.run(None, given)[0])


def feeds_for(case: Case, torch_folder: Path) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(Hugging Face kwargs, tfgraph feeds) for the spec a torch folder was built from."""
    return inputs(tfgraph.load_spec(torch_folder / "spec.yaml"), case.kind)


def hf_logits(model: nn.Module, kwargs: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        return model(**kwargs).logits


def torch_logits(net: nn.Module, feeds: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        return net(*feeds.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_and_torch_from_a_folder_match_hugging_face(family: str, tmp_path: Path) -> None:
    case, ref = saved(family, tmp_path / "hf")
    cli(tmp_path / "hf", "--to", "onnx", "-o", tmp_path / "model.onnx")
    cli(tmp_path / "hf", "--to", "torch", "-o", tmp_path / "torch")
    kwargs, feeds = feeds_for(case, tmp_path / "torch")
    expected = hf_logits(ref, kwargs)
    same(onnx_logits(tmp_path / "model.onnx", feeds), expected)
    net = load_torch_folder(tmp_path / "torch")
    same(torch_logits(net, feeds), expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_folder_from_a_folder_round_trips(family: str, tmp_path: Path) -> None:
    case, ref = saved(family, tmp_path / "hf")
    cli(tmp_path / "hf", "--to", "hf", "-o", tmp_path / "out")
    auto = getattr(transformers, AUTO[case.kind])
    back = auto.from_pretrained(tmp_path / "out", attn_implementation=case.attn).eval()
    assert type(back) is type(ref)
    kwargs, _ = inputs(tfgraph.load_spec(tmp_path / "hf"), case.kind)
    same(hf_logits(back, kwargs), hf_logits(ref, kwargs))

    assert_same_tensors(tmp_path / "out", tmp_path / "hf")


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "modernbert"])
def test_encoders_on_padded_ids_as_in_hugging_face(family: str, tmp_path: Path) -> None:
    """RoBERTa counts positions over the non-padding ids (embedding.position_pad_id): a row
    padded on the left, one with padding inside and one without give transformers' logits
    (no attention mask: every token attends, only the positions tell the pads apart) through
    to_torch's interpreter, the standalone model.py and ONNX opsets 23 and 17; ModernBERT's
    bidirectional windows the same way (its positions ignore padding)."""
    from tfgraph.exporters.onnx.model import to_onnx

    case, ref = saved(family, tmp_path / "hf")
    pad = ref.config.pad_token_id
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, ref.config.vocab_size, (3, 9), generator=gen)
    ids[0, :4] = pad  # left padding
    ids[1, 2] = ids[1, 5] = ids[1, 6] = pad  # padding inside the row
    expected = hf_logits(ref, {"input_ids": ids})
    cli(tmp_path / "hf", "--to", "torch", "-o", tmp_path / "torch")
    same(torch_logits(load_torch_folder(tmp_path / "torch"), {"input_ids": ids}), expected)
    spec = tfgraph.load_spec(tmp_path / "torch" / "spec.yaml")
    if family == "modernbert":
        assert spec.attention.window is not None and spec.attention.window < ids.shape[1]
    else:
        rows = ref.roberta.embeddings.create_position_ids_from_input_ids(ids, pad)
        assert rows[0, :4].eq(pad).all() and rows[0, 4] == pad + 1  # the rule tested
        assert spec.embedding.position_pad_id == pad and spec.embedding.position_offset == pad + 1
    graph = tfgraph.compile(spec)
    names = name_map(json.loads((tmp_path / "hf" / "config.json").read_text()), spec)
    weights = {k: v.detach() for k, v in names.to_tfgraph(ref.state_dict()).items()}
    same(torch_logits(to_torch(graph, weights=weights).eval(), {"input_ids": ids}), expected)
    for opset in (23, 17):
        model = to_onnx(graph, weights=weights, opset=opset)
        path = tmp_path / f"m{opset}.onnx"
        path.write_bytes(model.SerializeToString())
        same(onnx_logits(path, {"input_ids": ids}), expected)


def assert_same_tensors(written: Path, original: Path) -> None:
    """``written``/model.safetensors holds exactly ``original``'s tensors: names, dtypes,
    shapes and bits."""
    want = checkpoint_tensors(original)
    got = load_file(written / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert torch.equal(got[name].view(torch.uint8), value.view(torch.uint8)), name


# bfloat16 keeps 8 significant bits: one step is 2^-8 ≈ 0.4% of a value. The two models round
# their activations a few dozen times per layer at different points (transformers computes
# norms and rotary in float32 and casts back; tfgraph's fused kernels round elsewhere), and
# independent roundings add up like a random walk: the largest difference between tfgraph's and
# transformers' bfloat16 logits measures 1.3% (llama), 1.7% (t5) and 3.2% (gemma2: softcaps,
# sandwich norms) of the largest logit. The bound is ten steps of the largest logit (atol 4% of
# it) plus five steps of each value (rtol 2e-2); float16 keeps 11 bits: the same bound 8x
# tighter (the float16 ONNX models measure at most 0.23% of the largest logit from float32).
LOW_PRECISION = {torch.bfloat16: (4e-2, 2e-2), torch.float16: (5e-3, 2.5e-3)}
# How far tfgraph's bfloat16 logits may be from the float32 ones, as a multiple of how far
# transformers' own bfloat16 model is (measured: 0.02 (mixtral) to 0.98 (t5)).
AS_ACCURATE = 1.5
BF16_FAMILIES = ["gemma2", "llama", "mixtral", "t5"]


def agree(dtype: torch.dtype, got: Tensor, want: Tensor, scale: float, moe: bool) -> bool:
    """Whether ``got`` is within ``dtype``'s bound of ``want``: at every position, or for a
    mixture of experts at most of them. A near-tied router choice flips under 16-bit rounding
    in any implementation (transformers' own bfloat16 Mixtral routes a token unlike its
    float32 self; tfgraph's float16 ONNX one whose experts' logits differ by 2.4e-4, under one
    float16 step), and in a causal model that token's other hidden state reaches every later
    position through attention. A wrong conversion puts every position off."""
    atol, rtol = LOW_PRECISION[dtype]
    err = (got.float() - want.float()).abs() - rtol * want.float().abs()
    close = (err <= atol * scale).all(dim=-1)  # per position
    return bool(close.float().mean() >= 0.5) if moe else bool(close.all())


def error(got: Tensor, want: Tensor, moe: bool) -> float:
    """How far 16-bit logits are from the float32 ones: the largest difference, or for a
    mixture of experts the median position's largest (a near-tied router choice flipped by
    16-bit rounding sends one token, and every later one through attention, elsewhere in any
    implementation: ``agree``; which random weights have such a near-tie is chance)."""
    per_position = (got.float() - want.float()).abs().amax(dim=-1)
    return float(per_position.median() if moe else per_position.max())


@pytest.mark.parametrize("family", BF16_FAMILIES)
def test_bfloat16_folder(family: str, tmp_path: Path) -> None:
    case, _ = saved(family, tmp_path / "hf", torch.bfloat16)
    cls = getattr(transformers, case.model)
    # Loaded, not ``ref.float()``: ``.to(bfloat16)`` also rounds the rotary inv_freq buffer,
    # which from_pretrained recomputes in float32, as a user loading the folder gets it.
    hf16 = cls.from_pretrained(tmp_path / "hf", dtype=torch.bfloat16,
                               attn_implementation="eager").eval()
    hf32 = cls.from_pretrained(tmp_path / "hf", dtype=torch.float32,
                               attn_implementation="eager").eval()

    torch_build = cli(tmp_path / "hf", "--to", "torch", "-o", tmp_path / "torch")
    assert "note:" not in torch_build.output
    stored = load_file(tmp_path / "torch" / "weights.safetensors")
    assert {v.dtype for v in stored.values()} == {torch.bfloat16}
    kwargs, feeds = feeds_for(case, tmp_path / "torch")
    want16, want32 = hf_logits(hf16, kwargs), hf_logits(hf32, kwargs)
    scale = want32.abs().max().item()
    net = load_torch_folder(tmp_path / "torch")
    got = torch_logits(net, feeds)
    assert got.dtype == torch.bfloat16
    assert agree(torch.bfloat16, got, want16, scale, case.moe), (got.float() - want16).abs()
    err_ours, err_theirs = error(got, want32, case.moe), error(want16, want32, case.moe)
    assert err_ours <= AS_ACCURATE * err_theirs, (err_ours, err_theirs)
    # The bfloat16 values themselves came through unchanged: upcast, the same float32 model.
    same(torch_logits(net.float(), feeds), want32)

    onnx_build = cli(tmp_path / "hf", "--to", "onnx", "-o", tmp_path / "f32.onnx")
    assert "bfloat16" in onnx_build.stderr and "float32" in onnx_build.stderr
    got32 = onnx_logits(tmp_path / "f32.onnx", feeds)
    assert got32.dtype == torch.float32
    same(got32, want32)

    cli(tmp_path / "hf", "--to", "hf", "-o", tmp_path / "out")  # bfloat16 kept, bit for bit
    assert_same_tensors(tmp_path / "out", tmp_path / "hf")

    cli(tmp_path / "hf", "--to", "onnx", "--dtype", "float16", "-o", tmp_path / "f16.onnx")
    got16 = onnx_logits(tmp_path / "f16.onnx", feeds)
    assert got16.dtype == torch.float16
    assert agree(torch.float16, got16, want32, scale, case.moe), (got16 - want32).abs()


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_float16_as_accurate_as_transformers(family: str, tmp_path: Path) -> None:
    """Issue 24 item 4, on CPU: tfgraph's float16 torch module is within AS_ACCURATE of
    transformers' own float16 model's distance from the float32 logits (the bfloat16 test
    above holds the same for bfloat16)."""
    case, _ = saved(family, tmp_path / "hf", torch.float16)
    cls = getattr(transformers, case.model)
    hf16 = cls.from_pretrained(tmp_path / "hf", dtype=torch.float16,
                               attn_implementation="eager").eval()
    hf32 = cls.from_pretrained(tmp_path / "hf", dtype=torch.float32,
                               attn_implementation="eager").eval()
    cli(tmp_path / "hf", "--to", "torch", "-o", tmp_path / "torch")
    kwargs, feeds = feeds_for(case, tmp_path / "torch")
    want16, want32 = hf_logits(hf16, kwargs), hf_logits(hf32, kwargs)
    got = torch_logits(load_torch_folder(tmp_path / "torch"), feeds)
    assert got.dtype == torch.float16
    err_ours = (got.float() - want32).abs().max().item()
    err_theirs = (want16.float() - want32).abs().max().item()
    assert err_ours <= AS_ACCURATE * err_theirs, (err_ours, err_theirs)


# Every tiny spec some Hugging Face family expresses exactly (tfgraph.hf.export_config); the
# test below keeps the list honest. tiny-moe's topk_softmax router is Mixtral's
# softmax-then-renormalise in value, and exports as Mixtral.
EXPORTABLE = ["tiny-bart", "tiny-bert", "tiny-bf16", "tiny-cohere", "tiny-cohere2",
              "tiny-decoder", "tiny-deepseek-v3",
              "tiny-falcon", "tiny-falcon-rw", "tiny-fp16", "tiny-gemma",
              "tiny-gemma2", "tiny-gemma3", "tiny-gptj", "tiny-granite", "tiny-llama",
              "tiny-llama3", "tiny-mistral", "tiny-moe", "tiny-mpt", "tiny-nemotron", "tiny-neox",
              "tiny-mla", "tiny-olmo", "tiny-olmo2", "tiny-olmoe", "tiny-phimoe",
              "tiny-opt", "tiny-phi", "tiny-pythia", "tiny-qwen2", "tiny-qwen2-moe",
              "tiny-qwen3", "tiny-t5", "tiny-yarn", "tiny-roberta", "tiny-modernbert"]


def test_exportable_is_every_tiny_spec_a_family_expresses() -> None:
    from tfgraph.errors import TfgraphError
    from tfgraph.hf.export_config import hf_config

    accepted = []
    for path in sorted((ROOT / "specs").glob("tiny*.yaml")):
        try:
            hf_config(tfgraph.load_spec(path))
        except TfgraphError:
            continue
        accepted.append(path.stem)
    assert sorted(accepted) == sorted(EXPORTABLE)


@pytest.mark.parametrize("name", EXPORTABLE)
def test_hf_folder_from_a_spec(name: str, tmp_path: Path) -> None:
    path = ROOT / "specs" / f"{name}.yaml"
    cli(path, "--to", "hf", "-o", tmp_path / "out", "--seed", "3")
    spec = tfgraph.load_spec(path)
    ours = to_torch(tfgraph.compile(spec), seed=3).eval()
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])
    # Falcon-RW's ALiBi is matched against SDPA: eager adds it twice (test_hf_families' Case.attn)
    attn = "sdpa" if config["model_type"] == "falcon" and config.get("alibi") else "eager"
    hf = cls.from_pretrained(tmp_path / "out", attn_implementation=attn).eval()

    # the very weights: Hugging Face's state dict mapped back equals to_torch's, bit for bit
    mine = ours.state_dict()
    theirs = name_map(config, spec).to_tfgraph(hf.state_dict())
    assert sorted(theirs) == sorted(mine)
    for key, value in mine.items():
        assert theirs[key].dtype == value.dtype and torch.equal(theirs[key], value), key

    kwargs, feeds = inputs(spec, "seq2seq" if spec.arch == "encoder-decoder" else "causal")
    if spec.dtype != "float32":  # the same values, compared where 1e-4 means something
        ours, hf = ours.float(), cls.from_pretrained(
            tmp_path / "out", dtype=torch.float32, attn_implementation=attn).eval()
    same(torch_logits(ours, feeds), hf_logits(hf, kwargs))


# A Llama-architecture folder the size of benchmarks/hf_build.py's (the peers README's benchmarks quote): 200.8M
# parameters, 402 MB in float16.
BIG: dict[str, Any] = dict(
    hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
    num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
    tie_word_embeddings=False, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
    dtype="float16")


def write_big_llama(folder: Path) -> int:
    """A LlamaForCausalLM folder of BIG's sizes written with safetensors directly (building
    the transformers model would take longer than the conversion): one shard per layer plus
    embeddings and head, an index, small non-zero float16 values. Returns its weight bytes."""
    from safetensors.numpy import save_file

    d, f, L = BIG["hidden_size"], BIG["intermediate_size"], BIG["num_hidden_layers"]
    kv = d // BIG["num_attention_heads"] * BIG["num_key_value_heads"]
    block = (np.random.default_rng(0).standard_normal(1 << 16) * 0.02).astype(np.float16)

    def values(*shape: int) -> np.ndarray:
        return np.resize(block, shape)  # a repeated random block: fast to make, not constant

    shards: dict[str, dict[str, np.ndarray]] = {
        "embed": {"model.embed_tokens.weight": values(BIG["vocab_size"], d),
                  "model.norm.weight": np.ones(d, np.float16)},
        "head": {"lm_head.weight": values(BIG["vocab_size"], d)}}
    for i in range(L):
        p = f"model.layers.{i}."
        shards[f"layer{i}"] = {
            p + "self_attn.q_proj.weight": values(d, d), p + "self_attn.k_proj.weight":
            values(kv, d), p + "self_attn.v_proj.weight": values(kv, d),
            p + "self_attn.o_proj.weight": values(d, d), p + "mlp.gate_proj.weight":
            values(f, d), p + "mlp.up_proj.weight": values(f, d), p + "mlp.down_proj.weight":
            values(d, f), p + "input_layernorm.weight": np.ones(d, np.float16),
            p + "post_attention_layernorm.weight": np.ones(d, np.float16)}
    weight_map: dict[str, str] = {}
    total = 0
    for n, (key, tensors) in enumerate(shards.items()):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, folder / name, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, name)
        total += sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    config = transformers.LlamaConfig(**BIG)
    config.architectures = ["LlamaForCausalLM"]
    (folder / "config.json").write_text(config.to_json_string())
    return total


# tfgraph's names of BIG's parameters (README, "Parameter names").
BIG_NAMES = ["embed.tokens.weight", "decoder.norm.weight", "head.weight"] + [
    f"decoder.layers.{i}.{name}" for i in range(BIG["num_hidden_layers"]) for name in (
        "self_attn.q.weight", "self_attn.k.weight", "self_attn.v.weight", "self_attn.o.weight",
        "self_attn_norm.weight", "ffn.gate.weight", "ffn.up.weight", "ffn.down.weight",
        "ffn_norm.weight")]


# Runs the command given as its arguments and prints its peak RSS (KiB) and exit status last.
# ru_maxrss, as wait4 reports it, starts at the high-water mark of the memory the child had
# before exec, i.e. of the process that forked it: measured straight from this test process
# (torch, transformers, the shards it just wrote) a `python -c pass` child reads ~1 GB. So a
# small interpreter forks the measured command and waits for it (as benchmarks/hf_build.py).
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def peak_rss(args: list[str], cwd: Path) -> tuple[int, int, str, str]:
    """(peak RSS bytes, exit status, stdout, stderr) of ``python args``."""
    child = subprocess.Popen([sys.executable, "-c", LAUNCHER, *args], cwd=cwd, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, stderr[-2000:]
    *output, last = stdout.splitlines()
    maxrss_kib, status = map(int, last.split())
    return maxrss_kib * 1024, status, "\n".join(output), stderr


def test_big_folder_converts_in_less_memory_than_its_weights(tmp_path: Path) -> None:
    folder = tmp_path / "llama-200m"
    folder.mkdir()
    size = write_big_llama(folder)
    assert size == 2 * 200_827_904  # 200.8M float16 parameters
    out = tmp_path / "big.onnx"
    peak, status, stdout, stderr = peak_rss(
        ["-m", "tfgraph", "build", str(folder), "--to", "onnx", "--dtype", "float16", "-o",
         str(out)], tmp_path)
    assert status == 0, stderr[-2000:]
    assert "200,827,904 params" in stdout and "float16" in stdout, stdout
    import onnx
    from onnx import numpy_helper
    from safetensors.numpy import load_file as load_numpy

    model = onnx.load(out)  # every weight in the model, in float16, the head's as stored
    inits = {t.name: t for t in model.graph.initializer if t.name in BIG_NAMES}
    assert sorted(inits) == sorted(BIG_NAMES)
    assert {t.data_type for t in inits.values()} == {onnx.TensorProto.FLOAT16}
    assert sum(np.prod(t.dims) for t in inits.values()) == size // 2
    head = load_numpy(folder / json.loads((folder / "model.safetensors.index.json").read_text())
                      ["weight_map"]["lm_head.weight"])["lm_head.weight"]
    assert np.array_equal(numpy_helper.to_array(inits["head.weight"]), head)
    # the conversion's time is measured by benchmarks/hf_build.py (the same 200.8M folder)
    print(f"\npeak RSS {peak / 1e6:.0f} MB for {size / 1e6:.0f} MB of weights")
    assert peak < size, f"peak RSS {peak / 1e6:.0f} MB >= {size / 1e6:.0f} MB of weights"
