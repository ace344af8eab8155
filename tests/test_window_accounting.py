"""Sliding windows in the accounting: the KV cache of a local layer holds min(T, W) positions,
and the causal-effective matmul FLOPs count only the scores a query reads, counted here by
brute force over the mask, layer by layer, for all-local (Mistral) and local/global (Gemma 2)
specs; the formulas carry the window as the symbol W."""

from __future__ import annotations

from pathlib import Path

import pytest

import tfgraph
from tfgraph.spec.loader import load_spec
from tfgraph.spec.schema import Spec

SPECS = Path(__file__).resolve().parent.parent / "specs"
BATCH = 2


def _read_scores(length: int, window: int | None) -> int:
    """Scores query i reads under the causal mask (and the window), by enumeration."""
    return sum(1 for i in range(length) for j in range(length)
               if j <= i and (window is None or i - j < window))


def _layers(spec: Spec) -> list[int | None]:
    att = spec.attention
    return [att.window if spec.layer_is_local(i) else None
            for i in range(spec.layer_count("decoder"))]


@pytest.mark.parametrize("name", ["tiny-mistral", "tiny-gemma2"])
@pytest.mark.parametrize("seq", [5, 8, 19])
def test_kv_cache_and_causal_effective_flops_follow_the_window(name: str, seq: int) -> None:
    spec = load_spec(SPECS / f"{name}.yaml")
    att = spec.attention
    assert att.kv_heads and att.head_dim and att.window == 8
    report = tfgraph.compile(spec).report(batch=BATCH, seq=seq)
    per_position = 2 * BATCH * att.kv_heads * att.head_dim * 4  # K and V, float32
    expected_cache = sum(per_position * (seq if w is None else min(seq, w))
                         for w in _layers(spec))
    assert report["memory"]["kv_cache"] == expected_cache
    # Masked-out scores cost 2 products * 2 FLOPs * B*h*hd each in the dense count.
    masked = sum(seq * seq - _read_scores(seq, w) for w in _layers(spec))
    per_score = 2 * 2 * BATCH * att.heads * att.head_dim
    flops = report["flops"]
    assert flops["matmul"] - flops["causal_effective_matmul"] == per_score * masked


def test_windows_change_nothing_when_the_sequence_fits() -> None:
    """At seq <= W a sliding window masks nothing beyond the causal mask."""
    spec = load_spec(SPECS / "tiny-mistral.yaml")
    data = spec.model_dump()
    data["attention"]["window"] = None
    plain = Spec.model_validate(data)
    for seq in (3, 8):
        ours = tfgraph.compile(spec).report(batch=BATCH, seq=seq)
        theirs = tfgraph.compile(plain).report(batch=BATCH, seq=seq)
        assert ours["memory"]["kv_cache"] == theirs["memory"]["kv_cache"]
        assert ours["flops"] == theirs["flops"]


def test_formulas_name_the_window_and_the_layer_kinds() -> None:
    report = tfgraph.compile(load_spec(SPECS / "tiny-gemma2.yaml")).report(batch=BATCH, seq=19)
    kv = report["formulas"]["memory.kv_cache"]
    assert "Min(S, W)" in kv and "L_local" in kv and "L_global" in kv


def _read_both_sides(length: int, window: int | None) -> int:
    """Scores query i reads in a bidirectional window |i - j| < W, by enumeration."""
    return sum(1 for i in range(length) for j in range(length)
               if window is None or abs(i - j) < window)


@pytest.mark.parametrize("seq", [3, 4, 5, 19])
def test_encoder_windows_count_both_sides(seq: int) -> None:
    """An encoder's sliding window (ModernBERT's local layers) reads |i - j| < W: the
    effective matmul FLOPs leave out the rest, layer by layer (global, local, global)."""
    spec = Spec.model_validate({
        "name": "enc", "arch": "encoder-only", "d_model": 16, "layers": 3, "vocab": 23,
        "dropout": 0.0, "attention": {"heads": 4, "window": 4,
                                      "window_pattern": ["global", "local"]}})
    windows = [spec.attention.window if spec.layer_is_local(i) else None for i in range(3)]
    assert windows == [None, 4, None]
    report = tfgraph.compile(spec).report(batch=BATCH, seq=seq)
    masked = sum(seq * seq - _read_both_sides(seq, w) for w in windows)
    per_score = 2 * 2 * BATCH * 4 * 4  # 2 products, 2 FLOPs, B*h*hd
    flops = report["flops"]
    assert flops["matmul"] - flops["causal_effective_matmul"] == per_score * masked
    assert flops["matmul"] - flops["matmul_effective"] == per_score * masked
    assert (seq <= spec.attention.window) == (masked == 0)  # the farthest key: seq - 1 < W


@pytest.mark.parametrize("name", ["tiny-mistral", "tiny-gemma2", "tiny-gemma3", "tiny-cohere2"])
def test_kv_cache_all_positions_is_what_the_torch_cache_holds(name: str) -> None:
    """memory.kv_cache is a rolling cache's (a window layer keeps W positions);
    kv_cache_all_positions is what tfgraph's own cache holds, every position of every layer:
    the bytes of the module's present tensors after a 24-token prefill (past every window)."""
    import torch

    from tfgraph.exporters.torch.module import to_torch

    spec = load_spec(SPECS / f"{name}.yaml")
    seq = 24
    assert spec.attention.window is not None and spec.attention.window < seq
    report = tfgraph.compile(spec).report(batch=1, seq=seq)
    cached = to_torch(tfgraph.compile(spec, cache=True), seed=0)
    with torch.no_grad():
        _, past = cached(torch.zeros(1, seq, dtype=torch.long), use_cache=True)
    held = sum(t.numel() * t.element_size() for layer in past for t in layer)
    assert report["kv_cache_all_positions"] == held > report["memory"]["kv_cache"]
    short = tfgraph.compile(spec).report(batch=1, seq=spec.attention.window)
    assert "kv_cache_all_positions" not in short  # nothing is dropped at seq <= W


def _moe_windows(layers: int, dense: int, pattern: list[str]) -> Spec:
    return Spec.model_validate({
        "name": "mixmoe", "arch": "decoder-only", "d_model": 16, "layers": layers, "vocab": 31,
        "dropout": 0.0, "embedding": {"positions": "rope", "tie_output": False},
        "attention": {"heads": 4, "kv_heads": 2, "window": 3, "window_pattern": pattern},
        "ffn": {"activation": "swiglu", "bias": False, "hidden": 40, "experts": 4, "top_k": 2,
                "expert_hidden": 8, "shared_experts": 1, "dense_layers": dense}})


def test_formulas_of_local_global_layers_with_dense_first_layers() -> None:
    """window_pattern and ffn.dense_layers together: each figure is L_local and L_global
    layers with experts plus L_dense times a dense layer's difference, checked at the spec's
    sizes (nothing falls back to numbers) and then at another layer count, dense count and
    pattern, against that spec's own report."""
    from tfgraph.passes.formulas import spec_formulas, symbol_values
    from tfgraph.graph.ir import SYMBOLS

    formulas = spec_formulas(tfgraph.compile(_moe_windows(3, 1, ["local", "global"])))
    assert formulas is not None and formulas.unverified == []
    kv = formulas.figures["memory.kv_cache"]
    assert {"L_local", "L_global"} <= {str(s) for s in kv.free_symbols}
    assert "L_dense" in {str(s) for s in formulas.figures["flops.forward"].free_symbols}
    other = _moe_windows(5, 2, ["global", "local", "local"])
    report = tfgraph.compile(other).report(batch=BATCH, seq=7)
    at = {**symbol_values(other), SYMBOLS["B"]: BATCH, SYMBOLS["S"]: 7, SYMBOLS["T"]: 7}
    for key, expr in formulas.figures.items():
        section, _, name = key.partition(".")
        expected = report[section][name] if name else report[section]
        assert int(expr.xreplace(at)) == expected, key
