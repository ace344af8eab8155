"""Every fact about an op lives with the op (issue 23): its ``OpDef`` in ``tfgraph/ops*.py``,
and each back end keeps one row per op in its own table. This test finds every module-level
op-keyed dict of ``tfgraph`` (its exporters included) and asserts that

(a) each registered back-end table covers every op (``FULL_TABLES``; ``PARTIAL_TABLES`` are
    back-end rows only some ops have, such as an in-place form);
(b) no other op-keyed dict (or tuple, list or set of op names) exists outside
    ``tfgraph/ops*.py`` (a side table a new op would have to join with no test saying so): a
    new one fails here until its facts move into ``OpDef`` or it is registered as a back end's
    own table (or as a collection ``DERIVED`` from ``OpDef``, checked equal to it);
(c) every ``OpDef`` has the fields its kind of op needs filled;

and that ``Graph.add`` checks a node's attributes against its op's declared ``attrs``.
"""

from __future__ import annotations

import importlib
import pkgutil
import types
from collections.abc import Callable, Collection, Mapping
from typing import Any, get_args

import pytest
import sympy

import tfgraph
from tfgraph.graph.ir import Graph, LoweringError
from tfgraph.graph.ops import OPS, Attr, OpDef, SequenceRule, TpRule

OP_MODULES = ("tfgraph.graph.ops", "tfgraph.graph.ops_loss", "tfgraph.graph.ops_moe",
              "tfgraph.graph.ops_latent")
"""Where op facts live (``OPS``, ``NORM_DOCS``, ``NORM_TITLES``, ... are allowed here)."""

# A back end's own row per op: "module.NAME" -> ops it need not cover, with why.
FULL_TABLES: dict[str, frozenset[str]] = {
    "tfgraph.exporters.torch.ops.TORCH_OPS": frozenset(),  # the torch module's kernels
    # model.py's templates: KV-cache ops run only in the module's cached steppers
    "tfgraph.exporters.torch.ops.TORCH_SOURCE": frozenset({"kv_concat", "attention_cached"}),
    "tfgraph.exporters.onnx.ops.ONNX_OPS": frozenset(),  # the ONNX emitters
    # how diagrams draw each op; KV-cache ops are only in cached graphs, never drawn (tfgraph
    # draw, build --to svg and compare pages draw the full graph)
    "tfgraph.exporters.diagram.ops.DIAGRAM_OPS": frozenset({"kv_concat", "attention_cached",
                                                            "cache_rows"}),
}
PARTIAL_TABLES: dict[str, str] = {
    "tfgraph.exporters.torch.ops.TORCH_INPLACE": "the in-place forms of the ops that have one",
    "tfgraph.exporters.onnx.moe.MOE_EMITTERS": "ONNX_OPS' mixture-of-experts rows "
                                               "(merged into it)",
    "tfgraph.parallel.timing.WORK": "the planner's time model of the ops that are not "
                                    "memory-bound (GEMMs, attention cores, experts)",
}
DERIVED: dict[str, Callable[[OpDef], bool]] = {
    # collections of op names computed from OpDef (checked equal to what OpDef says)
    "tfgraph.exporters.torch.ops.NORM_OPS": lambda d: d.category == "norm",
    "tfgraph.parallel.sequence_plan.ELEMENTWISE_OPS": lambda d: d.sequence == "elementwise",
}
NOT_OP_KEYED: dict[str, str] = {
    # keys that happen to be op names but name something else
    "tfgraph.hf.export_common._PLAIN": "keyed by the spec's ffn.activation (Hugging Face "
                                       "names), not by op",
}


def _modules() -> list[types.ModuleType]:
    """tfgraph's modules and its exporters' (a package of its own folder, exporters/)."""
    mods = [tfgraph]
    for package in ("tfgraph", "tfgraph.exporters"):
        root = importlib.import_module(package)
        mods.append(root)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            mods.append(importlib.import_module(info.name))
    return mods


def op_keyed_tables(min_keys: int = 3) -> list[list[str]]:
    """Every module-level dict of tfgraph whose keys are op names (at least ``min_keys``), or
    tuple, list or set of op names: for each, the "module.NAME"s it is reached by (its
    definition and any re-exports)."""
    names = set(OPS)
    found: dict[int, list[str]] = {}
    for mod in _modules():
        for attr, value in vars(mod).items():
            if not isinstance(value, (Mapping, tuple, list, set, frozenset)) \
                    or len(value) < min_keys:
                continue
            keys = list(value)
            if all(isinstance(k, str) for k in keys) and set(keys) <= names:
                found.setdefault(id(value), []).append(f"{mod.__name__}.{attr}")
    return [sorted(wheres) for wheres in found.values()]


def _table(where: str) -> Any:
    module, _, name = where.rpartition(".")
    return getattr(importlib.import_module(module), name)


def missing_rows() -> list[str]:
    """"TABLE: op" for each op a full back-end table lacks, or has but is no op."""
    out = []
    for where, exempt in FULL_TABLES.items():
        table = _table(where)
        out += [f"{where}: no row for {op}" for op in sorted(set(OPS) - exempt - set(table))]
        out += [f"{where}: row for {op}, which is no op" for op in sorted(set(table) - set(OPS))]
    return out


def side_tables() -> list[str]:
    """Op-keyed dicts that are neither in the op modules nor a registered back-end table."""
    known = set(FULL_TABLES) | set(PARTIAL_TABLES) | set(DERIVED) | set(NOT_OP_KEYED)
    ops_prefix = tuple(m + "." for m in OP_MODULES)
    return sorted(wheres[0] for wheres in op_keyed_tables()
                  if not any(w in known or w.startswith(ops_prefix) for w in wheres))


def test_backend_tables_cover_every_op() -> None:
    assert missing_rows() == []


def test_registered_tables_exist() -> None:
    found = {w for wheres in op_keyed_tables(min_keys=1) for w in wheres}
    for where in (*FULL_TABLES, *PARTIAL_TABLES, *DERIVED, *NOT_OP_KEYED):
        assert where in found, f"{where} is registered but is no op-keyed dict"


def test_partial_tables_have_rows_only_for_ops() -> None:
    """A misspelt row of a partial table would leave its op on the table's default."""
    for where in PARTIAL_TABLES:
        assert set(_table(where)) <= set(OPS), where


def test_derived_collections_are_what_opdef_says() -> None:
    for where, says in DERIVED.items():
        value: Collection[str] = _table(where)
        assert set(value) == {op for op, d in OPS.items() if says(d)}, where


def test_no_side_tables() -> None:
    assert side_tables() == [], (
        "op-keyed tables outside tfgraph/ops*.py: move the fact into OpDef, or register a "
        "back end's own table in tests/test_op_tables.py")


def test_checker_reports_a_removed_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfgraph.exporters.onnx import ops as onnx_ops

    from tfgraph.exporters.diagram import ops as diagram_ops
    from tfgraph.exporters.torch import ops as torch_ops
    monkeypatch.delitem(torch_ops.TORCH_OPS, "relu")
    monkeypatch.delitem(onnx_ops.ONNX_OPS, "rope")
    monkeypatch.delitem(diagram_ops.DIAGRAM_OPS, "softcap")
    assert missing_rows() == ["tfgraph.exporters.torch.ops.TORCH_OPS: no row for relu",
                              "tfgraph.exporters.onnx.ops.ONNX_OPS: no row for rope",
                              "tfgraph.exporters.diagram.ops.DIAGRAM_OPS: no row for softcap"]


def test_checker_reports_a_new_side_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfgraph.exporters.diagram import labels as diagram_labels
    from tfgraph.parallel import placement

    monkeypatch.setattr(placement, "_FOLLOWS", ("rope", "add", "mul"), raising=False)
    monkeypatch.setattr(diagram_labels, "POSITION_TEXT",
                        {"positions_sinusoidal": "", "positions_learned": "",
                         "relative_bias": ""}, raising=False)
    assert side_tables() == ["tfgraph.exporters.diagram.labels.POSITION_TEXT",
                             "tfgraph.parallel.placement._FOLLOWS"]


# ---- (c) every OpDef filled where its kind needs it ---------------------------------------


def test_opdef_fields_filled() -> None:
    for name, op in OPS.items():
        lo, hi = op.arity
        assert op.name == name
        assert op.tp in get_args(TpRule), name
        assert op.sequence in get_args(SequenceRule), name
        assert (op.tp == "split_param") == (op.tp_split_param is not None), (
            f"{name}: a split_param op names the parameter operand it splits, and only it")
        if op.tp_split_param is not None:
            assert op.tp_split_param[0] < hi, name
        assert all(i < hi for i in op.shape_only), name
        assert all(i < hi for i in op.no_grad), name
        assert op.vocab_reduce in (None, "R", "S"), name
        if op.category in ("norm", "activation") and name != "route":
            assert op.title, f"{name}: diagrams need its title"
        if op.score_bias or op.sequence == "positions":
            assert op.diagram_text is not None, f"{name}: diagrams need its words"
            op.diagram_text({k: a.default if a.default is not None else 1
                             for k, a in op.attrs.items()})
        if op.score_bias:
            # a bias on the scores has no gradient into the stream it reads for its length,
            # and tensor parallelism must say how it splits or that it is refused
            assert op.shape_only, name
            assert op.tp == "split_param" or op.tp_refused, name
        if op.score_flops or op.score_temp or op.kv_cached or op.unfused_saved:
            # an attention core: q, k, v operands, heads and the causal / window mask
            assert op.category == "attention" and lo >= 3, name
            assert {"heads", "head_dim", "causal", "window"} <= set(op.attrs), name
        if op.unfused_saved is not None:
            assert op.score_sized, f"{name}: its explicit form keeps score-sized buffers"
        if op.routed:
            # x, routing weights, stacked weights; the all-experts FLOPs of the dense form;
            # split on the hidden units under tensor parallelism
            assert lo >= 3 and "top_k" in op.attrs, name
            assert op.dense_flops is not None and op.tp == "project_hidden", name
        if op.loss:
            # a scalar from vocabulary logits: reduced across vocabulary-split ranks to a
            # whole value, and its backward's scratch stated
            assert op.category == "output" and op.vocab_reduce == "R", name
            assert op.backward_temp is not None, name
        for key, attr in op.attrs.items():
            assert isinstance(attr, Attr), (name, key)
            assert not (attr.required and attr.default is not None), (name, key)
        assert op.doc, name


def test_position_kinds_have_records() -> None:
    from tfgraph.spec.schema import POSITION_KINDS, Positions

    assert set(POSITION_KINDS) == set(get_args(Positions))
    for kind, record in POSITION_KINDS.items():
        assert record.learned or record.extrapolates, kind


# ---- typed attributes ------------------------------------------------------------------------


def _graph() -> tuple[Graph, str]:
    g = Graph("t")
    x = g.input("x", (2, 3, 4), "float32")
    return g, x


def test_unknown_attribute_refused() -> None:
    g, x = _graph()
    with pytest.raises(LoweringError, match=r"while lowering act \(relu\): unknown attribute "
                                            r"'p' \(the op takes: none\)"):
        g.add("relu", [x], name="act", scope="s", p=0.1)


def test_missing_required_attribute_refused() -> None:
    g, x = _graph()
    with pytest.raises(LoweringError, match=r"while lowering drop \(dropout\): missing "
                                            r"attribute 'p'"):
        g.add("dropout", [x], name="drop", scope="s")


def test_attribute_of_wrong_type_refused() -> None:
    g, x = _graph()
    with pytest.raises(LoweringError, match=r"while lowering cap \(softcap\): attribute "
                                            r"'cap' is str '3', not int or float"):
        g.add("softcap", [x], name="cap", scope="s", cap="3")


def test_sizes_accept_symbolic_expressions() -> None:
    g = Graph("t")
    h = sympy.Symbol("h", positive=True, integer=True)
    x = g.input("x", (2, 3, 4 * h), "float32")
    g.add("rope", [x], name="rope", scope="s", heads=h, head_dim=4, theta=10000.0)
    g.add("scale", [x], name="scale", scope="s", factor=sympy.sqrt(h))


# ---- a new position op is its OpDef (ALiBi-like: a per-head score bias, no parameter) -----


def test_a_new_score_bias_op_needs_only_its_opdef(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering a score-bias op's OpDef is enough for the training walk (no gradient into
    the operand it reads for its length), tensor parallelism's refusals (parallelize and
    model.py) and the attribute check; nothing else names it."""
    from tfgraph.exporters.torch.parallel import _check_tensor_parallel
    from tfgraph.exporters.torch.source_parallel import _refusals
    from tfgraph.errors import TfgraphError
    from tfgraph.graph.tensor import TensorType
    from tfgraph.passes.train_walk import _grad_inputs

    def infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        return TensorType((attrs["heads"], ins[0].shape[1], ins[0].shape[1]), ins[0].dtype)

    relative = OPS["relative_bias"]
    monkeypatch.setitem(OPS, "fake_alibi", OpDef(
        "fake_alibi", (1, 1), infer, relative.flops, lambda i, o, a: [],
        "a per-head linear bias on the scores", category="position",
        attrs={"heads": Attr(int, required=True)}, tp_refused="ALiBi", shape_only=(0,),
        score_bias=True, diagram_text=lambda attrs: f"ALiBi ({attrs['heads']} slopes)"))
    g = Graph("t")
    x = g.input("x", (2, 3, 4), "float32")
    with pytest.raises(LoweringError, match="missing attribute 'heads'"):
        g.add("fake_alibi", [x], name="nope", scope="s")
    bias = g.add("fake_alibi", [x], name="bias", scope="s", heads=2)
    assert _grad_inputs(g, g.node(bias)) == []
    assert _refusals(g) == ["ALiBi is not split"]
    with pytest.raises(TfgraphError, match=r"tensor parallelism: bias \(fake_alibi\) has no "
                                           r"tensor-parallel form \(ALiBi is not split"):
        _check_tensor_parallel(g, 2)
    test_opdef_fields_filled()


# ---- passes and back ends read OpDef, not op names ------------------------------------------


def test_new_attention_moe_and_loss_ops_need_only_their_opdefs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ops registered under new names, with the OpDef fields of attention, routed experts and
    the loss, are found by the figures, the training walk and the planner's units: no pass
    names them."""
    import dataclasses

    from tfgraph.parallel.units import units
    from tfgraph.passes import cost, effective, figures, train_walk

    for op in ("attention", "experts", "cross_entropy"):
        monkeypatch.setitem(OPS, f"new_{op}", dataclasses.replace(OPS[op], name=f"new_{op}"))
    g = Graph("t")
    x = g.input("x", (2, 16, 8), "float32")  # 8 heads of 16 x 16 scores: the peak
    att = g.add("new_attention", [x, x, x], name="att", scope="s", heads=8, kv_heads=8,
                head_dim=1, causal=True, normalize="softmax", kind="self")
    route = g.input("route", (2, 16, 2), "float32")
    up = g.param("up", (2, 6, 8), "s", "normal", "float32")
    down = g.param("down", (2, 8, 6), "s", "normal", "float32")
    moe = g.add("new_experts", [att, route, up, down], name="moe", scope="s", top_k=1,
                activation="relu", gated=False)
    head = g.param("head", (5, 8), "s", "normal", "float32")
    logits = g.add("linear", [moe, head], name="logits", scope="s")
    labels = g.input("labels", (2, 16))
    g.set_output(g.add("new_cross_entropy", [logits, labels], name="loss", scope="s"))
    g.lint()

    assert train_walk.loss_node(g).name == "loss"
    assert train_walk.loss_graph(g) is g
    assert [n.name for n in cost.routed_experts(g)] == ["moe"]
    assert cost.inactive_params(g) == 2 * 6 * 8  # one of the two experts' up and down
    sym = figures.symbolic(g)
    assert "attention_scores" in sym["flops_by_kind"] and "params_active" in sym
    assert effective.read_fraction(g, "att") is not None
    assert sym["flops"]["causal_effective_matmul"] != sym["flops"]["matmul"]
    # the score matrix: scratch unless fused, and again in the scores' backward
    plain, fused = (train_walk.train_peak(g, {}, fused_attention=f) for f in (False, True))
    assert plain.bytes > fused.bytes
    built, _, _ = units(g)
    assert sum(u.attention_flops != 0 for u in built) == 1
    assert sum(u.a2a != 0 for u in built) == 1
    assert sum(u.output_grad != 0 for u in built) == 1


OP_NAME_TESTS: dict[str, str] = {
    # modules that may compare a node's op with an op's name: a back end's own lowering of
    # particular ops, with why
    "exporters/onnx/fused_attention.py": "matches the subgraph attention_cached(rope(linear), "
                                         "kv_concat(...)) it rewrites into one ONNX Attention",
    "exporters/onnx/skip_norm.py": "matches the subgraph rmsnorm(add) it rewrites into one "
                                   "onnxruntime SkipSimplifiedLayerNormalization",
    "exporters/torch/module.py": "rope's torch kernel takes the model's shared cos/sin "
                                 "tables as an extra operand (rope_tables_step)",
    "exporters/torch/sequence_parallel.py": "the torch functions a rank's learned or "
                                            "sinusoidal position rows come from",
}


def op_name_tests() -> list[str]:
    """"path:line" of each comparison of a node's ``.op`` with a registered op's name (==,
    !=, in, not in a literal) outside the op modules and ``OP_NAME_TESTS``; comparisons with
    "param" and "input" (graph structure: no OpDef) are not op facts."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for path in sorted([*root.glob("tfgraph/**/*.py"), *root.glob("exporters/**/*.py")]):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("tfgraph/graph/ops") or rel in OP_NAME_TESTS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if not any(isinstance(e, ast.Attribute) and e.attr == "op" for e in sides):
                continue
            names = {c.value for e in sides for c in ast.walk(e)
                     if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            if names & set(OPS):
                found.append(f"{rel}:{node.lineno}")
    return found


def test_no_op_name_tests_outside_op_modules() -> None:
    assert op_name_tests() == [], (
        "a pass or back end tests op names: state the fact as an OpDef field (ops.py) and "
        "read it, or register a back end's own lowering in OP_NAME_TESTS")


def test_op_name_checker_reports_an_unregistered_module(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.delitem(OP_NAME_TESTS, "exporters/torch/sequence_parallel.py")
    found = op_name_tests()
    assert len(found) == 1 and found[0].startswith("exporters/torch/sequence_parallel.py:")
