"""Mixture of experts (README, ``ffn.experts``): parity with transformers' Mixtral, Qwen2-MoE
and OLMoE through to_torch and ONNX, on inputs that send some token to every expert of every
MoE layer; matmul FLOPs against FlopCounterMode; total and active parameters; the spec rules;
the full-size specs against the reference models' parameter counts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import tfgraph
from tfgraph.spec.schema import Spec

from parity_support import check_against, llama_family_config, llama_family_weights, randomize, tiny

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parent.parent


def moe_layers(spec: Spec) -> list[int]:
    return list(range(spec.ffn.dense_layers or 0, spec.layers))


def expert_weights(spec: Spec, sd: dict[str, Tensor], shared: str | None = None
                   ) -> dict[str, Tensor]:
    """transformers' fused experts (``mlp.experts.gate_up_proj`` (E, 2H, d): gate rows, then up
    rows; ``mlp.experts.down_proj`` (E, d, H)) and router (``mlp.gate``) to tfgraph's names;
    ``shared``: the shared expert's module name (Qwen2-MoE ``shared_expert``)."""
    out: dict[str, Tensor] = {}
    for i in moe_layers(spec):
        src, dst = f"model.layers.{i}.mlp", f"decoder.layers.{i}.ffn"
        gate, up = sd[f"{src}.experts.gate_up_proj"].chunk(2, dim=1)
        out.update({f"{dst}.router.weight": sd[f"{src}.gate.weight"],
                    f"{dst}.experts.gate.weight": gate, f"{dst}.experts.up.weight": up,
                    f"{dst}.experts.down.weight": sd[f"{src}.experts.down_proj"]})
        if shared is not None:
            for role in ("gate", "up", "down"):
                out[f"{dst}.shared.{role}.weight"] = sd[f"{src}.{shared}.{role}_proj.weight"]
            if f"{src}.{shared}_gate.weight" in sd:
                out[f"{dst}.shared_gate.weight"] = sd[f"{src}.{shared}_gate.weight"]
    return out


def assert_every_expert_chosen(spec: Spec, ref: nn.Module, ids: Tensor) -> None:
    """The inputs route some token to each expert of each MoE layer (so every expert's
    weights reach the logits that parity compares)."""
    chosen: dict[int, set[int]] = {}

    def hook(i: int) -> Any:
        def record(module: nn.Module, args: Any, out: Any) -> None:
            chosen[i] = set(out[2].flatten().tolist())  # (logits, weights, indices)
        return record

    handles = [ref.model.layers[i].mlp.gate.register_forward_hook(hook(i))
               for i in moe_layers(spec)]
    with torch.no_grad():
        ref(ids)
    for h in handles:
        h.remove()
    assert chosen and all(chosen[i] == set(range(spec.ffn.experts)) for i in moe_layers(spec)), \
        chosen


def check_flops(spec: Spec, ref: nn.Module, ids: Tensor) -> None:
    """transformers' MoE FlopCounterMode count misses the routed experts' products: add
    layers · 2 · tokens · k · 3 · d · expert_hidden and compare with the report's matmul."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        ref(ids)
    tokens = ids.numel()
    routed = len(moe_layers(spec)) * 2 * tokens * spec.ffn.top_k * 3 * spec.d_model \
        * spec.ffn.expert_hidden
    report = tfgraph.compile(spec).report(batch=ids.shape[0], seq=ids.shape[1])
    assert counter.get_total_flops() + routed == report["flops"]["matmul"]


def run_parity(spec: Spec, ref: nn.Module, weights: dict[str, Tensor]) -> None:
    ids, _ = check_against(spec, ref, weights)
    assert_every_expert_chosen(spec, ref, ids)
    check_flops(spec, ref, ids)


def test_mixtral_parity() -> None:
    spec = tiny("tiny-moe.yaml")
    cfg = transformers.MixtralConfig(
        **{**llama_family_config(spec), "intermediate_size": spec.ffn.expert_hidden},
        num_local_experts=spec.ffn.experts, num_experts_per_tok=spec.ffn.top_k,
        sliding_window=None, tie_word_embeddings=False)
    ref = transformers.MixtralForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    randomize(ref, seed=2)  # a seed whose router sends check_against's ids to every expert
    sd = ref.state_dict()
    norms = {"self_attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    run_parity(spec, ref, {**llama_family_weights(spec, sd, norms), **expert_weights(spec, sd)})


def test_qwen2_moe_parity() -> None:
    """Qwen2-MoE: softmax over all experts without renormalising (norm_topk_prob false), a
    shared expert scaled by sigmoid(shared_expert_gate x), a dense first layer
    (mlp_only_layers), q/k/v biases."""
    spec = tiny("tiny-qwen2-moe.yaml")
    cfg = transformers.Qwen2MoeConfig(
        **llama_family_config(spec), moe_intermediate_size=spec.ffn.expert_hidden,
        shared_expert_intermediate_size=spec.ffn.shared_hidden, num_experts=spec.ffn.experts,
        num_experts_per_tok=spec.ffn.top_k, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=list(range(spec.ffn.dense_layers)), tie_word_embeddings=False,
        use_sliding_window=False)
    ref = transformers.Qwen2MoeForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    randomize(ref, seed=1)  # a seed whose router sends check_against's ids to every expert
    sd = ref.state_dict()
    norms = {"self_attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    weights = {**llama_family_weights(spec, sd, norms),
               **expert_weights(spec, sd, shared="shared_expert")}
    run_parity(spec, ref, weights)


def test_olmoe_parity() -> None:
    """OLMoE: qk-norm over the whole q and k projections, softmax_topk routing."""
    spec = tiny("tiny-olmoe.yaml")
    cfg = transformers.OlmoeConfig(
        **{**llama_family_config(spec), "intermediate_size": spec.ffn.expert_hidden},
        num_experts=spec.ffn.experts, num_experts_per_tok=spec.ffn.top_k, norm_topk_prob=False,
        tie_word_embeddings=False)
    ref = transformers.OlmoeForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    randomize(ref, seed=3)
    sd = ref.state_dict()
    norms = {"self_attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm"}
    run_parity(spec, ref, {**llama_family_weights(spec, sd, norms), **expert_weights(spec, sd)})


@pytest.mark.parametrize("router", ["softmax_topk_renorm", "topk_softmax"])
def test_renormalised_and_topk_softmax_routers_agree(router: str) -> None:
    """softmax over the top-k logits equals the renormalised top-k of the softmax: the tiny
    Mixtral spec gives the same logits with either router (and Mixtral's with both)."""
    data = tiny("tiny-moe.yaml").model_dump()
    data["ffn"]["router"] = router
    graph = tfgraph.compile(Spec.model_validate(data))
    ids = torch.randint(0, 128, (2, 11), generator=torch.Generator().manual_seed(5))
    from tfgraph.exporters import to_torch

    with torch.no_grad():
        out = to_torch(graph, seed=3)(ids)
        base = to_torch(tfgraph.compile(tiny("tiny-moe.yaml")), seed=3)(ids)
    torch.testing.assert_close(out, base, atol=1e-5, rtol=0)


# ---- accounting --------------------------------------------------------------------------------


def test_active_parameters_and_all_expert_flops() -> None:
    """params counts every expert; params_active k of E (plus shared experts and the rest);
    the all-experts FLOPs differ from the top-k ones by (E - k) experts per token."""
    spec = tiny("tiny-qwen2-moe.yaml")
    rep = tfgraph.compile(spec).report(batch=2, seq=10)
    ffn, d = spec.ffn, spec.d_model
    per_expert = 3 * d * ffn.expert_hidden
    layers = len(moe_layers(spec))
    assert rep["params"] - rep["params_active"] == layers * (ffn.experts - ffn.top_k) * per_expert
    assert rep["memory"]["weights"] == 4 * rep["params"]  # every expert is stored
    tokens = 2 * 10
    assert rep["flops"]["matmul_all_experts"] - rep["flops"]["matmul"] == \
        layers * 2 * tokens * (ffn.experts - ffn.top_k) * per_expert
    router_matmul = layers * 2 * tokens * d * ffn.experts
    softmax_topk = layers * tokens * ffn.experts * (5 + 1)  # softmax and top-k per logit
    assert rep["flops"]["router"] == router_matmul + softmax_topk
    assert "params_active" in rep["formulas"] and "E" in rep["formulas"]["params_active"]


def test_dense_specs_have_no_expert_figures() -> None:
    rep = tfgraph.compile(tiny("tiny-llama.yaml")).report()
    assert "params_active" not in rep and "router" not in rep["flops"]


@pytest.mark.parametrize("over, message", [
    ({"top_k": 2}, "ffn.top_k: only for a mixture of experts"),
    ({"experts": 4}, "ffn.top_k: required"),
    ({"experts": 4, "top_k": 5}, "ffn.top_k: 5 is more than the 4 experts"),
    ({"experts": 4, "top_k": 2, "bias": True}, "ffn.bias: routed experts have no biases"),
    ({"experts": 4, "top_k": 2, "shared_gate": True}, "ffn.shared_gate: there are no shared"),
    ({"experts": 4, "top_k": 2, "dense_layers": 2}, "ffn.dense_layers: 2 leaves no layer"),
])
def test_spec_rules(over: dict[str, Any], message: str) -> None:
    data = {"name": "m", "arch": "decoder-only", "d_model": 32, "layers": 2, "vocab": 50,
            "attention": {"heads": 4}, "ffn": {"bias": False, **over}}
    with pytest.raises(ValueError, match=message):
        Spec.model_validate(data)


def test_shared_hidden_defaults_to_shared_experts_times_expert_hidden() -> None:
    s = tiny("tiny-deepseek-moe.yaml")
    assert s.ffn.shared_hidden == s.ffn.shared_experts * s.ffn.expert_hidden
    assert s.ffn.shared_gate is False and s.ffn.router == "softmax_topk_renorm"


# ---- full-size specs -------------------------------------------------------------------------


def _meta_count(model_cls: Any, config: Any) -> int:
    with torch.device("meta"):  # shapes only: no memory, no weights
        return sum(p.numel() for p in model_cls(config).parameters())


def test_mixtral_and_mistral_match_the_reference_parameter_counts() -> None:
    common = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                  tie_word_embeddings=False)
    mixtral = _meta_count(transformers.MixtralForCausalLM, transformers.MixtralConfig(
        **common, num_local_experts=8, num_experts_per_tok=2))
    mistral = _meta_count(transformers.MistralForCausalLM, transformers.MistralConfig(**common))
    for name, count in (("mixtral-8x7b", mixtral), ("mistral-7b", mistral)):
        rep = tfgraph.compile(ROOT / "specs" / f"{name}.yaml").report()
        assert rep["params"] == count
        assert f"{count:,}" in (ROOT / "specs" / f"{name}.yaml").read_text()
    rep = tfgraph.compile(ROOT / "specs" / "mixtral-8x7b.yaml").report()
    assert f"{rep['params_active']:,}" in (ROOT / "specs" / "mixtral-8x7b.yaml").read_text()


# deepseek-ai/DeepSeek-V3's config.json, the fields DeepseekV3Config reads (its
# quantization_config, fp8 weight blocks, is left out: transformers dequantises them).
DEEPSEEK_V3 = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4,
    routed_scaling_factor=2.5, first_k_dense_replace=3, norm_topk_prob=True,
    max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
    bos_token_id=0, eos_token_id=1, hidden_act="silu", attention_bias=False,
    rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    rope_theta=10000, torch_dtype="bfloat16")


def test_deepseek_v3_spec_is_the_hugging_face_model_on_meta() -> None:
    """specs/deepseek-v3.yaml: transformers' DeepseekV3ForCausalLM built on the meta device
    from DeepSeek-V3's config has its parameters, plus the 58 x 256 e_score_correction_bias
    values it keeps as buffers (tensors of the checkpoint, tfgraph parameters); importing the
    same config gives the same spec; the counts written in the file are the report's."""
    import json

    from tfgraph.hf import spec_from_config

    config = transformers.DeepseekV3Config(**DEEPSEEK_V3)
    with torch.device("meta"):
        model = transformers.DeepseekV3ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for n, b in model.named_buffers()
                  if n.endswith("e_score_correction_bias"))
    assert buffers == 58 * 256
    path = ROOT / "specs" / "deepseek-v3.yaml"
    spec = tfgraph.load_spec(path)
    rep = tfgraph.compile(spec).report()
    assert rep["params"] == params + buffers
    imported = spec_from_config(json.loads(config.to_json_string()), name="deepseek-v3")
    same = {"description": ""}
    assert imported.model_copy(update=same) == spec.model_copy(update=same)
    text = path.read_text()
    for count in (rep["params"], params, rep["params_active"]):
        assert f"{count:,}" in text
    assert 670e9 < rep["params"] < 672e9 and 37e9 < rep["params_active"] < 38e9


def test_deepseek_v3_kv_cache_is_its_latent_and_rotary_key() -> None:
    """MLA's cache: kv_lora_rank + qk_rope_head_dim values per token and layer (512 + 64),
    not 2 * heads * head_dim (transformers' DeepseekV3Attention caches the same two)."""
    rep = tfgraph.compile(ROOT / "specs" / "deepseek-v3.yaml").report(batch=1, seq=4096)
    assert rep["memory"]["kv_cache"] == 61 * 4096 * (512 + 64) * 2  # bfloat16


def test_compare_shows_total_and_active_side_by_side() -> None:
    from tfgraph.passes.compare import compare, table_rows

    graphs = [tfgraph.compile(ROOT / "specs" / f"{n}.yaml") for n in ("mixtral-8x7b",
                                                                       "mistral-7b")]
    data = compare(graphs, seqs=(128,))
    mixtral, mistral = data["variants"]
    assert mixtral["params_active"] < mixtral["params"] and \
        mistral["params_active"] == mistral["params"]
    per = mixtral["at"][0]["per_token"]
    assert per["all_experts"] > per["active"] * 3  # 8 experts instead of 2 in the FFN
    assert mistral["at"][0]["per_token"]["all_experts"] == mistral["at"][0]["per_token"]["active"]
    titles = [title for _, title, _ in table_rows(data)]
    assert {"params active (per token)", "FLOPs/token active",
            "FLOPs/token all experts"} <= set(titles)


def test_routed_experts_take_an_empty_sequence() -> None:
    """No tokens: no expert runs, the output is empty (as a dense feed-forward's is)."""
    import torch

    from tfgraph.exporters import to_torch

    spec = tfgraph.load_spec(ROOT / "specs" / "tiny-moe.yaml")
    model = to_torch(tfgraph.compile(spec), seed=0)
    out = model(torch.zeros(2, 0, dtype=torch.long))
    assert out.shape == (2, 0, spec.vocab_size("source"))


def test_an_unrouted_expert_that_overflows_leaves_the_onnx_logits_finite() -> None:
    """The ONNX dense form runs every expert on every token: an expert no token is routed to,
    whose output overflows to inf, must not make 0 x inf = NaN of every logit. Router rows
    1 and 3 are minus rows 0 and 2 (so 2 of those 4 logits are positive for every token) and
    the others 0, so expert 7 (logit 0) is never in the top 2; its weights are scaled by
    1e30. The PyTorch back end never runs it; onnxruntime gives the same finite logits."""
    ort = pytest.importorskip("onnxruntime")
    from tfgraph.exporters import to_torch
    from tfgraph.exporters.onnx.model import to_onnx

    graph = tfgraph.compile(tiny("tiny-moe.yaml"))
    weights = to_torch(graph, seed=0).state_dict()
    for name, w in weights.items():
        if name.endswith("ffn.router.weight"):
            w[1], w[3], w[4:] = -w[0], -w[2], 0.0
        elif ".ffn.experts." in name:
            w[7] *= 1e30
    ours = to_torch(graph, weights=weights).eval()
    ids = torch.randint(0, 128, (2, 19), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ours(ids)
    assert expected.isfinite().all()
    session = ort.InferenceSession(to_onnx(graph, weights=weights).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"input_ids": ids.numpy()})[0])
    assert got.isfinite().all()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_the_plan_holds_one_moe_layers_expert_gradients_as_pieces() -> None:
    """The experts' backward holds each expert's weight gradients until it stacks them
    (torch_functional.experts unbinds each stack once): one layer's local expert weights in
    16-bit, split by expert parallelism, in the plan's ``temporary``."""
    from tfgraph.parallel.gpus import gpu
    from tfgraph.parallel.layout import Layout
    from tfgraph.parallel.planner import plan

    spec = tfgraph.load_spec(ROOT / "specs" / "tiny-moe.yaml").model_copy(
        update={"dtype": "bfloat16"})
    graph = tfgraph.compile(spec, loss=True)
    node = next(n for n in graph.nodes() if n.op == "experts")
    stacked = sum(math.prod(graph.node(i).attrs["shape"]) for i in node.inputs[2:])
    temporary = {ep: plan(graph, Layout(dp=2, ep=ep, micro_batch=1, global_batch=2, seq=16),
                          gpu("h100"))["per_rank"]["memory"]["temporary"] for ep in (1, 2)}
    assert temporary[1] - temporary[2] == stacked * 2 // 2  # bf16; half the experts at ep 2
