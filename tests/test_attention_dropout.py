"""attention.dropout: dropout on the attention weights, training only (opt-in, default 0).

Megatron-LM's GPT runs drop out the softmax probabilities (``--attention-dropout`` 0.1);
Korthikanti et al. 2022 §4.1 count its one-byte mask (as^2b) and its output (2as^2b) in the
5as/h term. Checked here at tiny sizes: the field's validation, the lowering (an attribute of
the attention ops only when > 0; in a KV-cache graph too, which masked training calls run, with
its ONNX model and costs unchanged), the torch module and model.py (active in train(), the
identity in eval(); masked calls drop out as unmasked ones do), the bytes the plan keeps (unfused: mask + dropped
weights; fused: nothing more) and the step time (one more memory-bound pass, unfused only).
tests/test_plan_megatron.py checks the 5as/h closed form at GPT-3 175B's sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch import functional as tf
from tfgraph.graph.ops import OPS
from tfgraph.parallel.gpus import gpu
from tfgraph.parallel.layout import Layout
from tfgraph.parallel.planner import plan, unit_numbers
from tfgraph.parallel.timing import unit_times
from tfgraph.spec.schema import Spec

from parity_support import saved_storages
from test_torch_module import make_ids
from test_torch_source import _check_against_to_torch

H, HEADS, SEQ = 32, 4, 16


def make(p: float, **over: Any) -> Spec:
    data: dict[str, Any] = {"name": "t", "arch": "decoder-only", "d_model": H, "layers": 2,
                            "vocab": 29, "attention": {"heads": HEADS, "dropout": p},
                            "dropout": 0.0, "max_len": 64, **over}
    return Spec.model_validate(data)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), float("inf"), True, "0.1"])
def test_field_refuses_bad_values(bad: Any) -> None:
    with pytest.raises(pydantic.ValidationError, match="attention.dropout"):
        make(bad)


def test_field_default_is_zero_and_dumps_round_trip() -> None:
    spec = Spec.model_validate({"name": "t", "arch": "decoder-only", "d_model": H,
                                "layers": 1, "vocab": 29, "attention": {"heads": HEADS}})
    assert spec.attention.dropout == 0.0
    assert "dropout" not in spec.model_dump()["attention"]  # specs without it dump as before
    with_it = make(0.25)
    assert with_it.attention.dropout == 0.25
    assert Spec.model_validate(with_it.model_dump()) == with_it
    assert make(0).attention.dropout == 0.0  # an int is a number


def _attention_attrs(graph: Any) -> list[dict[str, Any]]:
    return [n.attrs for n in graph.ops() if n.op.startswith("attention")]


def test_lowering_adds_dropout_only_when_positive() -> None:
    assert all("dropout" not in a for a in _attention_attrs(tfgraph.compile(make(0.0))))
    attrs = _attention_attrs(tfgraph.compile(make(0.2), loss=True))
    assert len(attrs) == 2 and all(a["dropout"] == 0.2 for a in attrs)
    # an encoder-decoder: self- and cross-attention alike
    seq2seq = tfgraph.compile(make(0.2, arch="encoder-decoder"))
    kinds = {(a["kind"], a["dropout"]) for a in _attention_attrs(seq2seq)}
    assert kinds == {("self", 0.2), ("cross", 0.2)}
    # the KV-cache graph carries it too: masked training calls run that graph
    cached = _attention_attrs(tfgraph.compile(make(0.2), cache=True))
    assert cached and all(a["dropout"] == 0.2 for a in cached)
    parts = [tfgraph.compile(make(0.2, arch="encoder-decoder"), cache=True, part=part)
             for part in ("encoder", "decoder")]
    cached = [a for part in parts for a in _attention_attrs(part)]
    assert len(cached) == 6 and all(a["dropout"] == 0.2 for a in cached)  # self, cross
    # nothing else changes: same ops, same FLOPs
    plain, dropped = tfgraph.compile(make(0.0)), tfgraph.compile(make(0.2))
    assert [n.name for n in plain.nodes()] == [n.name for n in dropped.nodes()]
    # dropout has no FLOPs in the count (as the spec's dropout); the report's training
    # memory assumes the fused kernel, which keeps no mask
    reports = [g.report(batch=2, seq=8) for g in (plain, dropped)]
    assert reports[0]["flops"] == reports[1]["flops"]
    assert reports[0]["memory"] == reports[1]["memory"]


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_torch_train_differs_and_eval_equals_the_model_without(impl: str) -> None:
    with_it = to_torch(tfgraph.compile(make(0.5)), seed=3)
    without = to_torch(tfgraph.compile(make(0.0)), seed=3)
    without.load_state_dict(with_it.state_dict())
    for net in (with_it, without):
        net.attention_impl = impl
    ids = torch.randint(0, 29, (2, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(with_it.eval()(ids), without.eval()(ids), rtol=0, atol=0)
        with_it.train()
        without.train()
        torch.manual_seed(1)
        trained = with_it(ids)
        torch.testing.assert_close(without(ids), without.eval()(ids), rtol=0, atol=0)
        assert not torch.allclose(trained, with_it.eval()(ids), atol=1e-3)


@pytest.mark.parametrize("arch", ["decoder-only", "encoder-decoder"])
def test_masked_training_calls_drop_out_as_unmasked_ones(arch: str) -> None:
    """A training call with an attention_mask (or position_ids) runs the KV-cache graph: in
    train() it drops the attention weights out exactly as the full-sequence graph does (the
    same draws from the same seed for a mask of ones), and not at all in eval()."""
    net = to_torch(tfgraph.compile(make(0.3, arch=arch, dropout=0.1)), seed=3).train()
    gen = torch.Generator().manual_seed(0)
    src, tgt = (torch.randint(0, 29, (2, n), generator=gen) for n in (SEQ, 7))
    ones = torch.ones_like(src)

    def call(seed: int = 5, **masked: Any) -> torch.Tensor:
        torch.manual_seed(seed)
        out: torch.Tensor = net(src, tgt, **masked) if arch == "encoder-decoder" \
            else net(src, **masked)
        return out

    unmasked = call()
    masks = [{"attention_mask": ones}] if arch == "encoder-decoder" else \
        [{"attention_mask": ones}, {"position_ids": torch.arange(SEQ).expand(2, SEQ)}]
    for masked in masks:
        torch.testing.assert_close(call(**masked), unmasked, rtol=0, atol=1e-6)
    with torch.no_grad():
        evaluated = net.eval()(src, tgt) if arch == "encoder-decoder" else net.eval()(src)
    assert not torch.allclose(unmasked, evaluated, atol=1e-3)
    net.train()  # another seed, other draws: the masked call does drop out
    assert not torch.allclose(call(attention_mask=ones), call(6, attention_mask=ones),
                              atol=1e-3)


def test_cache_graphs_onnx_and_costs_do_not_change_with_attention_dropout() -> None:
    """The KV-cache graph's dropout is the identity at inference: its ONNX graph is the one
    without it, node for node, and each op counts the same FLOPs and saved bytes."""
    pytest.importorskip("onnx")
    from tfgraph.exporters import to_onnx

    for arch, parts in (("decoder-only", (None,)), ("encoder-decoder", ("encoder", "decoder"))):
        for part in parts:
            kw: dict[str, Any] = {"cache": True} | ({"part": part} if part else {})
            plain, dropped = (tfgraph.compile(make(p, arch=arch), **kw) for p in (0.0, 0.2))
            onnx_graphs = [to_onnx(g, seed=1).graph for g in (plain, dropped)]
            assert onnx_graphs[0] == onnx_graphs[1]
            assert _costs(plain) == _costs(dropped)


def _costs(graph: Any) -> list[tuple[str, Any, Any]]:
    """(node, FLOPs, saved) of every op, symbolic in the graph's sizes."""
    out = []
    for n in graph.ops():
        ins, op = [graph.node(i).type for i in n.inputs], OPS[n.op]
        out.append((n.name, op.flops(ins, n.type, n.attrs), op.saved(ins, n.type, n.attrs)))
    return out


def test_generated_model_py_drops_out_like_to_torch(tmp_path: Path) -> None:
    """model.py runs the same kernels as to_torch bit for bit, in eval and in train() (the
    same attention dropout masks from the same seed), gradients included."""
    graph = tfgraph.compile(make(0.3))
    _check_against_to_torch(graph, tmp_path / "m")
    source = (tmp_path / "m" / "model.py").read_text()
    assert "ATTENTION_DROPOUT = 0.3" in source
    assert "dropout=ATTENTION_DROPOUT, training=self.training" in source


def test_cpu_keeps_what_unfused_attention_counts() -> None:
    """On CPU the torch module drops attention weights in the explicit form (CPU has no
    fused kernel with dropout): autograd keeps q, k, v, the softmax weights, a one-byte mask
    and the dropped-out weights, the unfused form's bytes, 4 + 1 + 4 bytes per float32 score
    beside q, k, v."""
    b, t, hd = 2, SEQ, H // HEADS
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, t, H, generator=gen, requires_grad=True) for _ in range(3))
    measured = {}
    for p in (0.0, 0.1):
        with saved_storages(torch.nn.Identity()) as seen:
            out = tf.attention(q, k, v, HEADS, HEADS, hd, True, "softmax", "math",  # kept:
                               dropout=p, training=True)  # its graph holds what it saved
        measured[p] = sum(seen.values())
    scores = b * HEADS * t * t
    assert measured[0.1] - measured[0.0] == scores * (1 + 4)  # mask + dropped-out weights
    # eval: no dropout, and SDPA's fused kernel at p > 0 too
    with saved_storages(torch.nn.Identity()) as seen:
        out = tf.attention(q, k, v, HEADS, HEADS, hd, True, "softmax", "sdpa", dropout=0.1,
                           training=False)
    assert sum(seen.values()) < measured[0.0]


def _layout(**over: Any) -> Layout:
    return Layout(micro_batch=2, global_batch=2, seq=SEQ, dtype="bfloat16", **over)


def test_plan_memory_unfused_keeps_mask_and_dropped_weights_fused_none() -> None:
    plain = tfgraph.compile(make(0.0, dtype="bfloat16"), loss=True)
    dropped = tfgraph.compile(make(0.1, dtype="bfloat16"), loss=True)
    b, scores = 2, 2 * HEADS * SEQ * SEQ
    for key in ("saved_none_split", "saved_none_whole", "saved_sel_split"):
        assert unit_numbers(plain, b, SEQ, "fused")[1][key] == \
            unit_numbers(dropped, b, SEQ, "fused")[1][key], key
    unfused = [unit_numbers(g, b, SEQ, "unfused")[1] for g in (plain, dropped)]
    # a one-byte mask and the dropped-out bf16 weights per score, split by heads
    assert unfused[1]["saved_none_split"] - unfused[0]["saved_none_split"] == scores * (1 + 2)
    # selective recompute rebuilds them with the softmax weights
    assert unfused[1]["saved_sel_split"] == unfused[0]["saved_sel_split"]
    gpu_ = gpu("a100-80gb")
    mem = [plan(g, _layout(), gpu_, attention="unfused")["per_rank"]["memory"]["activations"]
           for g in (plain, dropped)]
    assert mem[1] - mem[0] == 2 * scores * 3  # both layers, 1F1B holds the one micro-batch


def test_plan_time_grows_by_the_dropout_traffic_unfused_only() -> None:
    plain = tfgraph.compile(make(0.0, dtype="bfloat16"), loss=True)
    dropped = tfgraph.compile(make(0.1, dtype="bfloat16"), loss=True)
    a100 = gpu("a100-80gb")
    for tp in (1, 2):
        lay = _layout(tp=tp)
        fused = [unit_times(g, lay, a100, "fused") for g in (plain, dropped)]
        assert fused[0] == fused[1]
        unfused = [unit_times(g, lay, a100, "unfused") for g in (plain, dropped)]
        # per layer: read the bf16 weights, write the dropped-out ones and a one-byte mask,
        # forward; the same bytes backward; a rank's heads / tp of them
        scores = 2 * HEADS * SEQ * SEQ / tp
        extra = (2 * 2 * scores + scores) / a100.kernel_bandwidth
        for before, after in zip(*unfused):
            if after.attention_forward == 0:  # not a layer
                assert after == before
                continue
            assert after.forward - before.forward == pytest.approx(extra, rel=1e-9)
            assert after.backward - before.backward == pytest.approx(extra, rel=1e-9)
            # selective recompute reruns the attention core, dropout included
            assert after.attention_forward - before.attention_forward == \
                pytest.approx(extra, rel=1e-9)
    step = [plan(g, _layout(), a100, attention="unfused")["step"]["time_s"]
            for g in (plain, dropped)]
    assert step[1] > step[0]
