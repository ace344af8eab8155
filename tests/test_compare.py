"""``tfgraph.passes.compare``: the comparison dict against graph.report(), ratios, spec differences, the
parameter breakdown and the attention/FFN crossover against values derived by hand here.

The crossover references are written out from the accounting conventions (README,
``tfgraph report``: the per-element constants stated in every report) rather than taken from
the code under test: attention-score FLOPs per layer are 2·2·B·h·hd per score for QKᵀ and
weights·V plus, per score, 1 (the 1/sqrt(hd) scaling) + 5 (softmax) + 1 (causal mask); the
FFN's are its matmuls (2 per multiply-accumulate), bias adds, activation, its norm and the
residual add.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import sympy
from conftest import ROOT, SPEC_FILES, tgt_for

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.passes.compare import compare, crossover, series, spec_differences
from tfgraph.passes.param_groups import params_by_kind
from tfgraph.passes.report import build_report


def compiled(name: str) -> tfgraph.graph.ir.Graph:
    return tfgraph.compile(ROOT / "specs" / name)


@pytest.fixture(scope="module")
def variants() -> list[tfgraph.graph.ir.Graph]:
    return [compiled("base.yaml"), compiled("gpt2.yaml"), compiled("tiny-llama.yaml")]


def test_numbers_are_the_reports_at_every_length(variants: list) -> None:
    seqs = (16, 200, 1024)
    data = compare(variants, seqs=seqs, batch=3)
    assert data["seqs"] == list(seqs) and data["batch"] == 3
    for graph, v in zip(variants, data["variants"]):
        assert v["name"] == graph.name
        for seq, row in zip(seqs, v["at"]):
            rep = graph.report(batch=3, seq=seq, tgt_seq=tgt_for(graph, seq))
            assert row["seq"] == seq
            assert row["values"] == {
                "flops.forward_effective": rep["flops"]["forward_effective"],
                "flops.forward": rep["flops"]["forward"],
                "flops.matmul_effective": rep["flops"]["matmul_effective"],
                "flops.matmul": rep["flops"]["matmul"],
                "memory.activations_peak": rep["memory"]["activations_peak"],
                "memory.kv_cache": rep["memory"]["kv_cache"],
                "memory.train_step": rep["memory"]["train_step"],
            }
        assert v["params"] == graph.report()["params"]


def test_ratios_are_to_the_first_variant(variants: list) -> None:
    data = compare(variants, seqs=(64, 256))
    first = data["variants"][0]
    assert data["baseline"] == first["name"]
    assert first["ratio"]["params"] == 1
    assert all(r == 1 for row in first["at"] for r in row["ratio"].values())
    for v in data["variants"][1:]:
        assert v["ratio"]["params"] == pytest.approx(v["params"] / first["params"])
        for row, base in zip(v["at"], first["at"]):
            for key, value in row["values"].items():
                assert row["ratio"][key] == pytest.approx(value / base["values"][key])


def test_ratio_is_null_when_the_baseline_is_zero() -> None:
    # an encoder has no KV cache: ratios against it are undefined, not infinite
    data = compare([compiled("tiny-encoder.yaml"), compiled("tiny-decoder.yaml")], seqs=(32,))
    assert data["variants"][0]["at"][0]["values"]["memory.kv_cache"] == 0
    assert data["variants"][1]["at"][0]["ratio"]["memory.kv_cache"] is None
    json.dumps(data)  # JSON-ready: no sympy numbers, no infinities


def test_lengths_beyond_max_len_are_flagged() -> None:
    data = compare([compiled("gpt2.yaml"), compiled("base.yaml")], seqs=(1024, 1025))
    gpt2, base = data["variants"]
    assert [a["beyond_max_len"] for a in gpt2["at"]] == [False, True]
    assert [a["beyond_max_len"] for a in base["at"]] == [True, True]  # max_len 512


def test_spec_differences_list_only_differing_fields() -> None:
    diffs = spec_differences([compiled("base.yaml"), compiled("big.yaml")])
    fields = {d["field"]: d["values"] for d in diffs}
    assert fields == {
        "d_model": [512, 1024],
        "attention.heads": [8, 16],
        "attention.kv_heads": [8, 16],  # derived default, resolved before comparing
        "ffn.hidden": [2048, 4096],
        "dropout": [0.1, 0.3],
    }
    mixed = {d["field"]: d["values"] for d in
             spec_differences([compiled("tiny-seq2seq.yaml"), compiled("tiny.yaml")])}
    # {encoder, decoder} layers against one int: each variant's value or None
    assert any(v[0] is not None and v[1] is None for k, v in mixed.items()
               if k.startswith("layers."))


@pytest.mark.parametrize("spec_path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_params_by_kind_sums_to_params(spec_path) -> None:
    graph = tfgraph.compile(spec_path)
    parts = params_by_kind(graph)
    assert sum(parts.values()) == graph.report()["params"]
    assert parts["ffn"] > 0 and parts["self_attn"] > 0
    assert ("cross_attn" in parts) == (graph.spec.arch == "encoder-decoder")
    assert ("head" in parts) == (not graph.spec.embedding.tie_output
                                 or graph.spec.embedding.output_bias)
    assert all(n > 0 for n in parts.values())


def _gpt2_crossover() -> Fraction:
    """GPT-2 small from its published sizes: d 768, 12 heads of 64, FFN 3072 (GELU tanh,
    biases), pre-norm LayerNorm, 12 layers; both sides are per layer, so layers cancel."""
    d, h, hidden = 768, 12, 3072
    att_per_s2 = 2 * 2 * d + (1 + 5 + 1) * h  # QK^T + A·V; scale, softmax, causal mask
    ffn_per_s = (2 * d * hidden + hidden  # up + bias
                 + 8 * hidden  # gelu_tanh
                 + 2 * hidden * d + d  # down + bias
                 + 8 * d  # the ffn's pre-norm LayerNorm
                 + d)  # residual add
    return Fraction(ffn_per_s, att_per_s2)


def _tiny_llama_crossover() -> Fraction:
    """tiny-llama: d 64, 4 heads of 16 (2 kv heads: GQA saves K/V, not score work), SwiGLU 96,
    no biases, pre-norm RMSNorm."""
    d, h, hd, hidden = 64, 4, 16, 96
    att_per_s2 = 2 * 2 * h * hd + (1 + 5 + 1) * h
    ffn_per_s = 3 * 2 * d * hidden + 4 * hidden + hidden + 5 * d + d  # gate/up/down, silu, mul
    return Fraction(ffn_per_s, att_per_s2)


def _base_crossover() -> Fraction:
    """Transformer base (T = S): encoder self-attention (no mask), decoder masked
    self-attention and cross-attention against 12 ReLU FFNs (biases, post-norm LayerNorm)."""
    d, h, hidden, layers = 512, 8, 2048, 6
    att_per_s2 = layers * ((4 * d + 6 * h) + (4 * d + 7 * h) + (4 * d + 6 * h))
    ffn_per_s = 2 * layers * (4 * d * hidden + hidden + d + hidden + 8 * d + d)
    return Fraction(ffn_per_s, att_per_s2)


@pytest.mark.parametrize(("name", "expected"), [
    ("gpt2.yaml", _gpt2_crossover()),
    ("tiny-llama.yaml", _tiny_llama_crossover()),
    ("base.yaml", _base_crossover()),
])
def test_crossover_equals_the_analytic_value(name: str, expected: Fraction) -> None:
    graph = compiled(name)
    c = crossover(graph)
    exact = sympy.Rational(c["exact"])
    assert Fraction(int(exact.p), int(exact.q)) == expected
    assert c["seq"] == pytest.approx(float(expected), rel=1e-12)
    # the integer either side, checked on the report's formulas (build_report: GPT-2's
    # crossover is past its max_len, where graph.report refuses a learned table)
    above = c["first_seq_above"]
    kinds_above = build_report(graph, seq=above)["flops_by_kind"]
    kinds_below = build_report(graph, seq=above - 1)["flops_by_kind"]
    assert kinds_above["attention_scores"] > kinds_above["ffn"]
    assert kinds_below["attention_scores"] <= kinds_below["ffn"]


def test_crossover_does_not_depend_on_batch() -> None:
    graph = compiled("gpt2.yaml")
    assert crossover(graph, batch=1)["exact"] == crossover(graph, batch=7)["exact"]
    assert crossover(graph)["seq"] == pytest.approx(3001.43, abs=0.01)


def test_definitions_travel_with_the_data(variants: list) -> None:
    data = compare(variants[:2], seqs=(32,))
    definition = data["definitions"]["crossover"]
    assert "flops_by_kind['attention_scores']" in definition
    assert "flops_by_kind['ffn']" in definition
    for v in data["variants"]:
        assert v["crossover"]["variable"] == "S"  # report's S; L is its layer count
        assert "S**2" in v["crossover"]["attention_scores_flops"]
        assert "L" not in v["crossover"]["attention_scores_flops"]


def test_series_matches_the_report() -> None:
    graph = compiled("base.yaml")
    lengths = [7, 100, 333]
    s = series(graph, lengths, batch=2)
    for i, seq in enumerate(lengths):
        rep = graph.report(batch=2, seq=seq, tgt_seq=tgt_for(graph, seq))
        assert s["flops.forward"][i] == rep["flops"]["forward"]
        assert s["memory.activations_peak"][i] == rep["memory"]["activations_peak"]
        assert s["memory.train_step"][i] == rep["memory"]["train_step"]
        assert s["flops_by_kind.attention_scores"][i] == rep["flops_by_kind"]["attention_scores"]
        assert s["flops_by_kind.ffn"][i] == rep["flops_by_kind"]["ffn"]


def test_bad_arguments() -> None:
    g = compiled("tiny.yaml")
    with pytest.raises(ValueError):
        compare([], seqs=(8,))
    with pytest.raises(ValueError):
        compare([g], seqs=(0,))
    # refused as graph.report(seq=16.9) refuses them, never truncated to 16 or read as 1
    for seqs, bad in (((16.9,), "16.9"), ((16, True), "True"), ((8.0,), "8.0")):
        with pytest.raises(ValueError, match=f"^seqs must be a positive integer, got {bad}$"):
            compare([g], seqs=seqs)
    with pytest.raises(ValueError, match="^batch must be a positive integer, got True$"):
        compare([g], seqs=(8,), batch=True)
    # a KV-cache graph has no report (graph.report refuses it), so no comparison either
    with pytest.raises(TfgraphError, match="^tiny-llama: the report is of the full "
                                                   "graph, not the KV-cache graph"):
        compare([compiled("tiny-llama.yaml"), tfgraph.compile(ROOT / "specs" / "tiny-llama.yaml",
                                                              cache=True)], seqs=(8,))


@pytest.mark.parametrize("name", ["mistral-7b.yaml", "llama-3.1-8b.yaml", "gemma-2-2b.yaml"])
def test_crossover_exact_is_a_root(name: str) -> None:
    """``exact`` is the root itself: attention's and the FFN's FLOPs are equal there with no
    rounding (sympy's nsimplify had written mistral's 11013056/519 as a power of 10 and 7
    that agrees only to 16 digits)."""
    c = crossover(compiled(name))
    length = sympy.Symbol("S", positive=True)  # the variable; sympify reads "S" as sympy.S
    root = sympy.sympify(c["exact"])
    att, ffn = (sympy.sympify(c[k], locals={"S": length})
                for k in ("attention_scores_flops", "ffn_flops"))
    assert sympy.simplify((att - ffn).subs(length, root)) == 0
    assert float(root) == pytest.approx(c["seq"], rel=1e-15)
