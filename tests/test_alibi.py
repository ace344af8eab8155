"""ALiBi positions (``embedding.positions: alibi``) against Hugging Face's ``BloomForCausalLM``.

A tiny BLOOM built from ``BloomConfig`` with random weights, copied into tfgraph through the
name map below (BLOOM's fused ``query_key_value`` rows are per head [q, k, v]), gives the same
logits through ``to_torch`` and through ONNX (opsets 23 and 17) in onnxruntime, for a
power-of-two head count and one that is not (BLOOM's slopes interleave a second series); the
KV-cache graph gives the logits of a left-padded batch that transformers gives with the same
attention mask, and greedy decoding through the cache equals transformers' ``generate``.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

import tfgraph
from tfgraph.exporters import to_onnx, to_torch
from tfgraph.exporters.torch.folder import write_torch_folder
from tfgraph.exporters.torch.source import generate_source
from tfgraph.graph.ops import alibi_slopes
from tfgraph.spec.schema import Spec

from parity_support import check_against, greedy_with_cache, randomize, split_neox_qkv

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
TOL = dict(atol=1e-4, rtol=1e-4)


def bloom_spec(heads: int) -> Spec:
    return tfgraph.Spec.model_validate({
        "name": f"bloom-{heads}", "arch": "decoder-only", "d_model": 16 * heads, "layers": 2,
        "vocab": 128,
        "embedding": {"positions": "alibi", "scale": False, "tie_output": True, "norm": True},
        "attention": {"heads": heads, "bias": True},
        "ffn": {"hidden": 64 * heads, "activation": "gelu_tanh", "bias": True},
        "norm": {"position": "pre", "kind": "layernorm", "eps": 1e-5}, "dropout": 0.0})


def bloom_reference(spec: Spec, seed: int = 0) -> torch.nn.Module:
    config = transformers.BloomConfig(
        vocab_size=spec.vocab_size("source"), hidden_size=spec.d_model, n_layer=spec.layers,
        n_head=spec.attention.heads, layer_norm_epsilon=spec.norm.eps,
        hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
        pad_token_id=0)
    ref = transformers.BloomForCausalLM(config).eval()
    randomize(ref, seed)
    return ref


def bloom_weights(spec: Spec, ref: torch.nn.Module) -> dict[str, Tensor]:
    """BLOOM's names (``transformer.h.i.self_attention.query_key_value``, ...) to tfgraph's."""
    sd = ref.state_dict()
    weights = {"embed.tokens.weight": sd["transformer.word_embeddings.weight"]}
    for kind in ("weight", "bias"):
        weights[f"decoder.embed_norm.{kind}"] = sd[f"transformer.word_embeddings_layernorm.{kind}"]
        weights[f"decoder.norm.{kind}"] = sd[f"transformer.ln_f.{kind}"]
    for i in range(spec.layers):
        src, dst = f"transformer.h.{i}", f"decoder.layers.{i}"
        for kind in ("weight", "bias"):
            q, k, v = split_neox_qkv(sd[f"{src}.self_attention.query_key_value.{kind}"],
                                     spec.attention.heads)
            weights.update({f"{dst}.self_attn.q.{kind}": q, f"{dst}.self_attn.k.{kind}": k,
                            f"{dst}.self_attn.v.{kind}": v})
            pairs = {"self_attn.o": "self_attention.dense", "self_attn_norm": "input_layernorm",
                     "ffn_norm": "post_attention_layernorm", "ffn.up": "mlp.dense_h_to_4h",
                     "ffn.down": "mlp.dense_4h_to_h"}
            for ours, theirs in pairs.items():
                weights[f"{dst}.{ours}.{kind}"] = sd[f"{src}.{theirs}.{kind}"]
    return weights


@pytest.mark.parametrize("heads", list(range(1, 41)) + [64, 96, 112])
def test_slopes_are_blooms(heads: int) -> None:
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    theirs = _get_alibi_slopes(heads, torch.device("cpu")).double()
    ours = torch.tensor(alibi_slopes(heads), dtype=torch.float64)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=1e-6)
    if heads & (heads - 1) == 0:  # Press et al. 2022: 2^(-8/n), 2^(-16/n), ...
        assert ours.tolist() == pytest.approx([2 ** (-8 * h / heads) for h in range(1, heads + 1)])


@pytest.mark.parametrize("heads", [4, 6])
def test_logits_equal_bloom_through_torch_and_onnx(heads: int) -> None:
    spec = bloom_spec(heads)
    ref = bloom_reference(spec)
    weights = bloom_weights(spec, ref)
    ids, expected = check_against(spec, ref, weights)  # to_torch and ONNX opset 23
    model = to_onnx(tfgraph.compile(spec), weights=weights, opset=17)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input_ids": ids.numpy()})[0]
    np.testing.assert_allclose(got, expected.numpy(), **TOL)


def padded(spec: Spec) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(3)
    lengths = (4, 11, 7)
    ids = torch.zeros((len(lengths), max(lengths)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, -n:] = torch.randint(1, spec.vocab_size("source"), (n,), generator=gen)
        mask[row, -n:] = 1
    return ids, mask


@pytest.mark.parametrize("opset", [23, 17])
def test_kv_cache_on_a_padded_batch_equals_bloom(opset: int) -> None:
    spec = bloom_spec(6)
    ref = bloom_reference(spec, seed=1)
    weights = bloom_weights(spec, ref)
    ids, mask = padded(spec)
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
    cached = to_torch(tfgraph.compile(spec, cache=True), weights=weights)
    graph = tfgraph.compile(spec, cache=True)
    assert "position_ids" not in graph.inputs  # ALiBi reads key positions from the mask
    session = ort.InferenceSession(to_onnx(graph, weights=weights, opset=opset)
                                   .SerializeToString(), providers=["CPUExecutionProvider"])
    past = {i.name: np.zeros((3, spec.attention.kv_heads, 0, spec.attention.head_dim),
                             np.float32)
            for i in session.get_inputs() if i.name.startswith("past_key_values")}
    onnx_logits = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                                     **past})[0]
    with torch.no_grad():
        ours = cached(ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(ours[real], want[real], **TOL)
    np.testing.assert_allclose(onnx_logits[real.numpy()], want[real].numpy(), **TOL)


def test_greedy_generation_through_the_cache_equals_bloom_generate() -> None:
    spec = bloom_spec(6)
    ref = bloom_reference(spec, seed=2)
    model = to_torch(tfgraph.compile(spec), weights=bloom_weights(spec, ref))
    ids, mask = padded(spec)
    new = 12
    with torch.no_grad():
        want = ref.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                            min_new_tokens=new, pad_token_id=0)[:, ids.shape[1]:]
    assert greedy_with_cache(model, ids, mask, new).tolist() == want.tolist()


def test_alibi_is_for_decoders_and_costs_no_parameters() -> None:
    with pytest.raises(ValueError, match="alibi"):
        tfgraph.Spec.model_validate({**bloom_spec(4).model_dump(), "arch": "encoder-only"})
    spec = bloom_spec(4)
    graph = tfgraph.compile(spec)
    bias = [n for n in graph.ops() if n.op == "alibi"]
    assert len(bias) == 1 and bias[0].attrs["slopes"] == alibi_slopes(4)
    alibi = graph.report(seq=32)
    assert alibi["params"] == sum(p.numel() for p in bloom_reference(spec).parameters())
    plain = tfgraph.compile(tfgraph.Spec.model_validate(
        {**spec.model_dump(), "embedding": {**spec.embedding.model_dump(),
                                            "positions": "none"}})).report(seq=32)
    # one bias per stack (h * S * S multiplies, slope * (j - i), shared by the layers) and,
    # in every layer, one add per score (B * h * S * S)
    heads, seq, layers = 4, 32, spec.layers
    assert alibi["flops"]["matmul"] == plain["flops"]["matmul"]
    assert alibi["flops"]["other"] - plain["flops"]["other"] == \
        heads * seq * seq + layers * heads * seq * seq


def test_every_pass_knows_alibi_from_its_op_definition(tmp_path: Path) -> None:
    """The op's facts reach the planner, model.py, the lengths rule and the diagrams without
    a row anywhere else (tfgraph/graph/ops.py's OpDef and spec.POSITION_KINDS)."""
    spec_path = "specs/tiny-bloom.yaml"
    root = Path(__file__).resolve().parent.parent

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tfgraph", *args], cwd=root,
                              capture_output=True, text=True, timeout=300)

    plan = cli("plan", spec_path, "--gpus", "2", "--tp", "2")
    assert plan.returncode == 2 and plan.stderr.count("\n") == 1
    assert "decoder.alibi (alibi)" in plan.stderr and "ALiBi position bias" in plan.stderr
    assert cli("plan", spec_path, "--gpus", "2", "--dp", "2").returncode == 0
    longer = cli("report", spec_path, "--seq", "200", "--json")
    assert longer.returncode == 0 and "ALiBi biases extrapolate" in longer.stderr
    source = generate_source(tfgraph.compile(tfgraph.load_spec(root / spec_path)))
    assert "ALiBi position bias is not split" in source  # model.py's TP_REFUSED
    dot = cli("draw", spec_path, "--level", "model", "-o", str(tmp_path / "m.dot"))
    assert dot.returncode == 0
    assert "ALiBi (linear bias" in (tmp_path / "m.dot").read_text()


# ---- Falcon-RW's ALiBi: divided by sqrt(head_dim), rounded to bfloat16 per row -------------


def falcon_spec(heads: int, scaled: bool = True, rounded: bool = True) -> Spec:
    """bloom_spec with Falcon-RW's options (embedding.alibi_scaled, alibi_bfloat16)."""
    spec = bloom_spec(heads).model_dump()
    spec["embedding"] |= {"alibi_scaled": scaled, "alibi_bfloat16": rounded}
    return tfgraph.Spec.model_validate(spec)


@pytest.mark.parametrize("heads", [12, 16, 32])
def test_falcons_bias_is_build_alibi_tensor_bit_for_bit(heads: int) -> None:
    """torch_functional.alibi_bias on a left-padded mask against transformers' falcon
    build_alibi_tensor (then / sqrt(head_dim), as FalconModel.forward): the same floats, and
    not BLOOM's float32 bias at key indices (which a padded row's shift would make differ)."""
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    from tfgraph.exporters.torch.functional import alibi_bias

    _, mask = padded(bloom_spec(4))
    mask = torch.cat([mask, torch.ones((3, 40), dtype=torch.long)], 1)  # positions to 50
    x = torch.zeros((3, mask.shape[1], 8))
    slopes = torch.tensor(alibi_slopes(heads))
    theirs = build_alibi_tensor(mask, heads, torch.float32).view(3, heads, 1, -1) / math.sqrt(8)
    ours = alibi_bias(slopes, x, mask, True, 8)
    assert ours.shape == (3, heads, mask.shape[1], mask.shape[1])
    assert torch.equal(ours, theirs.expand_as(ours))
    plain = alibi_bias(slopes, x, None, False, 8)[:, -1]  # slope * (j - i), float32
    shifted = plain[None] - plain[None, :, -1:] + theirs[:, :, 0, -1:]  # a per-row constant
    real = mask[:, None].bool().expand(-1, heads, -1)
    assert not torch.equal(shifted[real], theirs[:, :, 0][real])  # rounding shows


@pytest.mark.parametrize("scaled,rounded", [(True, True), (True, False), (False, True)])
def test_falcons_options_agree_in_every_back_end(scaled: bool, rounded: bool,
                                                 tmp_path: Path) -> None:
    """to_torch, the generated model.py and ONNX opsets 23 and 17 give the same logits; the
    KV-cache graph gives the full graph's logits on an unpadded batch (one prefill, then one
    token at a time) and, left-padded, torch and ONNX agree on every real position."""
    spec = falcon_spec(12, scaled, rounded)
    graph = tfgraph.compile(spec)
    node = next(n for n in graph.ops() if n.op == "alibi")
    assert node.attrs.get("scaled", False) == scaled
    assert node.attrs.get("bfloat16", False) == rounded
    model = to_torch(graph, seed=5).eval()
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    ids = torch.randint(1, 128, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids)
    write_torch_folder(graph, tmp_path / "torch", weights, seed=0)
    loader = importlib.util.spec_from_file_location(f"falcon_{scaled}_{rounded}",
                                                    tmp_path / "torch" / "model.py")
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    net = module.load(str(tmp_path / "torch")).eval()
    with torch.no_grad():
        torch.testing.assert_close(net(ids), want, **TOL)
    for opset in (23, 17):
        session = ort.InferenceSession(to_onnx(graph, weights=weights, opset=opset)
                                       .SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(session.run(None, {"input_ids": ids.numpy()})[0],
                                   want.numpy(), **TOL)
    cached = to_torch(tfgraph.compile(spec, cache=True), weights=weights).eval()
    with torch.no_grad():
        mask = torch.ones((2, 8), dtype=torch.long)
        logits, past = cached(ids[:, :8], attention_mask=mask, use_cache=True)
        steps = [logits]
        for t in range(8, 13):
            mask = torch.cat([mask, torch.ones((2, 1), dtype=torch.long)], 1)
            logits, past = cached(ids[:, t:t + 1], attention_mask=mask, past_key_values=past,
                                  use_cache=True)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), want, **TOL)
    ids, mask = padded(spec)
    cache_graph = tfgraph.compile(spec, cache=True)
    with torch.no_grad():
        ours = cached(ids, attention_mask=mask)
    real = mask.bool()
    for opset in (23, 17):
        session = ort.InferenceSession(to_onnx(cache_graph, weights=weights, opset=opset)
                                       .SerializeToString(), providers=["CPUExecutionProvider"])
        past = {i.name: np.zeros((3, spec.attention.kv_heads, 0, spec.attention.head_dim),
                                 np.float32)
                for i in session.get_inputs() if i.name.startswith("past_key_values")}
        got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                                 **past})[0]
        np.testing.assert_allclose(got[real.numpy()], ours[real].numpy(), **TOL)


def test_falcons_bias_is_per_row_only_where_rounded_and_counted() -> None:
    """A KV-cache graph's rounded bias is (B, h, S, T), BLOOM's stays (h, S, T); FLOPs: one
    multiply per head and key (per row when per row), one more when divided by sqrt(hd)."""
    bloom = tfgraph.compile(bloom_spec(4), cache=True)
    falcon = tfgraph.compile(falcon_spec(4), cache=True)
    (b,) = [n for n in bloom.ops() if n.op == "alibi"]
    (f,) = [n for n in falcon.ops() if n.op == "alibi"]
    assert "bfloat16" not in b.attrs and "scaled" not in b.attrs  # BLOOM's graph unchanged
    assert len(b.type.shape) == 3 and len(f.type.shape) == 4
    heads, seq, layers = 4, 32, 2
    plain = tfgraph.compile(tfgraph.Spec.model_validate(
        {**bloom_spec(4).model_dump(), "embedding": {**bloom_spec(4).embedding.model_dump(),
                                                     "positions": "none"}})).report(seq=seq)
    scaled = tfgraph.compile(falcon_spec(4)).report(seq=seq)
    assert scaled["flops"]["matmul"] == plain["flops"]["matmul"]
    assert scaled["flops"]["other"] - plain["flops"]["other"] == \
        2 * heads * seq + layers * heads * seq * seq
    with pytest.raises(ValueError, match="alibi_scaled"):
        tfgraph.Spec.model_validate({**bloom_spec(4).model_dump(), "embedding": {
            **bloom_spec(4).embedding.model_dump(), "positions": "none", "alibi_scaled": True}})


def test_fused_attention_keeps_the_written_out_form_for_falcons_alibi() -> None:
    from tfgraph.exporters.onnx.fused_attention import OP_TYPE, refusal

    graph = tfgraph.compile(falcon_spec(4), cache=True)
    why = refusal(graph)
    assert why is not None and "additive position bias" in why
    model = to_onnx(graph, seed=0, fused_attention=True)
    assert not any(n.op_type == OP_TYPE for n in model.graph.node)


def test_tfgraph_generate_on_a_falcon_rw_folder_equals_transformers(tmp_path: Path) -> None:
    """``tfgraph generate DIR`` (ONNX and torch back ends) on prompts of different lengths,
    left-padded, gives transformers' greedy tokens (SDPA: the attention Falcon-RW defines)."""
    import json

    config = transformers.FalconConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=16, vocab_size=101,
        alibi=True, multi_query=False, parallel_attn=False, bias=True, ffn_hidden_size=128,
        bos_token_id=0, eos_token_id=0)
    ref = transformers.FalconForCausalLM._from_config(config, attn_implementation="sdpa")
    randomize(ref.eval(), 7)
    ref.save_pretrained(tmp_path / "rw")
    prompts = [[5, 17, 42, 8, 9, 33, 61, 2, 90], [3, 9], [11, 12, 13, 14, 15]]
    ids = torch.zeros((3, 9), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, 9 - len(p):] = torch.tensor(p)
        mask[row, 9 - len(p):] = 1
    with torch.no_grad():
        want = ref.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                            eos_token_id=-1, pad_token_id=0)[:, 9:].tolist()
    for backend in ("onnx", "torch"):
        result = subprocess.run(
            [sys.executable, "-m", "tfgraph", "generate", str(tmp_path / "rw"), "--backend",
             backend, "--max-new-tokens", "8", "--ignore-eos", "--json",
             *[a for p in prompts for a in ("--prompt-ids", ",".join(map(str, p)))]],
            capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["tokens"] == want, backend


def test_falcon_rw_decoding_equals_full_recomputation() -> None:
    """specs/tiny-falcon-rw.yaml on left-padded prompts of three lengths: the KV cache (torch
    and ONNX) and the static cache's stepper give the tokens of full recomputation."""
    from tfgraph.exporters.generation.cached_steppers import TorchStatic
    from tfgraph.generation.loop import generate as run_loop
    from tfgraph.generation.sampling import Sampler

    path = str(Path(__file__).resolve().parent.parent / "specs" / "tiny-falcon-rw.yaml")
    prompts = [[5, 17, 42], [7, 8], [3, 1, 4, 1, 5, 9, 2]]
    want = tfgraph.generate(path, prompts, max_new_tokens=10, backend="torch", cache=False,
                            eos_token_id=None).tokens
    for backend in ("torch", "onnx"):
        assert tfgraph.generate(path, prompts, max_new_tokens=10, backend=backend,
                                eos_token_id=None).tokens == want, backend
    spec = tfgraph.load_spec(path)
    stepper = TorchStatic(to_torch(tfgraph.compile(spec, cache=True), seed=0),
                          spec.output_vocab, None, "cpu")
    stepper.prepare(len(prompts), 7, 10)
    assert run_loop(stepper, prompts, 10, Sampler(None, None, None, None), 1, ()).tokens == want


# ---- 16-bit precision: the bias relative to the query, computed in float32 ----------------


def test_bias_is_relative_to_the_query_with_a_cache() -> None:
    """slope_h * (j - i) in float32, then cast, for queries at the last L of T keys (a KV
    cache's past P = T - L first): the keys near a query get small, exactly rounded biases
    in 16-bit models, whatever the position; and so does the ONNX graph's bias node."""
    from tfgraph.exporters.torch.functional import alibi_bias

    heads, past, length = 4, 1000, 3
    slopes = torch.tensor(alibi_slopes(heads))
    key, query = torch.arange(past + length), torch.arange(past, past + length)
    want32 = slopes[:, None, None] * (key[None, :] - query[:, None]).float()  # (h, L, T)
    x = torch.zeros((2, length, 8), dtype=torch.bfloat16)
    mask = torch.ones((2, past + length), dtype=torch.long)
    got = alibi_bias(slopes, x, mask, False, None)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want32.bfloat16())
    assert torch.equal(alibi_bias(slopes, x.half(), mask, False, 4), (want32 / 2).half())
    assert torch.equal(got[:, :, past:].float().diagonal(dim1=-2, dim2=-1), torch.zeros(
        heads, length))  # each query's own key: bias 0, not slope * 1000 rounded

    # the ONNX KV-cache graph's bias in float16, its node's output made a graph output
    import onnx

    graph = tfgraph.compile(bloom_spec(heads).model_copy(update={"dtype": "float16"}),
                            cache=True)
    (node,) = [n for n in graph.ops() if n.op == "alibi"]
    model = to_onnx(graph, seed=0)
    model.graph.output.append(onnx.helper.make_tensor_value_info(
        node.name, onnx.TensorProto.FLOAT16, None))
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    past_kv = {i.name: np.zeros((2, heads, past, 16), np.float16)
               for i in session.get_inputs() if i.name.startswith("past_key_values")}
    feeds = {"input_ids": np.ones((2, length), np.int64), "attention_mask": mask.numpy(),
             **past_kv}
    bias = session.run([node.name], feeds)[0]
    np.testing.assert_array_equal(bias, want32.half().numpy())


def test_bfloat16_logits_as_accurate_as_transformers_mpt(tmp_path: Path) -> None:
    """A tiny MPT (transformers adds its bias (j - L + 1) * slope in float32) over 768
    tokens: tfgraph's bfloat16 logits, through to_torch and through the generated model.py,
    are within 1.5x of transformers' own bfloat16 model's distance from the float32 logits
    (a bias slope * j rounded to bfloat16 is ~30x off at 1,024 tokens)."""
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from tfgraph.cli import main

    length = 768
    config = transformers.MptConfig(d_model=32, n_heads=4, n_layers=1, vocab_size=61,
                                    max_seq_len=length, bos_token_id=0,
                                    eos_token_id=0, pad_token_id=None)
    torch.manual_seed(0)
    transformers.MptForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "hf")
    hf16, hf32 = (transformers.MptForCausalLM.from_pretrained(tmp_path / "hf", dtype=dt).eval()
                  for dt in (torch.bfloat16, torch.float32))
    result = CliRunner().invoke(main, ["build", str(tmp_path / "hf"), "--to", "torch", "-o",
                                       str(tmp_path / "torch")])
    assert result.exit_code == 0, result.output
    ids = torch.randint(1, 61, (1, length), generator=torch.Generator().manual_seed(1))
    loader = importlib.util.spec_from_file_location("mpt_bf16", tmp_path / "torch" / "model.py")
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    graph = tfgraph.compile(tfgraph.load_spec(tmp_path / "torch" / "spec.yaml"))
    weights = load_file(tmp_path / "torch" / "weights.safetensors")
    with torch.no_grad():
        want16, want32 = hf16(ids).logits.float(), hf32(ids).logits
        theirs = (want16 - want32).abs().max().item()
        for net in (module.load(str(tmp_path / "torch")).eval(),
                    to_torch(graph, weights=weights).eval()):
            got = net(ids)
            assert got.dtype == torch.bfloat16
            ours = (got.float() - want32).abs().max().item()
            assert ours <= 1.5 * theirs, (ours, theirs)
