"""Lowering: every spec lowers and lints, node shapes evaluate as the spec says at two sizes,
parameter names and shapes are exactly README.md's ("Parameter names"), and every knob of the spec language changes the
graph as it should."""

from __future__ import annotations

import math
from typing import Any

import pydantic
import pytest

import tfgraph
from tfgraph.graph.ir import SYMBOLS, Graph
from tfgraph.spec.schema import Spec

from conftest import SPEC_FILES
from param_names import expected_params

SIZES = [{"B": 2, "S": 5, "T": 7}, {"B": 3, "S": 11, "T": 4}]


def make(**over: Any) -> Spec:
    """A tiny decoder-only spec with ``over`` merged in (nested dicts merge one level)."""
    data: dict[str, Any] = {"name": "t", "arch": "decoder-only", "d_model": 16, "layers": 2,
                            "vocab": 23, "attention": {"heads": 4}, "dropout": 0.0}
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return Spec.model_validate(data)


def names(g: Graph, op: str | None = None) -> list[str]:
    return [n.name for n in g.nodes() if op is None or n.op == op]


# ---- every spec: lint, shapes at two sizes, README names --------------------------------------


def expected_width(spec: Spec, name: str) -> int:
    """Last dimension of an op node's output, from the spec alone (by the node's role)."""
    att = spec.attention
    role = name.rsplit(".", 1)[-1]
    ffn = ".ffn." in name
    if name in ("logits", "probs", "head.uncapped"):
        return spec.output_vocab
    lat = att.latent
    if lat is not None and ".self_attn." in name:  # latent attention's own widths
        h, hd, rd, vd = att.heads, att.head_dim, lat.rope_dim, lat.v_head_dim
        widths = {"q_a": lat.q_rank, "q_a_norm": lat.q_rank, "q_b": h * hd, "q": h * hd,
                  "q_nope": h * (hd - rd), "q_rot": h * rd, "q_rope": h * rd,
                  "q_heads": h * hd, "kv_a": lat.kv_rank + rd, "latent": lat.kv_rank,
                  "kv_a_norm": lat.kv_rank, "k_rot": rd, "k_rope": rd,
                  "kv_b": h * (hd - rd + vd), "k_nope": h * (hd - rd), "v_heads": h * vd,
                  "k_heads": h * hd, "attention": h * vd}
        if role in widths:
            return widths[role]
    if role in ("q", "q_clip", "q_norm", "q_rope", "attention"):
        return att.heads * att.head_dim
    if role in ("k", "v", "k_clip", "v_clip", "k_norm", "k_rope"):
        return att.kv_heads * att.head_dim
    if ffn and role in ("router", "route"):  # mixture of experts: one logit per expert
        return spec.ffn.experts
    if ffn and role == "shared_gate":
        return 1
    if ".ffn.shared." in name and role in ("up", "gate", "act", "gated"):
        return spec.ffn.shared_hidden
    if ffn and role in ("up", "gate", "act", "gated"):
        return spec.ffn.hidden
    return spec.d_model


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_every_spec_lowers_lints_and_shapes_evaluate(path):
    spec = tfgraph.load_spec(path)
    g = tfgraph.compile(spec)  # lints
    g.lint()
    two_stacks = spec.arch == "encoder-decoder"
    for sizes in SIZES:
        values = {SYMBOLS[k]: v for k, v in sizes.items()}
        for node in g.nodes():
            shape = tuple(int(d.xreplace(values)) for d in node.type.shape)
            if node.op == "param":
                assert shape == node.attrs["shape"], node.name
                continue
            in_target = two_stacks and (node.scope.startswith("decoder") or node.scope == "head"
                                        or node.name == "tgt_ids")
            cross_kv = node.name.endswith((".cross_attn.k", ".cross_attn.v"))  # over the source
            length = sizes["T"] if in_target and not cross_kv else sizes["S"]
            if node.op == "input":
                assert shape == (sizes["B"], length) and node.type.dtype == "int64", node.name
                continue
            if node.op == "pad_position_ids":  # one position per input id
                assert shape == (sizes["B"], length), node.name
                continue
            if node.op in ("relative_bias", "alibi"):  # (heads, L, L), shared by the batch
                assert shape == (spec.attention.heads, length, length), node.name
                continue
            assert shape == (sizes["B"], length, expected_width(spec, node.name)), node.name
            assert node.type.dtype == spec.dtype, node.name
    one_stack = ["input_ids"] + (["token_type_ids"] if spec.embedding.token_types else [])
    assert g.inputs == (["src_ids", "tgt_ids"] if two_stacks else one_stack)
    assert g.outputs == [spec.output]


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_param_names_and_shapes_are_design_section_4(path):
    spec = tfgraph.load_spec(path)
    g = tfgraph.compile(spec)
    got = {p.name: p.attrs["shape"] for p in g.params()}
    assert got == expected_params(spec)
    assert len(got) == len(g.params())  # a tied table is one node


# ---- knobs ----------------------------------------------------------------------------------


def layer0(g: Graph, sub: str = "self_attn", stack: str = "decoder") -> list[str]:
    prefix = f"{stack}.layers.0.{sub}."
    return [n.name[len(prefix):] for n in g.ops() if n.name.startswith(prefix)]


def test_norm_positions_order_the_nodes():
    post = tfgraph.compile(make(norm={"position": "post"}))
    assert layer0(post) == ["q", "k", "v", "attention", "o", "residual", "norm"]
    assert post.node("decoder.layers.0.self_attn.norm").inputs[0] == \
        "decoder.layers.0.self_attn.residual"
    pre = tfgraph.compile(make(norm={"position": "pre"}))
    assert layer0(pre) == ["norm", "q", "k", "v", "attention", "o", "residual"]
    assert pre.node("decoder.layers.0.self_attn.q").inputs[0] == "decoder.layers.0.self_attn.norm"
    branch = tfgraph.compile(make(norm={"position": "branch"}))
    assert layer0(branch) == ["q", "k", "v", "attention", "o", "norm", "residual"]
    assert branch.node("decoder.layers.0.self_attn.residual").inputs[1] == \
        "decoder.layers.0.self_attn.norm"
    sandwich = tfgraph.compile(make(norm={"position": "sandwich"}))
    assert layer0(sandwich) == ["norm", "q", "k", "v", "attention", "o", "out_norm", "residual"]
    assert sandwich.node("decoder.layers.0.self_attn.out_norm").inputs[1] == \
        "decoder.layers.0.self_attn_out_norm.weight"
    # the residual always adds the sublayer input (the stream) and the branch
    for g in (post, pre, branch, sandwich):
        assert g.node("decoder.layers.1.self_attn.residual").inputs[0] == (
            "decoder.layers.0.ffn.norm" if g is post else "decoder.layers.0.ffn.residual")


def test_final_norm_default_follows_position():
    assert "decoder.norm" in names(tfgraph.compile(make(norm={"position": "pre"})))
    assert "decoder.norm" in names(tfgraph.compile(make(norm={"position": "sandwich"})))
    assert "decoder.norm" not in names(tfgraph.compile(make(norm={"position": "post"})))
    g = tfgraph.compile(make(norm={"position": "post", "final": True}))
    assert g.node("logits").inputs[0] == "decoder.norm"


def test_norm_kinds_and_their_parameters():
    rms = tfgraph.compile(make(norm={"kind": "rmsnorm", "eps": 1e-6}))
    node = rms.node("decoder.layers.0.ffn.norm")
    assert node.op == "rmsnorm" and node.attrs["eps"] == 1e-6
    assert node.inputs[1:] == ("decoder.layers.0.ffn_norm.weight",)
    scale = tfgraph.compile(make(norm={"kind": "scalenorm"}))
    assert scale.node("decoder.layers.0.ffn_norm.weight").attrs["shape"] == (1,)
    ln = tfgraph.compile(make())
    assert ln.node("decoder.layers.0.ffn.norm").inputs[1:] == (
        "decoder.layers.0.ffn_norm.weight", "decoder.layers.0.ffn_norm.bias")


def test_gqa_and_mqa_shapes():
    g = tfgraph.compile(make(d_model=32, attention={"heads": 8, "kv_heads": 2}))
    assert g.node("decoder.layers.0.self_attn.k.weight").attrs["shape"] == (8, 32)
    assert g.node("decoder.layers.0.self_attn.q.weight").attrs["shape"] == (32, 32)
    att = g.node("decoder.layers.0.self_attn.attention")
    assert (att.attrs["heads"], att.attrs["kv_heads"], att.attrs["head_dim"]) == (8, 2, 4)
    assert g.node("decoder.layers.0.self_attn.v").type.shape[-1] == 8
    mqa = tfgraph.compile(make(attention={"heads": 4, "kv_heads": 1}))
    assert mqa.node("decoder.layers.0.self_attn.k").type.shape[-1] == 4
    wide = tfgraph.compile(make(attention={"heads": 4, "head_dim": 6}))
    assert wide.node("decoder.layers.0.self_attn.o.weight").attrs["shape"] == (16, 24)


def test_tied_and_untied_heads():
    tied = tfgraph.compile(make())
    assert tied.node("logits").inputs == ("decoder.layers.1.ffn.norm", "embed.tokens.weight")
    assert "head.weight" not in tied
    untied = tfgraph.compile(make(embedding={"tie_output": False, "output_bias": True}))
    assert untied.node("logits").inputs[1:] == ("head.weight", "head.bias")
    assert untied.node("head.weight").attrs["shape"] == (23, 16)


def test_encoder_decoder_tables_shared_or_separate():
    shared = tfgraph.compile(make(arch="encoder-decoder"))
    assert shared.node("encoder.embed.tokens").inputs[0] == "embed.tokens.weight"
    assert shared.node("decoder.embed.tokens").inputs[0] == "embed.tokens.weight"
    assert shared.node("logits").inputs[1] == "embed.tokens.weight"
    two = tfgraph.compile(make(arch="encoder-decoder", vocab={"source": 30, "target": 19}))
    assert two.node("encoder.embed.tokens").inputs[0] == "embed.source_tokens.weight"
    assert two.node("logits").inputs[1] == "embed.target_tokens.weight"
    assert two.node("logits").type.shape[-1] == 19


def test_cross_attention_reads_the_encoder_output_and_masks():
    g = tfgraph.compile(make(arch="encoder-decoder", norm={"position": "pre"}))
    cross = g.node("decoder.layers.1.cross_attn.attention")
    assert cross.attrs["causal"] is False and cross.attrs["kind"] == "cross"
    assert g.node("decoder.layers.1.cross_attn.k").inputs[0] == "encoder.norm"
    assert g.node("decoder.layers.1.cross_attn.v").inputs[0] == "encoder.norm"
    assert g.node("decoder.layers.0.self_attn.attention").attrs["causal"] is True
    assert g.node("encoder.layers.0.self_attn.attention").attrs["causal"] is False
    # sublayer order in a decoder layer: self-attention, cross-attention, feed-forward
    order = [n.scope.split(".")[3] for n in g.ops() if n.scope.startswith("decoder.layers.0.")]
    assert list(dict.fromkeys(order)) == ["self_attn", "cross_attn", "ffn"]


def test_probs_output_and_hardmax():
    g = tfgraph.compile(make(output="probs", attention={"normalize": "hardmax"}))
    assert g.outputs == ["probs"]
    assert g.node("probs").op == "softmax" and g.node("probs").inputs == ("logits",)
    assert {n.attrs["normalize"] for n in g.ops() if n.op == "attention"} == {"hardmax"}
    assert tfgraph.compile(make()).outputs == ["logits"]


def test_rope_only_on_self_attention():
    g = tfgraph.compile(make(arch="encoder-decoder", embedding={"positions": "rope",
                                                                "rope_theta": 500000.0}))
    ropes = [n for n in g.ops() if n.op == "rope"]
    assert len(ropes) == 2 * (2 + 2)  # q and k of each self-attention, encoder and decoder
    assert all(".self_attn." in n.name for n in ropes)
    assert all(n.attrs["theta"] == 500000.0 for n in ropes)
    att = g.node("decoder.layers.0.self_attn.attention")
    assert att.inputs[:2] == ("decoder.layers.0.self_attn.q_rope",
                              "decoder.layers.0.self_attn.k_rope")
    assert g.node("decoder.layers.0.cross_attn.attention").inputs[0] == \
        "decoder.layers.0.cross_attn.q"
    assert not any(n.op.startswith("positions") for n in g.ops())


def test_position_kinds():
    learned = tfgraph.compile(make(max_len=40, embedding={"positions": "learned"}))
    pos = learned.node("decoder.embed.positions")
    assert pos.op == "positions_learned" and pos.inputs[1] == "decoder.positions.weight"
    assert learned.node("decoder.positions.weight").attrs["shape"] == (40, 16)
    sin = tfgraph.compile(make())
    assert sin.node("decoder.embed.positions").op == "positions_sinusoidal"
    assert not any("positions.weight" in p.name for p in sin.params())
    none = tfgraph.compile(make(embedding={"positions": "none", "scale": False}))
    assert names(none, "positions_sinusoidal") == [] and names(none, "scale") == []
    assert none.node("decoder.layers.0.self_attn.q").inputs[0] == "decoder.embed.tokens"


def test_embedding_scale_factor():
    g = tfgraph.compile(make(d_model=64))
    assert g.node("decoder.embed.scale").attrs["factor"] == pytest.approx(8.0)
    assert math.isclose(g.node("decoder.embed.scale").attrs["factor"], math.sqrt(64))


def test_dropout_where_the_paper_puts_it_and_absent_at_zero():
    assert names(tfgraph.compile(make(dropout=0.0)), "dropout") == []
    g = tfgraph.compile(make(arch="encoder-decoder", dropout=0.25))
    drops = names(g, "dropout")
    # after each embedding, and after each sublayer before its residual add
    assert len(drops) == 2 + 2 * 2 + 2 * 3
    assert "encoder.embed.dropout" in drops and "decoder.embed.dropout" in drops
    assert all(g.node(n).attrs["p"] == 0.25 for n in drops)
    assert g.node("decoder.layers.0.cross_attn.residual").inputs[1] == \
        "decoder.layers.0.cross_attn.dropout"


@pytest.mark.parametrize("act,inner", [("swiglu", "silu"), ("geglu", "gelu")])
def test_gated_feed_forward(act, inner):
    g = tfgraph.compile(make(ffn={"activation": act, "hidden": 24, "bias": False}))
    assert layer0(g, "ffn") == ["gate", "up", "act", "gated", "down", "residual", "norm"]
    assert g.node("decoder.layers.0.ffn.act").op == inner
    assert g.node("decoder.layers.0.ffn.act").inputs == ("decoder.layers.0.ffn.gate",)
    assert g.node("decoder.layers.0.ffn.gated").inputs == ("decoder.layers.0.ffn.act",
                                                           "decoder.layers.0.ffn.up")
    assert not any(p.name.endswith(".bias") and ".ffn." in p.name for p in g.params())


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
def test_plain_feed_forward(act):
    g = tfgraph.compile(make(ffn={"activation": act}))
    assert layer0(g, "ffn") == ["up", "act", "down", "residual", "norm"]
    assert g.node("decoder.layers.0.ffn.act").op == act
    assert g.node("decoder.layers.0.ffn.up.weight").attrs["shape"] == (64, 16)


def test_attention_bias_knob():
    g = tfgraph.compile(make(attention={"heads": 4, "bias": False}))
    assert not any(p.name.endswith(".bias") and "attn." in p.name for p in g.params())
    assert g.node("decoder.layers.0.self_attn.q").inputs[1:] == (
        "decoder.layers.0.self_attn.q.weight",)


def test_dtype_reaches_every_float_tensor():
    g = tfgraph.compile(make(dtype="bfloat16"))
    assert {n.type.dtype for n in g.nodes() if n.op != "input"} == {"bfloat16"}


def test_encoder_only_stack():
    g = tfgraph.compile(make(arch="encoder-only"))
    assert {n.scope.split(".")[0] for n in g.ops()} == {"encoder", "head"}
    assert not any(n.attrs.get("causal") for n in g.ops() if n.op == "attention")


@pytest.mark.parametrize("over, words", [
    ({"norm": {"position": "post"}}, "norm.position post"),
    ({"arch": "encoder-decoder", "norm": {"position": "pre"}}, "cross-attention"),
])
def test_parallel_residual_refuses_what_it_cannot_mean(over: dict[str, Any], words: str) -> None:
    """Catches a parallel layer silently lowered for a wiring it does not define."""
    with pytest.raises(pydantic.ValidationError) as err:
        make(block={"residual": "parallel"}, **over)
    assert words in str(err.value) and "block.residual" in str(err.value)


def test_parallel_residual_reads_the_layer_input_in_both_sublayers() -> None:
    """Catches the feed-forward reading the attention sum (the sequential wiring)."""
    g = tfgraph.compile(make(block={"residual": "parallel"}, norm={"position": "pre"}))
    for i in range(2):
        residual = g.by_meta()[("layer", "decoder", i, None, "residual")]
        layer_in, branches = residual.inputs
        for sub in ("self_attn", "ffn"):
            assert g.by_meta()[("layer", "decoder", i, sub, "norm")].inputs[0] == layer_in
        assert g.node(branches).meta.role == "branches"
    assert len([n for n in g.ops() if n.op == "add"]) == 2 * 2  # branches + residual per layer


@pytest.mark.parametrize("over", [{"block": {"shared_norm": True}},
                                  {"block": {"residual": "parallel", "shared_norm": True},
                                   "norm": {"position": "branch"}}])
def test_shared_norm_needs_a_parallel_pre_norm_layer(over: dict[str, Any]) -> None:
    """Catches a shared norm accepted where lowering would silently ignore it."""
    with pytest.raises(pydantic.ValidationError) as err:
        make(**over)
    assert "block.shared_norm" in str(err.value)


# ---- what lowering tells the back ends (graph.info, issue 23) ---------------------------------


@pytest.mark.parametrize("name,kwargs,kind,part", [
    ("tiny-decoder.yaml", {}, "full", None),
    ("tiny-decoder.yaml", {"loss": True}, "loss", None),
    ("tiny-decoder.yaml", {"cache": True}, "cached", None),
    ("tiny-bart.yaml", {"cache": True, "part": "encoder"}, "cached", "encoder"),
    ("tiny-bart.yaml", {"cache": True, "part": "decoder"}, "cached", "decoder"),
    ("tiny-encoder.yaml", {}, "full", None),
])
def test_graph_info_says_what_the_graph_is(name: str, kwargs: dict[str, Any], kind: str,
                                           part: str | None) -> None:
    """Every fact a back end needs of the spec is on the graph: its architecture and kind,
    its KV-cache graphs (and a builder for them), the cache layout, the lengths rule, the
    description and the spec as text (what spec.yaml and the ONNX metadata hold)."""
    spec = tfgraph.load_spec(SPEC_FILES[0].parent / name)
    graph = tfgraph.compile(spec, **kwargs)
    info = graph.info
    assert (info.arch, info.kind, info.part) == (spec.arch, kind, part)
    assert info.description == spec.description
    assert info.lengths is not None and info.lengths.max_len == spec.max_len
    assert info.output == spec.output and info.output_vocab == spec.output_vocab
    assert info.source is not None and tfgraph.parse_spec(info.source.yaml()) == spec
    if spec.arch == "encoder-only":  # its masked graph: a padding mask, no past
        assert info.cache_parts == (None,) and info.cache is None
        assert info.cache_graph is not None
        masked = info.cache_graph(None)
        assert (masked.info.kind, masked.info.part) == ("cached", None)
        assert masked.outputs == graph.outputs
        # tiny-encoder has no positions: no position_ids either
        assert [n for n in masked.inputs if n not in graph.inputs] == ["attention_mask"]
        with pytest.raises(tfgraph.errors.TfgraphError, match="no KV-cache graph"):
            info.cache_graph("encoder")
        return
    assert info.cache is not None and info.cache.layers == spec.layer_count("decoder")
    parts = (None,) if spec.arch == "decoder-only" else ("encoder", "decoder")
    assert info.cache_parts == parts and info.cache_graph is not None
    for which in parts:
        cached = info.cache_graph(which)
        assert (cached.info.kind, cached.info.part) == ("cached", which)
        assert cached.inputs == tfgraph.compile(spec, cache=True, part=which).inputs


def test_graph_info_of_a_graph_built_by_hand() -> None:
    """No spec, no facts: the defaults say so (no architecture, a full graph, no cache)."""
    info = Graph("hand").info
    assert (info.arch, info.kind, info.cache_parts, info.source) == ("", "full", None, None)


# ---- encoder features of RoBERTa and ModernBERT ---------------------------------------------


def test_positions_counted_over_non_padding_ids() -> None:
    """embedding.position_pad_id: the learned positions read ids computed from the input ids
    (RoBERTa); only for an encoder's learned positions with an offset for the pad row."""
    g = tfgraph.compile(make(arch="encoder-only", max_len=30, embedding={
        "positions": "learned", "position_offset": 2, "position_pad_id": 1}))
    pos = g.node("encoder.embed.positions")
    ids = g.node(pos.inputs[2])
    assert ids.op == "pad_position_ids" and ids.attrs["pad"] == 1
    assert ids.inputs == ("input_ids",) and ids.type.dtype == "int64"
    assert g.node("encoder.positions.weight").attrs["shape"] == (32, 16)
    for over, words in (({}, "encoder-only"), ({"arch": "encoder-only", "embedding": {
            "positions": "learned", "position_pad_id": 1}}, "position_offset >= 1"),
            ({"arch": "encoder-only", "embedding": {"positions": "learned",
                                                    "position_offset": 2,
                                                    "position_pad_id": 23}}, "vocabulary")):
        data = {"max_len": 30, "embedding": {"positions": "learned", "position_offset": 2,
                                             "position_pad_id": 1}} | over
        with pytest.raises(pydantic.ValidationError, match=words):
            make(**data)


def test_encoder_windows_are_bidirectional() -> None:
    g = tfgraph.compile(make(arch="encoder-only", layers=3, attention={
        "heads": 4, "window": 5, "window_pattern": ["global", "local"]}))
    att = [g.node(f"encoder.layers.{i}.self_attn.attention") for i in range(3)]
    assert [a.attrs["window"] for a in att] == [None, 5, None]
    assert not any(a.attrs["causal"] for a in att)
    with pytest.raises(pydantic.ValidationError, match="one-stack"):
        make(arch="encoder-decoder", attention={"heads": 4, "window": 5})


def test_first_attention_pre_norm_skipped_and_head_transform_without_bias() -> None:
    """norm.skip_first (ModernBERT's layer 0 attn_norm is an identity) and
    head.transform_bias false (its head.dense)."""
    g = tfgraph.compile(make(arch="encoder-only", norm={"position": "pre", "skip_first": True},
                             embedding={"norm": True}, head={"transform": True,
                                                             "transform_bias": False}))
    params = {p.name for p in g.params()}
    assert "encoder.layers.0.self_attn_norm.weight" not in params
    assert {"encoder.layers.1.self_attn_norm.weight", "encoder.layers.0.ffn_norm.weight",
            "head.transform.weight"} <= params and "head.transform.bias" not in params
    assert g.node("encoder.layers.0.self_attn.q").inputs[0] == "encoder.embed.norm"
    for over in ({"norm": {"position": "post", "skip_first": True}},
                 {"norm": {"position": "pre", "skip_first": True},
                  "block": {"residual": "parallel"}}):
        with pytest.raises(pydantic.ValidationError, match="norm.skip_first"):
            make(**over)
    with pytest.raises(pydantic.ValidationError, match="head.transform_bias"):
        make(head={"transform_bias": False})
