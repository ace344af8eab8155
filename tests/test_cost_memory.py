"""Memory figures against closed forms and hand counts: weights, KV cache, the Adam training
step, the inference activation peak (liveness) and bytes saved for backward."""

from __future__ import annotations

import pytest
import sympy

import tfgraph
from tfgraph.graph.ir import B, S, Graph
from tfgraph.passes.gradients import frozen_params
from tfgraph.passes.report import build_report
from tfgraph.spec.schema import Spec, StackLayers

from conftest import SPEC_FILES, small, tgt_for

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_weights_kv_cache_and_train_step_closed_forms(path):
    spec = tfgraph.load_spec(path)
    nbytes = BYTES[spec.dtype]
    att = spec.attention
    graph = tfgraph.compile(spec)
    rep = graph.report(batch=3, seq=20, tgt_seq=tgt_for(graph, 13))
    params, mem = rep["params"], rep["memory"]
    assert mem["weights"] == params * nbytes

    per_token = 2 * att.kv_heads * att.head_dim * nbytes  # K and V of one position, one layer
    if att.latent is not None:  # latent attention caches its latent and its rotary key
        per_token = (att.latent.kv_rank + att.latent.rope_dim) * nbytes
    if spec.arch == "decoder-only":  # a sliding-window layer keeps its last W positions
        kv = sum(3 * (min(20, att.window) if spec.layer_is_local(i) and att.window else 20)
                 * per_token for i in range(spec.layer_count("decoder")))
    elif spec.arch == "encoder-decoder":  # self-attention over T, cross-attention over S
        kv = spec.layer_count("decoder") * 3 * (13 + 20) * per_token
    else:
        kv = 0  # an encoder has nothing to cache between decoding steps
    assert mem["kv_cache"] == kv

    # a sigmoid router's correction bias (E per layer with experts) gets no gradient: no
    # gradient, moments or master copy are kept for it (OpDef.no_grad); nor for hard
    # attention's q and k linears
    frozen = 0
    if spec.ffn.experts and str(spec.ffn.router).startswith("sigmoid"):
        frozen = spec.ffn.experts * (spec.layer_count("decoder") - (spec.ffn.dense_layers or 0))
    if att.normalize == "hardmax":  # the arg-max passes no gradient to q and k, nor to the
        # q and k linears' weights and biases (tfgraph.passes.gradients)
        biased = att.bias if att.qkv_bias is None else att.qkv_bias
        width = (att.heads + att.kv_heads) * att.head_dim
        frozen += spec.layer_count("decoder") * (spec.d_model * width + (width if biased else 0))
    trained = params - frozen
    adam = 2 * trained * 4  # two fp32 moments
    master = 4 * trained if nbytes < 4 else 0  # fp32 master weights for 16-bit training
    # torch Adam's float32 step, one per parameter tensor it steps (the frozen ones: none;
    # measured in tests/test_model_states_grad.py)
    steps = 4 * (len(graph.params()) - len(frozen_params(graph)))
    assert mem["model_states"] == mem["weights"] + trained * nbytes + adam + master + steps
    # the activations of a step with its loss (tfgraph.passes.train_walk) hold at least every saved
    # tensor of the model and, at the loss's backward, the logits' gradient (B*L*V)
    assert mem["train_step"] == mem["model_states"] + mem["train_activations_peak"]
    length = 13 if spec.arch == "encoder-decoder" else 20
    logits_grad = 3 * length * spec.vocab_size("target") * nbytes
    assert mem["train_activations_peak"] >= mem["saved_for_backward"] + logits_grad


def hand_graph(hidden: int = 16) -> Graph:
    """ids -> embedding(V=10, d=4) -> up(hidden) -> relu -> down(4) -> tied head."""
    g = Graph("hand")
    ids = g.input("input_ids", (B, S))
    table = g.param("embed.tokens.weight", (10, 4), "embed", "normal", "float32")
    x = g.add("embedding", [table, ids], name="tok", scope="embed")
    w = g.param("ffn.up.weight", (hidden, 4), "ffn", "normal", "float32")
    h = g.add("linear", [x, w], name="up", scope="ffn")
    h = g.add("relu", [h], name="act", scope="ffn")
    w2 = g.param("ffn.down.weight", (4, hidden), "ffn", "normal", "float32")
    h = g.add("linear", [h, w2], name="down", scope="ffn")
    g.set_output(g.add("linear", [h, table], name="logits", scope="head"))
    g.lint()
    return g


def test_activation_peak_on_a_hand_computable_graph():
    # B=1, S=3, float32. Live while each op runs (its inputs and its output):
    #   tok:    ids 3*8=24  + tok 3*4*4=48             =  72
    #   up:     tok 48      + up 3*16*4=192            = 240
    #   act:    up 192      + act 192                  = 384  <- peak
    #   down:   act 192     + down 48                  = 240
    #   logits: down 48     + logits 3*10*4=120        = 168
    rep = build_report(hand_graph(), batch=1, seq=3)
    assert rep["memory"]["activations_peak"] == 384
    assert rep["activations_peak_at"] == "act"
    # with a narrow hidden layer the logits are the peak: down 48 + logits 120
    narrow = build_report(hand_graph(hidden=2), batch=1, seq=3)
    assert narrow["memory"]["activations_peak"] == 168
    assert narrow["activations_peak_at"] == "logits"


def test_saved_for_backward_counts_each_tensor_once():
    # embedding keeps ids (24), up keeps tok (48), relu keeps its output (192), down keeps its
    # input -- the same relu output, not counted again -- and the head keeps down (48).
    rep = build_report(hand_graph(), batch=1, seq=3)
    assert rep["memory"]["saved_for_backward"] == 24 + 48 + 192 + 48


def attention_graph(causal: bool) -> Graph:
    """x (B, S, 8) -> q, k, v (2 heads of 4) -> attention -> o: one score matrix of B*2*S*S."""
    g = Graph("att")
    ids = g.input("input_ids", (B, S))
    table = g.param("embed.tokens.weight", (5, 8), "embed", "normal", "float32")
    x = g.add("embedding", [table, ids], name="x", scope="embed")
    proj = {}
    for role in "qkv":
        w = g.param(f"attn.{role}.weight", (8, 8), "attn", "normal", "float32")
        proj[role] = g.add("linear", [x, w], name=role, scope="attn")
    a = g.add("attention", [proj["q"], proj["k"], proj["v"]], name="attention", scope="attn",
              heads=2, kv_heads=2, head_dim=4, causal=causal, normalize="softmax", kind="self")
    w = g.param("attn.o.weight", (8, 8), "attn", "normal", "float32")
    g.set_output(g.add("linear", [a, w], name="o", scope="attn"))
    g.lint()
    return g


def test_attention_scores_are_materialised_unless_fused():
    g = attention_graph(causal=True)
    s = 50
    act = s * 8 * 4  # one (1, S, 8) float32 activation
    scores = 2 * s * s * 4  # B * h * S * S float32
    unfused = build_report(g, batch=1, seq=s)
    # while attention runs: x is dead (q, k, v done), q, k, v, the output and the scores live
    assert unfused["activations_peak_at"] == "attention"
    assert unfused["memory"]["activations_peak"] == 4 * act + scores
    fused = build_report(g, batch=1, seq=s, fused_attention=True)
    assert fused["memory"]["activations_peak"] == 4 * act  # x + q + k + v while v is computed
    assert fused["memory"]["activations_peak"] < unfused["memory"]["activations_peak"]


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_fused_attention_never_raises_the_peak_and_lowers_it_at_long_sequences(path):
    spec = small(tfgraph.load_spec(path))
    g = tfgraph.compile(spec)
    seq = spec.max_len or 64
    unfused = g.report(batch=2, seq=seq)["memory"]["activations_peak"]
    fused = g.report(batch=2, seq=seq, fused_attention=True)["memory"]["activations_peak"]
    assert fused < unfused  # at these sizes the 4-head score matrix dominates


def test_dropout_is_free_at_inference_and_keeps_one_byte_masks_in_training():
    base = {"name": "t", "arch": "encoder-decoder", "d_model": 16, "layers": 2, "vocab": 23,
            "attention": {"heads": 4}}
    with_p = tfgraph.compile(Spec.model_validate({**base, "dropout": 0.1}))
    without = tfgraph.compile(Spec.model_validate({**base, "dropout": 0.0}))
    b, s, t = 2, 9, 5
    r1, r0 = (g.report(batch=b, seq=s, tgt_seq=t) for g in (with_p, without))
    assert r1["memory"]["activations_peak"] == r0["memory"]["activations_peak"]
    assert r1["flops"] == r0["flops"]
    # masks: after each embedding and each sublayer, one byte per element of (B, len, d)
    enc = (1 + 2 * 2) * b * s * 16  # embedding + 2 layers x (self_attn, ffn)
    dec = (1 + 2 * 3) * b * t * 16  # embedding + 2 layers x (self_attn, cross_attn, ffn)
    assert r1["memory"]["saved_for_backward"] - r0["memory"]["saved_for_backward"] == enc + dec


def test_sixteen_bit_dtypes_halve_weights_and_add_a_master_copy():
    data = tfgraph.load_spec(SPEC_FILES[0]).model_dump()
    rep = {}
    for dtype in ("float32", "bfloat16"):
        graph = tfgraph.compile(Spec.model_validate({**data, "dtype": dtype}))
        rep[dtype] = graph.report(batch=1, seq=16)
    p = rep["float32"]["params"]
    steps = 4 * len(graph.params())  # Adam's float32 step per tensor (nothing frozen here)
    assert rep["bfloat16"]["memory"]["weights"] * 2 == rep["float32"]["memory"]["weights"]
    assert rep["bfloat16"]["memory"]["kv_cache"] * 2 == rep["float32"]["memory"]["kv_cache"]
    half, full = rep["bfloat16"]["memory"], rep["float32"]["memory"]
    assert half["train_step"] - half["train_activations_peak"] == 2 * 2 * p + 8 * p + 4 * p \
        + steps
    assert full["train_step"] - full["train_activations_peak"] == 2 * 4 * p + 8 * p + steps
    assert half["model_states"] == 2 * 2 * p + 8 * p + 4 * p + steps


@pytest.mark.parametrize("dtype, extra", [("bfloat16", 2), ("float32", 0)])
def test_megatron_states_keep_fp32_gradients(dtype: str, extra: int):
    """states="megatron" (tfgraph report --states megatron, as tfgraph plan's): the gradients
    of a 16-bit spec in fp32, 2 more bytes per parameter (18 in all); float32 unchanged. The
    formulas (both forms) give the figures back, and the report names its convention."""
    data = tfgraph.load_spec(SPEC_FILES[0]).model_dump()
    graph = tfgraph.compile(Spec.model_validate({**data, "dtype": dtype}))
    mixed, megatron = (graph.report(batch=2, seq=16, states=s) for s in ("mixed", "megatron"))
    p = mixed["params"]
    assert mixed == graph.report(batch=2, seq=16)  # the default
    gained = megatron["memory"]["model_states"] - mixed["memory"]["model_states"]
    assert gained == extra * p
    assert megatron["memory"]["train_step"] - mixed["memory"]["train_step"] == extra * p
    if dtype == "bfloat16":  # + Adam's float32 step per tensor
        assert megatron["memory"]["model_states"] == 18 * p + 4 * len(graph.params())
    assert megatron["model_states"].startswith("--states megatron:")
    assert mixed["model_states"].startswith("--states mixed:")
    values = {sympy.Symbol(k): v for k, v in megatron["symbols"].items()}
    for key in ("memory.model_states", "memory.train_step"):
        named = sympy.sympify(megatron["formulas"][key], locals={k: sympy.Symbol(k) for k in
                                                                 megatron["symbols"]})
        assert named.xreplace(values) == megatron["memory"][key.split(".")[1]], key
    with pytest.raises(ValueError, match="states must be one of mixed, megatron"):
        graph.report(states="zero")


def test_stack_layer_counts_scale_the_kv_cache():
    spec = tfgraph.load_spec(SPEC_FILES[0]).model_dump()
    spec.update(arch="encoder-decoder", layers={"encoder": 1, "decoder": 3})
    s = Spec.model_validate(spec)
    assert isinstance(s.layers, StackLayers)
    att = s.attention
    mem = tfgraph.compile(s).report(batch=1, seq=10, tgt_seq=4)["memory"]
    assert mem["kv_cache"] == 3 * (10 + 4) * 2 * att.kv_heads * att.head_dim * BYTES[s.dtype]


@pytest.mark.parametrize("kwargs", [{"batch": 0}, {"batch": 1.5}, {"seq": -1}, {"seq": True},
                                    {"tgt_seq": 0}])
def test_report_refuses_sizes_that_are_not_positive_integers(kwargs):
    with pytest.raises(ValueError, match="must be a positive integer"):
        build_report(hand_graph(), **kwargs)


def test_train_step_exceeds_the_inference_peak_at_a_large_vocabulary():
    """Issue 13's case: batch 8, seq 2048, vocab 32000, fused attention. The inference peak is
    the logits (B*S*V*4 bytes, 1.95 GiB); the training step holds, at the loss's backward, the
    float32 log-probabilities, their gradient and the logits' gradient besides every saved
    tensor, so it now reads above it (it read 0.13 GiB, below, when it was model states plus
    saved tensors without a loss)."""
    data = tfgraph.load_spec(SPEC_FILES[0].parent / "tiny-decoder.yaml").model_dump()
    data["vocab"] = 32000
    data["max_len"] = 2048  # learned positions: the table must reach the length reported
    rep = tfgraph.compile(Spec.model_validate(data)).report(batch=8, seq=2048,
                                                            fused_attention=True)
    mem = rep["memory"]
    logits = 8 * 2048 * 32000 * 4
    assert mem["activations_peak"] >= logits
    assert mem["train_step"] > mem["activations_peak"]
    assert mem["train_activations_peak"] >= mem["saved_for_backward"] + 3 * logits
    assert rep["train_activations_peak_at"] == "loss (backward)"
    formula = sympy.sympify(rep["formulas_bst"]["memory.train_activations_peak"],
                            locals={"B": B, "S": S})
    assert formula.subs({B: 8, S: 2048}) == mem["train_activations_peak"]
