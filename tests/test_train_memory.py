"""The training step's activation memory (tfgraph.passes.train_walk) against one real step of the
torch module on CPU.

Measured, per spec (dense pre-norm with dropout, post-norm encoder-decoder with dropout,
GQA + rope + SwiGLU, mixture of experts, T5's encoder-decoder with a position bias, bf16):
- saved bytes: every tensor ``saved_tensors_hooks`` sees in the training forward and the
  loss (each storage once, parameters excluded) equals the graph's saved bytes exactly, once
  the terms the op table leaves out are added (stated in ``uncounted``);
- the backward-start live set: those plus the logits' gradient, within 5% (exact with those
  terms);
- the live peak: a dispatch mode that tracks every storage the step creates (alive until its
  last reference dies; parameters and their gradients left out) peaks within 5% of
  ``train_peak``. Attention runs as SDPA (``attention_impl`` "sdpa"), the fused kernel the
  accounting assumes (``fused_attention=True``).
- mixture of experts at inference: the same mode over a no-grad forward peaks inside the
  routed experts' call at exactly report's ``activations_peak`` (its ``temp``) under a
  balanced routing; latent attention's (its values narrower than its keys) inside the
  attention call, with the fused kernel's zero-padded v and padded output.
"""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import sympy
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch import functional as torch_functional
from tfgraph.exporters.torch.functional import cross_entropy
from tfgraph.graph.ir import B, S
from tfgraph.spec.loader import load_spec
from tfgraph.passes import cost
from tfgraph.passes.report import sizes_for
from tfgraph.graph.tensor import DTYPE_BYTES
from tfgraph.graph.ops import STATS_BYTES
from tfgraph.exporters.torch.ops import rope_table_attrs
from tfgraph.passes.train_walk import saved_by_layer, train_peak

from conftest import ROOT, small
from parity_support import saved_storages
from test_torch_module import make_ids

# sliding windows: Mistral (every layer, SDPA with a float mask), Gemma 2 (soft-capped explicit
# matmuls, a boolean mask per layer), Cohere2 (local/global), ModernBERT (a bidirectional window)
WINDOWED = ["tiny-mistral.yaml", "tiny-gemma2.yaml", "tiny-cohere2.yaml", "tiny-modernbert.yaml"]
SPECS = ["tiny-decoder.yaml", "tiny-marian.yaml", "tiny-llama.yaml", "tiny-moe.yaml",
         "tiny-deepseek-v3.yaml", "tiny-deepseek-moe.yaml",
         "tiny-t5.yaml", "tiny-bf16.yaml", "tiny-mpt.yaml", "tiny-olmo.yaml", "tiny-phimoe.yaml", "tiny-bloom.yaml",
         "tiny-falcon-rw.yaml", "tiny-roberta.yaml", "tiny-olmoe.yaml", "tiny-mla.yaml",
         *WINDOWED]
SHAPES = [(2, 12, 10), (4, 32, 24)]  # (batch, seq, tgt_seq)


def _spec(name: str) -> Any:
    return small(load_spec(ROOT / "specs" / name))


def _labels(graph: tfgraph.CompiledGraph, batch: int, seq: int, tgt: int) -> torch.Tensor:
    length = tgt if "tgt_ids" in graph.inputs else seq
    vocab = int(graph.node("logits").type.shape[-1])
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(5))


def uncounted(spec: Any, batch: int, seq: int, tgt: int) -> int:
    """Bytes torch saves that the op table does not count, term by term (negative: fewer):
    - rotary positions: the cos and sin tables, one (L, rotary dims) pair in the module's
      dtype per distinct table (sequence axis, width, base: ModernBERT's local and global
      bases make two) shared by every layer (ops.py, rope: "not counted");
    - a unit-offset norm (Gemma): the (1 + w) gain it computes from its parameter and
      multiplies by, d elements of the parameter's dtype per norm;
    - on the CPU a 16-bit LayerNorm keeps its per-row mean and rstd in its own dtype, not in
      float32 as the CUDA kernel (and the op table) does.
    The masks attention reads (a sliding window's float mask under SDPA, a boolean causal or
    window mask where attention runs as explicit matmuls: soft-capping, T5's bias, ALiBi) are
    counted (ops.attention_read_mask)."""
    graph = tfgraph.compile(spec)
    sizes = sizes_for(graph, batch, seq, tgt)
    extra = rope_tables(spec, batch, seq, tgt)
    for node in graph.nodes():
        if node.op == "rmsnorm" and node.attrs.get("unit_offset"):
            extra += int(graph.node(node.inputs[1]).type.nbytes)
        elif node.op == "layernorm" and DTYPE_BYTES[node.type.dtype] < STATS_BYTES:
            rows = int((node.type.numel / node.type.shape[-1]).xreplace(sizes))
            extra -= 2 * rows * (STATS_BYTES - DTYPE_BYTES[node.type.dtype])
    return extra


def rope_tables(spec: Any, batch: int, seq: int, tgt: int) -> int:
    """Bytes of the rotary cos and sin tables the module builds once per forward and every
    layer reads: one (L, rotary dims) pair in the module's dtype per distinct table (sequence
    axis, width, base), which the op table does not count (ops.py, rope)."""
    graph = tfgraph.compile(spec)
    sizes = sizes_for(graph, batch, seq, tgt)
    extra = 0
    tables: set[tuple[Any, ...]] = set()
    for node in graph.nodes():
        if node.op == "rope":
            length = int(graph.node(node.inputs[0]).type.shape[1].xreplace(sizes))
            table = rope_table_attrs(node.attrs)
            key = (length, *sorted((k, repr(v)) for k, v in table.items()))
            if key not in tables:
                tables.add(key)
                extra += 2 * length * table["dim"] * DTYPE_BYTES[spec.dtype]
    return extra


def measured_saved(spec: Any, batch: int, seq: int, tgt: int) -> tuple[int, int]:
    """(saved bytes, logits' gradient bytes) of one training step of the ordinary module
    with the loss graph's cross-entropy on its logits."""
    plain = tfgraph.compile(spec)
    model = to_torch(plain, seed=0).train()  # dropout on: its masks are saved
    ids = make_ids(plain, batch, seq, tgt)
    labels = _labels(plain, batch, seq, tgt)
    with saved_storages(model) as seen:
        logits = model(*ids)
        loss = cross_entropy(logits, labels)
    logits.retain_grad()
    loss.backward()
    assert logits.grad is not None
    return sum(seen.values()), logits.grad.nbytes


class LiveStorages(TorchDispatchMode):
    """The bytes of every storage an op creates while the mode is on, counted until the
    storage dies, and their largest sum (``peak``, read after the step). Parameters' storages
    and the parameters' final gradients (known by identity once the step is done: a per-expert
    gradient piece may share a parameter's shape) are left out."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.live: dict[int, tuple[int, int]] = {}  # storage pointer: (serial, bytes)
        self.events: list[tuple[int, int]] = []  # (serial, +bytes made / -bytes freed)

    def _gone(self, key: int, serial: int) -> None:
        entry = self.live.get(key)
        if entry is not None and entry[0] == serial:
            del self.live[key]
            self.events.append((serial, -entry[1]))

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.live or key in self.params:
            return
        serial = len(self.events)
        self.live[key] = (serial, storage.nbytes())
        self.events.append((serial, storage.nbytes()))
        weakref.finalize(storage, self._gone, key, serial)

    @property
    def peak(self) -> int:
        grads = {p.grad.untyped_storage().data_ptr() for p in self.model.parameters()
                 if p.grad is not None}
        kept = {serial for key, (serial, _) in self.live.items() if key in grads}
        now = peak = 0
        for serial, delta in self.events:
            if serial not in kept:
                now += delta
                peak = max(peak, now)
        return peak

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("batch,seq,tgt", SHAPES)
def test_saved_and_backward_start_match_a_measured_step(name: str, batch: int, seq: int,
                                                        tgt: int) -> None:
    spec = _spec(name)
    graph = tfgraph.compile(spec, loss=True)
    peak = train_peak(graph, sizes_for(graph, batch, seq, tgt), fused_attention=True)
    saved, logits_grad = measured_saved(spec, batch, seq, tgt)
    assert saved == peak.saved + uncounted(spec, batch, seq, tgt)
    assert peak.backward_start - peak.saved == logits_grad  # B*L*V at the logits' dtype
    measured_start = saved + logits_grad
    assert abs(measured_start - peak.backward_start) <= 0.05 * measured_start


@pytest.mark.parametrize("name", ["tiny-roberta.yaml", "tiny-sandwich.yaml"])
def test_the_loss_graphs_own_module_saves_what_train_peak_counts(name: str) -> None:
    """The loss graph's own module (its output a probability head or logits, the loss on
    it): every tensor its forward saves, each storage once, is train_peak's saved bytes
    exactly. RoBERTa reads its learned positions through padding-aware position ids (the
    gather keeps the shifted ids); ScaleNorm passes rms_norm a gain g / sqrt(d) of its own."""
    spec = _spec(name)
    spec = spec.model_copy(update={"attention": spec.attention.model_copy(
        update={"dropout": 0.0})})  # hard attention refuses attention dropout
    batch, seq, tgt = 2, 12, 10
    graph = tfgraph.compile(spec, loss=True)
    model = to_torch(graph, seed=0).train()
    inputs = (*make_ids(tfgraph.compile(spec), batch, seq, tgt),
              _labels(graph, batch, seq, tgt))
    with saved_storages(model) as seen:
        loss = model(*inputs)  # held: its graph keeps the saves
        measured = sum(seen.values())
    assert loss.requires_grad
    peak = train_peak(graph, sizes_for(graph, batch, seq, tgt), fused_attention=True)
    assert measured == peak.saved + uncounted(spec, batch, seq, tgt)


@pytest.mark.parametrize("name", WINDOWED)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_windowed_attention_masks_are_counted_exactly(name: str, dtype: str) -> None:
    """The (Tq, Tk) mask each windowed attention call builds is saved whole, once per call:
    SDPA's float mask in the module's dtype, masked_fill's boolean one where attention runs as
    explicit matmuls; report's saved_for_backward equals the measured bytes (with the stated
    ``uncounted`` terms), and the mask term is S^2 bytes per element per masked layer."""
    data = _spec(name).model_dump()
    data["dtype"] = dtype
    spec = tfgraph.Spec.model_validate(data)
    graph = tfgraph.compile(spec, loss=True)
    batch, seq = 2, 24
    sizes = sizes_for(graph, batch, seq, seq)
    peak = train_peak(graph, sizes, fused_attention=True)
    saved, _ = measured_saved(spec, batch, seq, seq)
    assert saved == peak.saved + uncounted(spec, batch, seq, seq)
    plain = tfgraph.compile(spec)  # report's figure: the forward without the loss
    model = to_torch(plain, seed=0).train()
    with saved_storages(model) as seen:
        logits = model(*make_ids(plain, batch, seq, seq))  # held: its graph keeps the saves
    report = plain.report(batch=batch, seq=seq, fused_attention=True)
    assert logits.requires_grad
    assert sum(seen.values()) == report["memory"]["saved_for_backward"] + uncounted(
        spec, batch, seq, seq)
    masks = 0
    for c in cost.op_costs(graph):
        node = graph.node(c.node)
        for tensor, nbytes in c.saved:
            if tensor.endswith("#read_mask"):
                fused = not node.attrs.get("softcap") and len(node.inputs) == 3
                masks += 1
                assert int(nbytes.xreplace(sizes)) == seq * seq * (
                    DTYPE_BYTES[dtype] if fused else 1), node.name
    windowed = sum(1 for n in graph.nodes() if n.op == "attention" and n.attrs.get("window"))
    assert windowed >= 1 and masks >= windowed  # explicit causal layers keep one too


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("batch,seq,tgt", SHAPES)
def test_live_peak_matches_a_measured_step(name: str, batch: int, seq: int, tgt: int) -> None:
    spec = _spec(name)
    graph = tfgraph.compile(spec, loss=True)
    model = to_torch(graph, seed=0).train()  # the loss graph's own module
    inputs = (*make_ids(tfgraph.compile(spec), batch, seq, tgt),
              _labels(graph, batch, seq, tgt))
    mode = LiveStorages(model)
    with mode:
        model(*inputs).backward()
    peak = train_peak(graph, sizes_for(graph, batch, seq, tgt), fused_attention=True)
    assert abs(mode.peak - peak.bytes) <= 0.05 * mode.peak, (mode.peak, peak)


# mixture-of-experts decoders whose inference peak is inside the routed experts' call
MOE_PEAK = ["tiny-moe.yaml", "tiny-olmoe.yaml", "tiny-phimoe.yaml", "tiny-deepseek-moe.yaml"]


def balanced_peak(spec: Any, model: torch.nn.Module, ids: Any,
                  monkeypatch: pytest.MonkeyPatch) -> int:
    """The live storages' peak of a no-grad forward under a balanced routing: pair j of token
    i to expert (i k + j) mod E, N k / E pairs per expert, written into the routing weights
    the module computed (the routed experts' buffers then match ops_moe's temp exactly)."""
    batch, seq = ids[0].shape
    experts, top_k = spec.ffn.experts, spec.ffn.top_k
    pair = torch.arange(batch * seq * top_k)
    balanced = torch.zeros(batch * seq, experts)
    balanced[pair // top_k, pair % experts] = 1.0 - (pair % top_k) / (2 * top_k)
    assert (batch * seq * top_k) % experts == 0
    assert (balanced > 0).sum(0).tolist() == [batch * seq * top_k // experts] * experts
    balanced = balanced.view(batch, seq, experts)  # made here: the mode sees no new storage
    real = torch_functional.experts

    def routed_balanced(x: torch.Tensor, weights: torch.Tensor, *rest: Any) -> torch.Tensor:
        return real(x, weights.copy_(balanced), *rest)

    monkeypatch.setattr(torch_functional, "experts", routed_balanced)
    mode = LiveStorages(model)
    with torch.no_grad(), mode:
        model(*ids)
    monkeypatch.undo()
    return mode.peak


@pytest.mark.parametrize("name,dtype", [*((n, "float32") for n in MOE_PEAK),
                                        ("tiny-olmoe.yaml", "bfloat16")])
def test_moe_inference_peak_matches_a_measured_forward(name: str, dtype: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """report's activations_peak is the routed experts' working buffers (ops_moe's temp) on
    top of the live set: with a balanced routing (``balanced_peak``), a no-grad forward's
    live storages peak at exactly the report's figure plus the rotary tables; with the
    model's own routing, within 5%."""
    data = _spec(name).model_dump()
    data["dtype"] = dtype
    spec = tfgraph.Spec.model_validate(data)
    graph = tfgraph.compile(spec)
    model = to_torch(graph, seed=0).eval()
    batch, seq = 2, 12
    ids = make_ids(graph, batch, seq, seq)
    report = graph.report(batch=batch, seq=seq, fused_attention=True)
    assert report["activations_peak_at"].endswith(".ffn.experts"), report["activations_peak_at"]
    expected = report["memory"]["activations_peak"] + rope_tables(spec, batch, seq, seq)
    assert balanced_peak(spec, model, ids, monkeypatch) == expected
    own = LiveStorages(model)
    with torch.no_grad(), own:
        model(*ids)
    assert abs(own.peak - expected) <= 0.05 * own.peak, (own.peak, expected)


@pytest.mark.parametrize("name", ["tiny-mla.yaml", "tiny-deepseek-v3.yaml"])
def test_latent_attention_inference_peak_matches_a_measured_forward(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Latent attention's values are narrower than its keys (v_head_dim < head_dim): the
    fused kernel gets v zero-padded to head_dim and returns a padded output, whose slice the
    module copies out as the attention's output (exporters.torch.functional.attention). At
    that copy the padded v and the padded output are live beside the operands and the output
    (ops.py, attention's ``fused_temp``): a no-grad forward (balanced routing, so the routed
    experts' buffers are the op table's) peaks there at exactly report's activations_peak
    plus the rotary tables."""
    spec = _spec(name)
    graph = tfgraph.compile(spec)
    model = to_torch(graph, seed=0).eval()
    batch, seq = 2, 12
    ids = make_ids(graph, batch, seq, seq)
    report = graph.report(batch=batch, seq=seq, fused_attention=True)
    assert report["activations_peak_at"].endswith(".self_attn.attention"), \
        report["activations_peak_at"]
    expected = report["memory"]["activations_peak"] + rope_tables(spec, batch, seq, seq)
    assert balanced_peak(spec, model, ids, monkeypatch) == expected


def test_peak_is_the_loss_backward_on_a_vocabulary_heavy_model() -> None:
    graph = tfgraph.compile(_spec("tiny-decoder.yaml"), loss=True)
    peak = train_peak(graph, sizes_for(graph, 2, 16, 16), fused_attention=True)
    assert (peak.node, peak.phase) == ("loss", "backward")
    vocab = graph.node("logits").type.shape[-1]
    # the float32 log-probabilities, their gradient and the logits' gradient: 3 * B*S*V*4
    assert {"loss#log_probs", "loss#scratch", "grad:logits"} <= set(peak.live)
    assert sympy.expand(peak.expr).coeff(B * S) >= 3 * 4 * vocab


def test_train_peak_exceeds_inference_peak_when_the_vocabulary_dominates() -> None:
    data = _spec("tiny-llama.yaml").model_dump()
    data["vocab"] = 4096
    spec = tfgraph.Spec.model_validate(data)
    graph = tfgraph.compile(spec, loss=True)
    sizes = sizes_for(graph, 4, 64, 64)
    inference = tfgraph.compile(spec).report(batch=4, seq=64, fused_attention=True)
    train = train_peak(graph, sizes, fused_attention=True)
    assert train.bytes > inference["memory"]["activations_peak"]


def test_saved_by_layer_sums_to_the_forward_and_full_keeps_layer_inputs() -> None:
    spec = _spec("tiny-bf16.yaml")
    graph = tfgraph.compile(spec, loss=True)
    sizes = sizes_for(graph, 3, 20, 20)
    for recompute in ("none", "selective", "full"):
        by_layer = saved_by_layer(graph, recompute)
        peak = train_peak(graph, sizes, recompute, fused_attention=True)
        assert sum(int(e.xreplace(sizes)) for e in by_layer.values()) == peak.saved
    full = saved_by_layer(graph, "full")
    layers = [k for k in full if k is not None]
    assert layers == [("decoder", i) for i in range(spec.layer_count("decoder"))]
    for key in layers:  # each layer keeps its input only: B*S*d at 2 bytes (the paper's 2sbh)
        assert sympy.expand(full[key] - 2 * B * S * spec.d_model) == 0
    none = saved_by_layer(graph, "none")
    assert none[None] == full[None]  # outside layers nothing changes
    assert all(sympy.expand(none[k] - full[k]).coeff(B * S) > 0 for k in layers)
    full_peak = train_peak(graph, sizes, "full", fused_attention=True)
    none_peak = train_peak(graph, sizes, "none", fused_attention=True)
    assert full_peak.bytes < none_peak.bytes


def test_selective_recompute_drops_score_sized_tensors() -> None:
    # hardmax keeps its one-hot weights (one per score); a fused softmax kernel keeps none
    spec = _spec("tiny-decoder.yaml")
    data = spec.model_dump()
    data["attention"]["normalize"] = "hardmax"
    hard = tfgraph.compile(type(spec).model_validate(data), loss=True)
    sizes = sizes_for(hard, 2, 48, 48)
    none, selective = (saved_by_layer(hard, r) for r in ("none", "selective"))
    heads = spec.attention.heads
    for key in (k for k in none if k is not None):  # B*h*S*S float32 weights per layer
        assert sympy.expand(none[key] - selective[key] - 4 * B * heads * S * S) == 0
    kept = train_peak(hard, sizes, "none", fused_attention=True)
    recomputed = train_peak(hard, sizes, "selective", fused_attention=True)
    assert recomputed.saved < kept.saved
    soft = tfgraph.compile(spec, loss=True)
    assert saved_by_layer(soft, "selective") == saved_by_layer(soft, "none")


def test_bad_recompute_and_graphs_without_loss_are_refused() -> None:
    graph = tfgraph.compile(_spec("tiny-decoder.yaml"), loss=True)
    with pytest.raises(TfgraphError, match="recompute 'some'"):
        train_peak(graph, sizes_for(graph, 1, 8, 8), "some")
    with pytest.raises(TfgraphError, match="no loss node"):
        train_peak(tfgraph.compile(_spec("tiny-decoder.yaml")), sizes_for(graph, 1, 8, 8))


def test_a_read_mask_is_whole_on_every_tensor_parallel_rank(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The window's (S, S) mask is one per attention call, built whole on every rank: tensor
    and sequence parallelism split none of it (tiny-mistral: 2 windowed layers x 16^2 x 4)."""
    from tfgraph.graph import ops
    from tfgraph.parallel.gpus import gpu
    from tfgraph.parallel.layout import Layout
    from tfgraph.parallel.planner import plan

    spec = load_spec(ROOT / "specs" / "tiny-mistral.yaml").model_copy(update={"dtype": "float32"})

    def activations(tp: int, sp: bool) -> int:
        layout = Layout(tp=tp, sp=sp, dtype="float32", seq=16, micro_batch=4, global_batch=4)
        return int(plan(tfgraph.compile(spec, loss=True), layout, gpu("h100"),
                        "fused")["per_rank"]["memory"]["activations"])

    layouts = [(1, False), (2, False), (2, True)]
    counted = [activations(tp, sp) for tp, sp in layouts]
    monkeypatch.setattr(ops, "attention_read_mask", lambda ins, attrs, fused: [])
    without = [activations(tp, sp) for tp, sp in layouts]
    assert [c - w for c, w in zip(counted, without)] == [2 * 16 * 16 * 4] * 3
