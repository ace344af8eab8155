"""Formulas: every figure as a sympy expression, in B, S, T and in the spec's own symbols, that
evaluates to the report's number; the spec-symbol form is exact for every spec and knob."""

from __future__ import annotations

from typing import Any

import pytest
import sympy

import tfgraph
from tfgraph.passes.formulas import D, D_FF, H, KV, L, V, pretty, size_symbols, spec_formulas
from tfgraph.graph.ir import B, S
from tfgraph.spec.schema import Spec

from conftest import SPEC_FILES, tgt_for

NUMBERS = ("params", "flops", "memory")


def figures(rep: dict[str, Any]) -> dict[str, int]:
    out = {"params": rep["params"]}
    if "params_active" in rep:  # mixture of experts
        out["params_active"] = rep["params_active"]
    out.update({f"flops.{k}": v for k, v in rep["flops"].items()})
    out.update({f"memory.{k}": v for k, v in rep["memory"].items()})
    return out


def evaluate(text: str, values: dict[str, int]) -> int:
    names = size_symbols()
    expr = sympy.parse_expr(text, local_dict=names)
    return int(expr.xreplace({names[k]: v for k, v in values.items()}))


def check_report(rep: dict[str, Any]) -> None:
    """Each formula (spec symbols) and each formula_bst evaluates to the report's number."""
    numbers = figures(rep)
    assert set(rep["formulas"]) == set(numbers) == set(rep["formulas_bst"])
    for key, text in rep["formulas"].items():
        assert evaluate(text, rep["symbols"]) == numbers[key], key
        assert evaluate(rep["formulas_bst"][key], rep["symbols"]) == numbers[key], key


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_every_spec_formula_evaluates_to_its_number(path):
    graph = tfgraph.compile(path)
    assert spec_formulas(graph).unverified == []
    for sizes in ({"batch": 2, "seq": 24, "tgt_seq": 9}, {"batch": 5, "seq": 7, "tgt_seq": 31}):
        rep = graph.report(sizes["batch"], sizes["seq"], tgt_for(graph, sizes["tgt_seq"]))
        check_report(rep)
        assert rep["symbols"]["B"] == sizes["batch"] and rep["symbols"]["S"] == sizes["seq"]
        assert ("T" in rep["symbols"]) == (graph.spec.arch == "encoder-decoder")
    fused = graph.report(batch=2, seq=24, fused_attention=True)
    check_report(fused)


BASE: dict[str, Any] = {"name": "k", "arch": "decoder-only", "d_model": 24, "layers": 3,
                        "vocab": 41, "max_len": 32, "attention": {"heads": 4}}
KNOBS = [
    {},
    {"arch": "encoder-only", "norm": {"position": "pre", "kind": "rmsnorm"}},
    {"arch": "encoder-decoder", "layers": {"encoder": 2, "decoder": 3},
     "vocab": {"source": 50, "target": 37}, "embedding": {"positions": "learned"}},
    {"arch": "encoder-decoder", "embedding": {"positions": "rope", "tie_output": False}},
    {"attention": {"heads": 6, "kv_heads": 2, "head_dim": 5, "bias": False}},
    {"attention": {"heads": 4, "kv_heads": 1, "normalize": "hardmax"}, "output": "probs"},
    {"ffn": {"activation": "swiglu", "hidden": 40, "bias": False}, "dtype": "bfloat16"},
    {"ffn": {"activation": "geglu"}, "norm": {"position": "sandwich", "kind": "scalenorm"}},
    {"norm": {"position": "branch", "final": True}, "embedding": {"output_bias": True,
                                                                  "tie_output": False}},
    {"dropout": 0.0, "embedding": {"positions": "none", "scale": False}, "dtype": "float16"},
]


@pytest.mark.parametrize("over", KNOBS, ids=range(len(KNOBS)))
def test_spec_formulas_are_exact_for_every_knob(over):
    spec = Spec.model_validate({**BASE, **over})
    graph = tfgraph.compile(spec)
    assert spec_formulas(graph).unverified == []
    check_report(graph.report(batch=3, seq=11, tgt_seq=tgt_for(graph, 6)))
    check_report(graph.report(batch=1, seq=32, tgt_seq=tgt_for(graph, 2),
                              fused_attention=True))


def test_formulas_do_not_depend_on_the_layer_count():
    a = tfgraph.compile(Spec.model_validate({**BASE, "layers": 3})).report(batch=1, seq=8)
    b = tfgraph.compile(Spec.model_validate({**BASE, "layers": 17})).report(batch=1, seq=8)
    # the training step's live set spans every layer's saved tensors: written in B, S, T with
    # the spec's sizes as numbers (report CONVENTIONS, formulas), so it is left out here
    per_step = ("memory.train_activations_peak", "memory.train_step")
    assert ({k: v for k, v in a["formulas"].items() if k not in per_step}
            == {k: v for k, v in b["formulas"].items() if k not in per_step})
    assert a["formulas"]["memory.train_activations_peak"] != \
        b["formulas"]["memory.train_activations_peak"]
    assert a["formulas_bst"] != b["formulas_bst"]
    assert (a["symbols"]["L"], b["symbols"]["L"]) == (3, 17)


def test_formulas_name_the_sizes_they_depend_on():
    llama = spec_formulas(tfgraph.compile(SPEC_FILES[0].parent / "llama.yaml")).figures
    assert {D, D_FF, H, KV, L, V} <= llama["flops.matmul"].free_symbols
    gpt2 = spec_formulas(tfgraph.compile(SPEC_FILES[0].parent / "gpt2.yaml")).figures
    # default head_dim (d/h), no grouping (kv = h) and d_ff = 4d leave only d, L, V, B, S
    assert gpt2["flops.matmul"].free_symbols == {B, S, D, L, V}
    assert sympy.expand(gpt2["memory.kv_cache"] - 2 * L * B * S * D * 4) == 0


def test_layer_terms_are_grouped():
    rep = tfgraph.compile(SPEC_FILES[0].parent / "gpt2.yaml").report(batch=1, seq=8)
    assert rep["formulas"]["flops.matmul"] == "2*B*S*V*d + L*(4*B*S**2*d + 24*B*S*d**2)"


def test_pretty_uses_middle_dots_and_superscripts():
    assert pretty("L*(24*B*S*d**2 + 4*B*S**2*d) + 2*B*S*V*d") == \
        "L·(24·B·S·d² + 4·B·S²·d) + 2·B·S·V·d"
    assert pretty(sympy.Symbol("x") ** 12) == "x¹²"


def test_a_graph_without_spec_reports_formulas_in_b_s_t():
    from test_cost_memory import hand_graph

    from tfgraph.passes.report import build_report

    rep = build_report(hand_graph(), batch=2, seq=5)
    assert rep["formulas"] == rep["formulas_bst"]
    check_report(rep)
