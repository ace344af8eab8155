"""write_graph_json: the op graph as JSON, in topological order, with per-node costs that add up
to the report's totals; written atomically."""

from __future__ import annotations

import functools
import json

import pytest
import sympy

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.passes.formulas import size_symbols
from tfgraph.graph.serialize import FORMAT, write_graph_json

from conftest import ROOT, tgt_for


@functools.lru_cache(maxsize=None)
def parse(text: str) -> sympy.Expr:
    return sympy.parse_expr(text, local_dict=size_symbols())


def test_graph_json_round_trips_the_graph(small_spec, tmp_path):
    graph = tfgraph.compile(small_spec)  # each file in specs/, every knob, tiny sizes
    out = write_graph_json(graph, tmp_path / "g.json")
    assert out == tmp_path / "g.json"
    doc = json.loads(out.read_text())
    assert doc["format"] == FORMAT and doc["name"] == graph.name
    assert doc["inputs"] == graph.inputs and doc["outputs"] == graph.outputs
    assert tfgraph.Spec.model_validate(doc["spec"]) == graph.spec
    nodes = doc["nodes"]
    assert [n["name"] for n in nodes] == [n.name for n in graph.nodes()]
    seen: set[str] = set()
    for entry in nodes:  # topological: every input is written before its reader
        assert all(i in seen for i in entry["inputs"]), entry["name"]
        seen.add(entry["name"])
        node = graph.node(entry["name"])
        assert (entry["op"], tuple(entry["inputs"]), entry["scope"], entry["dtype"]) == \
            (node.op, node.inputs, node.scope, node.type.dtype)
        assert tuple(parse(d) for d in entry["shape"]) == node.type.shape

    rep = graph.report(batch=2, seq=6, tgt_seq=tgt_for(graph, 3))
    values = {size_symbols()[k]: v for k, v in {"B": 2, "S": 6, "T": 3}.items()}
    total = {"matmul": 0, "other": 0, "params": 0}
    for entry in nodes:
        cost = entry.get("cost", {})
        total["params"] += cost.get("params", 0)
        for key in ("matmul", "other"):
            if f"flops_{key}" in cost:
                total[key] += int(parse(cost[f"flops_{key}"]).xreplace(values))
    assert total == {"matmul": rep["flops"]["matmul"], "other": rep["flops"]["other"],
                     "params": rep["params"]}


def test_attributes_are_plain_json(tmp_path):
    graph = tfgraph.compile(ROOT / "specs" / "tiny-sandwich.yaml")
    doc = json.loads(write_graph_json(graph, tmp_path / "g.json").read_text())
    by_name = {n["name"]: n for n in doc["nodes"]}
    att = by_name["decoder.layers.0.self_attn.attention"]["attrs"]
    assert att == {"heads": 4, "kv_heads": 1, "head_dim": 8, "causal": True,
                   "normalize": "hardmax", "kind": "self"}
    assert by_name["embed.tokens.weight"]["attrs"] == {"shape": [97, 32], "init": "normal",
                                                       "dims": ["vocab", "d_model"]}
    assert by_name["decoder.embed.scale"]["attrs"]["factor"] == pytest.approx(32 ** 0.5)


def test_rewrite_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "g.json"
    target.write_text("old")
    write_graph_json(tfgraph.compile(ROOT / "specs" / "tiny.yaml"), target)
    assert json.loads(target.read_text())["name"] == "tiny"
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"]


def test_missing_directory_is_a_user_error(tmp_path):
    graph = tfgraph.compile(ROOT / "specs" / "tiny.yaml")
    with pytest.raises(TfgraphError, match="does not exist"):
        write_graph_json(graph, tmp_path / "nope" / "g.json")
