"""The op-graph IR: building through the Graph API, deterministic order, and lint catching every
kind of broken graph (arity, shape mismatch, duplicate name, cycle, dead node)."""

from __future__ import annotations

import pytest
import sympy

from tfgraph.graph.ir import B, S, Graph, LoweringError, TensorType


def tiny_mlp() -> Graph:
    """ids -> embedding -> linear -> relu -> x + x -> logits: a valid hand-built graph."""
    g = Graph("mlp")
    ids = g.input("input_ids", (B, S))
    table = g.param("embed.tokens.weight", (10, 4), "embed", "normal", "float32")
    x = g.add("embedding", [table, ids], name="tok", scope="embed")
    w = g.param("ffn.up.weight", (6, 4), "ffn", "normal", "float32")
    h = g.add("linear", [x, w], name="up", scope="ffn")
    h = g.add("relu", [h], name="act", scope="ffn")
    w2 = g.param("ffn.down.weight", (4, 6), "ffn", "normal", "float32")
    h = g.add("linear", [h, w2], name="down", scope="ffn")
    h = g.add("add", [h, h], name="twice", scope="ffn")  # x + x: two uses of one node
    g.set_output(g.add("linear", [h, table], name="logits", scope="head"))  # tied: read twice
    return g


def test_shapes_inferred_when_added():
    g = tiny_mlp()
    assert g.node("tok").type == TensorType((B, S, sympy.Integer(4)), "float32")
    assert g.node("up").type.shape == (B, S, 6)
    assert g.node("logits").type.shape == (B, S, 10)
    assert g.node("logits").type.nbytes == 40 * B * S
    g.lint()


def test_multigraph_keeps_operand_order_and_repeated_uses():
    g = tiny_mlp()
    assert g.node("twice").inputs == ("down", "down")
    assert [(n.name, i) for n, i in g.users("down")] == [("twice", 0), ("twice", 1)]
    # the tied table is one parameter node read by the gather and by the head
    assert [(n.name, i) for n, i in g.users("embed.tokens.weight")] == [("tok", 0), ("logits", 1)]
    assert [p.name for p in g.params()] == ["embed.tokens.weight", "ffn.up.weight",
                                            "ffn.down.weight"]


def test_topological_order_is_deterministic_and_follows_insertion():
    names = [n.name for n in tiny_mlp().nodes()]
    assert names == [n.name for n in tiny_mlp().nodes()]
    assert names == ["input_ids", "embed.tokens.weight", "tok", "ffn.up.weight", "up", "act",
                     "ffn.down.weight", "down", "twice", "logits"]
    order = {n: i for i, n in enumerate(names)}
    g = tiny_mlp()
    for node in g.nodes():
        assert all(order[i] < order[node.name] for i in node.inputs)


def test_duplicate_name_is_refused_naming_the_node():
    g = tiny_mlp()
    with pytest.raises(LoweringError, match=r"while lowering act: a node of that name"):
        g.add("relu", ["up"], name="act", scope="ffn")
    # a node can never read itself: its own name already exists when it is added
    with pytest.raises(LoweringError, match="act"):
        g.add("relu", ["act"], name="act", scope="ffn")


def test_shape_mismatch_is_refused_when_added_naming_the_node():
    g = tiny_mlp()
    with pytest.raises(LoweringError, match=r"while lowering bad \(linear\).*last dim 6 != 4"):
        g.add("linear", ["up", "ffn.up.weight"], name="bad", scope="ffn")  # (B,S,6) @ [6,4]^T
    with pytest.raises(LoweringError, match=r"while lowering bad2 \(add\): operands differ"):
        g.add("add", ["up", "tok"], name="bad2", scope="ffn")


def test_unknown_op_and_inputs_are_refused():
    g = tiny_mlp()
    with pytest.raises(LoweringError, match="unknown op 'conv'"):
        g.add("conv", ["up"], name="c", scope="ffn")
    with pytest.raises(LoweringError, match=r"unknown inputs \['nope'\]"):
        g.add("relu", ["nope"], name="c", scope="ffn")


def test_lint_catches_wrong_arity():
    g = tiny_mlp()
    g.add("relu", ["up", "act"], name="two_args", scope="ffn")  # relu takes one input
    g.set_output("two_args")
    with pytest.raises(LoweringError, match=r"two_args: relu takes 1\.\.1 inputs, got 2"):
        g.lint()


def test_lint_of_a_freshly_lowered_graph_still_checks_its_structure():
    # tfgraph.compile skips what add checked of each node (attributes, inferred type), not
    # what add does not check: arity here
    g = tiny_mlp()
    g.add("relu", ["up", "act"], name="two_args", scope="ffn")
    g.set_output("two_args")
    with pytest.raises(LoweringError, match=r"two_args: relu takes 1\.\.1 inputs, got 2"):
        g.lint(recheck_added=False)
    g = tiny_mlp()
    g.node("act").type = TensorType((B, S, sympy.Integer(7)), "float32")  # after add
    g.lint(recheck_added=False)  # what add checked is not checked again ...
    with pytest.raises(LoweringError, match=r"^act: stored type"):
        g.lint()  # ... unless asked for


def test_lint_catches_a_stored_shape_that_disagrees_with_the_rule():
    g = tiny_mlp()
    g.node("act").type = TensorType((B, S, sympy.Integer(7)), "float32")  # corrupted in place
    with pytest.raises(LoweringError, match=r"^act: stored type"):
        g.lint()


def test_lint_catches_dead_nodes():
    g = tiny_mlp()
    g.add("gelu", ["up"], name="unused", scope="ffn")
    with pytest.raises(LoweringError, match=r"never used: \['unused'\]"):
        g.lint()
    g2 = tiny_mlp()
    g2.param("orphan.weight", (3,), "ffn", "ones", "float32")
    with pytest.raises(LoweringError, match="orphan.weight"):
        g2.lint()


def test_lint_catches_an_unknown_output():
    g = tiny_mlp()
    g.set_output("missing")
    with pytest.raises(LoweringError, match="output 'missing' is not a node"):
        g.lint()


def test_lint_catches_a_cycle():
    # The public API cannot build a cycle (inputs must exist before a node is added), so the
    # underlying networkx graph is corrupted directly to prove lint's acyclicity check works.
    g = tiny_mlp()
    g._g.add_edge("logits", "up", key=2)
    g._order = None
    with pytest.raises(LoweringError, match="cycle"):
        g.lint()


def test_lint_reads_the_operand_lists_themselves():
    # an operand list corrupted in place after add, before anything built the networkx graph:
    # lint checks the lists (torch.fx's lint does the same), not just the edges built from them
    for recheck in (True, False):
        g = tiny_mlp()
        g.node("act").inputs = ("nope",)
        with pytest.raises(LoweringError, match=r"^act: operand 'nope' is not a node"):
            g.lint(recheck_added=recheck)
        assert g._nx is None
    g = tiny_mlp()
    g.node("up").inputs = ("twice", "ffn.up.weight")  # twice -> down -> act -> up: a loop
    with pytest.raises(LoweringError, match=r"^up: graph has a cycle through it "
                                            r"\(up -> act -> down -> twice -> up\)"):
        g.lint(recheck_added=False)
    g = tiny_mlp()
    g.node("up").inputs = ("tok", "ffn.down.weight")  # no loop, but defined after its reader
    with pytest.raises(LoweringError, match=r"^up: operand 'ffn.down.weight' comes after it"):
        g.lint(recheck_added=False)
    g = tiny_mlp()
    g.lint()
    c = g.copy()  # a copy checks only its new nodes one by one, but every operand list
    c.node("act").inputs = ("nope",)
    with pytest.raises(LoweringError, match=r"^act: operand 'nope' is not a node"):
        c.lint()


def test_lint_catches_edges_that_disagree_with_operands():
    g = tiny_mlp()
    g._g.add_edge("tok", "act", key=1)  # an extra edge the node's operand list does not have
    with pytest.raises(LoweringError, match="act: edges do not match"):
        g.lint()


def test_linear_refuses_operands_of_another_dtype():
    # as the element-wise ops: no implicit cast (a float16 weight times a float32 input)
    g = tiny_mlp()
    w = g.param("ffn.half.weight", (6, 4), "ffn", "normal", "float16")
    with pytest.raises(LoweringError, match=r"^while lowering half \(linear\): operand dtypes "
                                            r"differ: float32\[B, S, 4\], float16\[6, 4\]"):
        g.add("linear", ["tok", w], name="half", scope="ffn")
    b = g.param("ffn.half.bias", (6,), "ffn", "zeros", "bfloat16")
    w32 = g.param("ffn.w32.weight", (6, 4), "ffn", "normal", "float32")
    with pytest.raises(LoweringError, match=r"^while lowering biased \(linear\): operand dtypes"):
        g.add("linear", ["tok", w32, b], name="biased", scope="ffn")
    g = tiny_mlp()
    g.node("ffn.up.weight").type = TensorType((6, 4), "float16")  # corrupted after add
    with pytest.raises(LoweringError, match=r"^up: operand dtypes differ"):
        g.lint()


def test_nx_graph_view_is_read_only():
    view = tiny_mlp().nx_graph
    assert view.number_of_edges("down", "twice") == 2
    with pytest.raises(Exception):
        view.add_node("x")


# ---- memoised results forget a changed graph --------------------------------------------------


def _compiled(name: str = "tiny-decoder.yaml"):  # type: ignore[no-untyped-def]
    import tfgraph
    from tfgraph.spec.loader import load_spec

    from conftest import ROOT, small

    return tfgraph.compile(small(load_spec(ROOT / "specs" / name)))


def test_report_and_plan_follow_a_node_added_after_compile():
    """graph.report() and tfgraph.passes.liveness.plan(graph) are memoised on the graph; a node added
    through the Graph API must invalidate them. Catches a cache that is not cleared on
    ``add`` / ``param`` (the second report would repeat the first one's numbers)."""
    from tfgraph.graph.ir import NodeMeta
    from tfgraph.passes.liveness import plan

    g = _compiled()
    before, plan_before = g.report(batch=2, seq=8), plan(g)
    assert g.report(batch=2, seq=8) == before and plan(g) is plan_before  # memoised
    logits = g.outputs[0]
    vocab = int(g.node(logits).type.shape[-1])
    w = g.param("extra.weight", (vocab, vocab), "extra", "normal", g.dtype,
                meta=NodeMeta(part="head", role="extra.weight"))
    y = g.add("linear", [logits, w], name="extra.proj", scope="extra",
              meta=NodeMeta(part="head", role="extra.proj"))
    g.set_output(y)
    g.lint()
    after, plan_after = g.report(batch=2, seq=8), plan(g)
    assert after["params"] == before["params"] + vocab * vocab
    assert after["memory"]["weights"] == before["memory"]["weights"] + 4 * vocab * vocab
    assert after["flops"]["matmul"] == before["flops"]["matmul"] + 2 * 2 * 8 * vocab * vocab
    assert after["formulas_bst"]["params"] != before["formulas_bst"]["params"]
    assert len(plan_after.steps) == len(plan_before.steps) + 1
    assert plan_after.steps[-1].node.name == "extra.proj"
    assert g.by_meta()[("head", None, None, None, "extra.proj")].name == "extra.proj"


def test_plan_follows_a_new_output():
    """An existing node made a graph output must live to the end of the walk (and count in
    the activation peak); the memoised plan of before must not be reused. Catches
    ``set_output`` not invalidating the memo."""
    from tfgraph.passes.liveness import END, plan

    name = "decoder.layers.0.ffn.up"
    g = _compiled()
    assert plan(g).last_use[name] != END
    peak = g.report(batch=2, seq=8)["memory"]["activations_peak"]
    g.set_output(name)
    fresh = _compiled()
    fresh.set_output(name)  # the same graph, never planned before
    assert plan(fresh).last_use[name] == END
    assert plan(g).last_use[name] == END
    assert g.report(batch=2, seq=8)["memory"]["activations_peak"] == \
        fresh.report(batch=2, seq=8)["memory"]["activations_peak"] > peak


def test_memo_is_per_graph_and_cleared_by_modules():
    g, other = tiny_mlp(), tiny_mlp()
    calls = []
    assert g.memo("k", lambda: calls.append(1) or len(calls)) == 1
    assert g.memo("k", lambda: calls.append(1) or len(calls)) == 1  # cached
    assert other.memo("k", lambda: 42) == 42  # another graph: its own cache
    g.module("ffn", "FeedForward", "doc")
    assert g.memo("k", lambda: calls.append(1) or len(calls)) == 2  # forgotten
    g.add("relu", ["up"], name="again", scope="ffn")
    assert g.memo("k", lambda: calls.append(1) or len(calls)) == 3


def test_tensor_type_dimensions_are_sympy_expressions():
    """The IR's contract: every dimension is a sympy expression; ints are converted, anything
    else refused with a clear error; equal types hash alike (list or tuple, int or Integer)."""
    t = TensorType((2, B, S * 4), "float32")
    assert all(isinstance(d, sympy.Expr) for d in t.shape)
    assert t.shape[0] == sympy.Integer(2) and t.shape[0].is_Integer
    same = TensorType([sympy.Integer(2), B, 4 * S], "float32")
    assert same == t and hash(same) == hash(t) and same.shape == t.shape
    assert t.numel == 8 * B * S and t.nbytes == 32 * B * S
    for bad in (2.0, "S", True, None):
        with pytest.raises(TypeError, match="int or a sympy expression"):
            TensorType((bad, S), "float32")


def test_param_with_int_dimensions_has_sympy_shape():
    g = tiny_mlp()
    assert all(isinstance(d, sympy.Integer) for d in g.node("ffn.up.weight").type.shape)
    assert g.node("ffn.up.weight").attrs["shape"] == (6, 4)  # the attribute stays plain ints


def test_node_meta_in_layer_keeps_every_other_field():
    from tfgraph.graph.ir import NodeMeta

    meta = NodeMeta("layer", "decoder", 3, "ffn", "up", "decoder.layers.3.ffn")
    assert meta.in_layer(0) == NodeMeta("layer", "decoder", 0, "ffn", "up",
                                        "decoder.layers.3.ffn")


def test_builders_read_dimension_names_as_the_irs_symbols():
    from tfgraph.graph.tensor import P

    g = Graph("names")
    g.input("attention_mask", ("B", "P + S"))
    assert g.node("attention_mask").type.shape == (B, P + S)
