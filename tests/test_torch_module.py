"""to_torch: op coverage, parameter names, dtype, weights in and out, dropout, training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.exporters import torch_functional as tf
from tfgraph.exporters.torch_module import TORCH_DTYPES, TORCH_OPS
from tfgraph.ir import Graph
from tfgraph.loader import load_spec
from tfgraph.ops import OPS
from tfgraph.spec import Spec
from tfgraph.weights import generate

from conftest import ROOT, small

SPECS = ROOT / "specs"


def make_ids(graph: Graph, batch: int, seq: int, tgt: int, seed: int = 0
             ) -> tuple[torch.Tensor, ...]:
    """Random int64 ids for the graph's inputs: (B, S) or (B, S), (B, T)."""
    gen = torch.Generator().manual_seed(seed)
    spec = graph.spec
    assert spec is not None
    src = torch.randint(0, spec.vocab_size("source"), (batch, seq), generator=gen)
    if len(graph.inputs) == 1:
        return (src,)
    return src, torch.randint(0, spec.vocab_size("target"), (batch, tgt), generator=gen)


def test_every_op_has_a_torch_lowering() -> None:
    assert set(TORCH_OPS) == set(OPS), (
        f"missing: {sorted(set(OPS) - set(TORCH_OPS))}, "
        f"unknown: {sorted(set(TORCH_OPS) - set(OPS))}")


def test_state_dict_is_the_graph_parameters(small_spec: Spec) -> None:
    graph = tfgraph.compile(small_spec)
    module = to_torch(graph)
    state = module.state_dict()
    assert list(state) == [p.name for p in graph.params()]  # each name once, tied table once
    for p in graph.params():
        assert tuple(state[p.name].shape) == p.attrs["shape"], p.name
        assert state[p.name].dtype == TORCH_DTYPES[small_spec.dtype], p.name
    # Tied heads read the token table itself, not a copy.
    assert ("head.weight" in state) == (not small_spec.embedding.tie_output)
    assert [n for n, _ in module.named_parameters()] == list(state)


def test_forward_shape_dtype_and_output(small_spec: Spec) -> None:
    graph = tfgraph.compile(small_spec)
    module = to_torch(graph, seed=1)
    ids = make_ids(graph, 3, 7, 5)
    with torch.no_grad():
        out = module(*ids)
    length = ids[-1].shape[1]
    assert out.shape == (3, length, small_spec.output_vocab)
    assert out.dtype == TORCH_DTYPES[small_spec.dtype]
    assert torch.isfinite(out).all()
    if small_spec.output == "probs":
        torch.testing.assert_close(out.float().sum(-1), torch.ones(3, length), atol=1e-2,
                                   rtol=0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_dtypes_compute_the_float32_function(dtype: str) -> None:
    """A 16-bit module runs at its dtype and agrees with float32 to 16-bit precision."""
    base = small(load_spec(SPECS / "tiny-llama.yaml"))
    half = base.model_copy(update={"dtype": dtype})
    g32, g16 = tfgraph.compile(base), tfgraph.compile(half)
    m32, m16 = to_torch(g32, seed=2), to_torch(g16, seed=2)
    assert {p.dtype for p in m16.parameters()} == {TORCH_DTYPES[dtype]}
    ids = make_ids(g32, 2, 9, 9)
    with torch.no_grad():
        ref, out = m32(*ids), m16(*ids)
    assert out.dtype == TORCH_DTYPES[dtype]
    err = (out.float() - ref).abs().max().item()
    assert err < 0.05 * ref.abs().max().item(), err


def test_seed_decides_the_weights() -> None:
    graph = tfgraph.compile(small(load_spec(SPECS / "tiny.yaml")))
    a, b, c = (to_torch(graph, seed=s).state_dict() for s in (7, 7, 8))
    shared = generate(graph, 7)
    for name in a:
        assert torch.equal(a[name], b[name]), name
        np.testing.assert_array_equal(a[name].numpy(), shared[name])
    matrices = [n for n in a if a[n].dim() == 2]
    assert all(not torch.equal(a[n], c[n]) for n in matrices)


def test_weights_from_a_state_dict_and_numpy() -> None:
    graph = tfgraph.compile(small(load_spec(SPECS / "tiny-seq2seq.yaml")))
    first = to_torch(graph, seed=3)
    again = to_torch(graph, weights=first.state_dict())
    from_numpy = to_torch(graph, weights={k: v.numpy() for k, v in first.state_dict().items()})
    ids = make_ids(graph, 2, 6, 4)
    with torch.no_grad():
        ref = first(*ids)
        assert torch.equal(again(*ids), ref)
        assert torch.equal(from_numpy(*ids), ref)
    # The module owns its copy: training it does not change the dict it came from.
    assert again.state_dict()["embed.source_tokens.weight"].data_ptr() != \
        first.state_dict()["embed.source_tokens.weight"].data_ptr()


def test_wrong_weights_are_listed() -> None:
    graph = tfgraph.compile(small(load_spec(SPECS / "tiny-llama.yaml")))
    weights = dict(to_torch(graph).state_dict())
    weights["decoder.layers.0.ffn.up.weightt"] = weights.pop("decoder.layers.0.ffn.up.weight")
    weights["head.weight"] = torch.zeros(3, 3)
    del weights["decoder.norm.weight"]
    with pytest.raises(TfgraphError) as err:
        to_torch(graph, weights=weights)
    message = str(err.value)
    assert "missing: decoder.layers.0.ffn.up.weight, decoder.norm.weight" in message
    assert "unexpected: decoder.layers.0.ffn.up.weightt" in message
    assert "mis-shaped: head.weight (3, 3) != (61, 32)" in message
    assert "\n" not in message


def test_dropout_only_in_training() -> None:
    spec = small(load_spec(SPECS / "tiny-decoder.yaml"))  # dropout 0.1
    graph = tfgraph.compile(spec)
    assert sum(n.op == "dropout" for n in graph.ops()) > 0
    module = to_torch(graph)
    ids = make_ids(graph, 2, 12, 12)
    with torch.no_grad():
        first, second = module(*ids), module(*ids)
        module.train()
        noisy_a, noisy_b = module(*ids), module(*ids)
        module.eval()
        back = module(*ids)
    assert torch.equal(first, second) and torch.equal(first, back)
    assert not torch.equal(noisy_a, first) and not torch.equal(noisy_a, noisy_b)
    # Without dropout nodes, train() changes nothing.
    quiet = tfgraph.compile(spec.model_copy(update={"dropout": 0.0}))
    assert not any(n.op == "dropout" for n in quiet.ops())
    module = to_torch(quiet).train()
    with torch.no_grad():
        assert torch.equal(module(*ids), module(*ids))


def _loss(module: torch.nn.Module, ids: tuple[torch.Tensor, ...], probs: bool) -> torch.Tensor:
    """Next-token cross-entropy on the (last) input sequence."""
    out = module(*ids)[:, :-1].float()
    targets = ids[-1][:, 1:].clamp(max=out.shape[-1] - 1)
    logp = out.clamp_min(1e-9).log() if probs else out.log_softmax(-1)
    return F.nll_loss(logp.flatten(0, 1), targets.flatten())


def test_one_optimizer_step_lowers_the_loss(small_spec: Spec) -> None:
    graph = tfgraph.compile(small_spec)
    module = to_torch(graph, seed=4)
    ids = make_ids(graph, 4, 10, 10, seed=5)
    with torch.no_grad():
        before = _loss(module, ids, small_spec.output == "probs").item()
    module.train()
    if small_spec.dtype == "float16":
        # Adam's second moments underflow in float16 (real fp16 training keeps fp32 master
        # weights and moments), so a plain gradient step here.
        opt: torch.optim.Optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    else:
        opt = torch.optim.Adam(module.parameters(), lr=1e-2)
    loss = _loss(module, ids, small_spec.output == "probs")
    loss.backward()
    grads = {n for n, p in module.named_parameters() if p.grad is not None}
    # Hard attention's arg-max has no gradient, so only then may q and k get none.
    expected = {n for n, _ in module.named_parameters()}
    if small_spec.attention.normalize == "hardmax":
        expected = {n for n in expected if not (".q." in n or ".k." in n)}
    assert expected <= grads, sorted(expected - grads)
    opt.step()
    module.eval()
    with torch.no_grad():
        after = _loss(module, ids, small_spec.output == "probs").item()
    assert after < before, (before, after)


def test_rms_norm_keeps_less_and_computes_the_same_gradients() -> None:
    """The CPU training path of rms_norm (and scale_norm) matches autograd through the plain
    formulas, in float64 (gradcheck) and float32."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    w = (1 + 0.1 * torch.randn(16, dtype=torch.float64, generator=gen)).requires_grad_()
    g = torch.tensor([1.3], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: tf.rms_norm(x, w, 1e-5), (x, w))
    assert torch.autograd.gradcheck(lambda x, g: tf.scale_norm(x, g, 1e-5), (x, g))
    x32, w32, g32 = (t.detach().float().requires_grad_() for t in (x, w, g))
    for ours, plain, params in (
        (lambda: tf.rms_norm(x32, w32, 1e-5),
         lambda: x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5) * w32, (x32, w32)),
        (lambda: tf.scale_norm(x32, g32, 1e-5),
         lambda: g32 * x32 / torch.sqrt(x32.pow(2).sum(-1, keepdim=True) + 1e-5), (x32, g32)),
    ):
        seed = torch.randn(3, 5, 16, generator=gen)
        got = torch.autograd.grad((ours() * seed).sum(), params)
        want = torch.autograd.grad((plain() * seed).sum(), params)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        with torch.no_grad():
            torch.testing.assert_close(ours(), plain(), atol=1e-6, rtol=1e-5)


def test_hardmax_is_the_one_hot_of_the_first_arg_max() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=gen)  # (B, h, Tq, hd)
    k = torch.randn(2, 2, 6, 8, generator=gen)  # (B, kv, Tk, hd): groups of 2 heads
    v = torch.randn(2, 2, 6, 8, generator=gen)
    y = tf.explicit_attention(q, k, v, causal=False, normalize="hardmax")
    kk = k.repeat_interleave(2, dim=1)
    vv = v.repeat_interleave(2, dim=1)
    pick = (q @ kk.transpose(-2, -1)).argmax(-1)  # (B, h, Tq)
    torch.testing.assert_close(y, torch.gather(vv, 2, pick[..., None].expand(-1, -1, -1, 8)))
    # Ties go to the first index: equal keys, so every score ties.
    same = torch.ones(1, 1, 4, 8)
    values = torch.arange(4.0).reshape(1, 1, 4, 1).expand(1, 1, 4, 8)
    tied = tf.explicit_attention(same, same, values, causal=True, normalize="hardmax")
    assert torch.equal(tied, torch.zeros(1, 1, 4, 8))


def test_inference_in_place_ops_give_the_autograd_values(small_spec: Spec) -> None:
    """Without autograd, dead operands are overwritten in place; values must not change."""
    graph = tfgraph.compile(small_spec)
    module = to_torch(graph, seed=6)
    ids = make_ids(graph, 2, 8, 5)
    with torch.no_grad():
        fast = module(*ids)
    assert torch.equal(fast, module(*ids).detach())


def test_in_place_ops_respect_aliases_of_eval_dropout() -> None:
    """An eval-mode dropout returns its input itself: an op reading the dropout's output must
    not overwrite it while the input is still read later (here by the residual add)."""
    g = Graph("alias")
    ids = g.input("input_ids", ("B", "S"))
    table = g.param("embed.tokens.weight", (11, 8), scope="embed", init="normal",
                    dtype="float32")
    x = g.add("embedding", [table, ids], name="x", scope="embed")
    d = g.add("dropout", [x], name="d", scope="embed", p=0.5)
    r = g.add("relu", [d], name="r", scope="embed")
    y = g.add("add", [r, x], name="y", scope="embed")
    g.set_output(y)
    g.lint()
    module = to_torch(g, seed=0)
    tokens = torch.arange(11).reshape(1, 11)
    emb = module.state_dict()["embed.tokens.weight"][tokens]
    with torch.no_grad():
        assert torch.equal(module(tokens), emb.relu() + emb)
