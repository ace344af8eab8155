"""The Python API refuses bad arguments at its entry with a TfgraphError (a SpecError for a
spec) naming the argument or field, never an error from deep inside (README, "Exit status"):
``compile`` of a Spec changed after it was built, ``plan``/``staged``/``search`` of a KV-cache
graph, of a graph in another precision than the layout, with impossible counts or a GPU name,
``to_torch``/``to_onnx``/``compare`` given paths, and ``to_onnx``'s opset types."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tfgraph
from tfgraph.errors import SpecError, TfgraphError
from tfgraph.parallel.gpus import gpu
from tfgraph.parallel.layout import Layout
from tfgraph.parallel.planner import plan, staged
from tfgraph.parallel.search import search
from tfgraph.passes.compare import compare

SPECS = Path(__file__).resolve().parent.parent / "specs"
LLAMA = SPECS / "tiny-llama.yaml"
LAYOUT = Layout(global_batch=4, seq=32)  # trains in bfloat16


@pytest.fixture(scope="module")
def spec() -> tfgraph.Spec:
    return tfgraph.load_spec(LLAMA)


@pytest.fixture(scope="module")
def train(spec: tfgraph.Spec) -> tfgraph.compiler.CompiledGraph:
    """tiny-llama's training graph at the layout's precision, as ``tfgraph plan`` compiles it."""
    return tfgraph.compile(spec.model_copy(update={"dtype": "bfloat16"}), loss=True)


# ---- 1. compile checks a Spec object again ---------------------------------------------------

@pytest.mark.parametrize("update, message", [
    ({"layers": 0}, "layers: must be >= 1 (got 0)"),
    ({"d_model": 0}, "d_model: must be >= 1 (got 0)"),
    ({"vocab": -5}, "vocab: must be >= 1 (got -5)"),
    ({"dtype": "float8"}, "dtype: must be one of 'float32', 'float16' or 'bfloat16' "
                          "(got 'float8')"),
])
def test_compile_refuses_a_changed_spec_as_its_file(spec: tfgraph.Spec, update: dict,
                                                    message: str) -> None:
    changed = spec.model_copy(update=update)  # pydantic does not validate model_copy
    with pytest.raises(SpecError) as from_file:
        tfgraph.parse_spec(tfgraph.dump_spec(changed))
    assert f"{from_file.value.path}: {from_file.value.message}" == message
    with pytest.raises(SpecError) as compiled:
        tfgraph.compile(changed)
    assert str(compiled.value) == message  # the file's words, without its line and column


def test_compile_refuses_attribute_assignment_and_checks_cross_field_rules() -> None:
    spec = tfgraph.load_spec(LLAMA)
    spec.d_model = 0
    with pytest.raises(SpecError, match=r"^d_model: must be >= 1 \(got 0\)$"):
        tfgraph.compile(spec)
    spec = tfgraph.load_spec(LLAMA)
    spec.attention.kv_heads = 3  # each field valid, the rule between them not
    with pytest.raises(SpecError) as refused:
        tfgraph.compile(spec)
    with pytest.raises(SpecError) as from_file:
        tfgraph.parse_spec(tfgraph.dump_spec(spec))
    first = from_file.value.problems[0]
    assert str(refused.value).split(" [")[0] == f"{first.path}: {first.message}"
    assert "kv_heads" in str(refused.value)


def test_compile_takes_a_valid_changed_spec_and_no_other_argument(spec: tfgraph.Spec) -> None:
    # a dict where a model was (pydantic's model_copy keeps it as given): validated into one
    graph = tfgraph.compile(spec.model_copy(update={"attention": {"heads": 4}}))
    assert graph.spec is not None and graph.spec.attention.kv_heads == 4
    assert tfgraph.compile(spec.model_copy(update={"layers": 3})).report()["params"] > \
        tfgraph.compile(spec).report()["params"]
    with pytest.raises(TfgraphError, match="^spec: expected a tfgraph.Spec or the path"):
        tfgraph.compile(3)  # type: ignore[arg-type]


def test_the_check_returns_an_equal_copy_of_the_largest_spec() -> None:
    """The re-check gives back an equal Spec (its cost: pydantic's validation, about 0.15 ms on
    this spec; timed by hand, not here: a timed unit test is noise on a shared machine)."""
    from tfgraph.spec.recheck import rechecked

    big = tfgraph.load_spec(SPECS / "llama-3.1-405b.yaml")
    again = rechecked(big)
    assert again == big and again is not big


# ---- 2., 3. plan, staged and search refuse what they do not cover -----------------------------

@pytest.mark.parametrize("name, part", [("tiny-llama", None), ("tiny-bart", "decoder")])
def test_plan_refuses_a_kv_cache_graph(name: str, part: str | None) -> None:
    spec = tfgraph.load_spec(SPECS / f"{name}.yaml").model_copy(update={"dtype": "bfloat16"})
    cached = tfgraph.compile(spec, cache=True, part=part)
    words = "not the KV-cache" + (f" {part}" if part else "") + " graph"
    for call in (lambda: staged(cached, LAYOUT), lambda: plan(cached, LAYOUT, gpu("h100")),
                 lambda: search(cached, 2, LAYOUT, gpu("h100"))):
        with pytest.raises(TfgraphError, match=words):
            call()


def test_plan_refuses_two_precisions(spec: tfgraph.Spec, train: tfgraph.Graph) -> None:
    float32 = tfgraph.compile(spec, loss=True)  # the spec's own dtype
    assert float32.dtype == "float32"
    for call in (lambda: plan(float32, LAYOUT, gpu("h100")), lambda: staged(float32, LAYOUT),
                 lambda: search(float32, 2, LAYOUT, gpu("h100"))):
        with pytest.raises(TfgraphError) as refused:
            call()
        text = str(refused.value)
        assert "float32" in text and "bfloat16" in text and "Layout(dtype='float32')" in text
    # either way out of it plans, each in one precision
    ours = plan(float32, Layout(global_batch=4, seq=32, dtype="float32"), gpu("h100"))
    theirs = plan(train, LAYOUT, gpu("h100"))
    ratio = ours["per_rank"]["memory"]["activations"] / theirs["per_rank"]["memory"][
        "activations"]
    assert ours["per_rank"]["memory"]["weights"] == 2 * theirs["per_rank"]["memory"]["weights"]
    assert 1.2 < ratio <= 2  # float32 activations (some, the loss's, float32 in both)


# ---- 4., 5. search's counts and base layout; argument types -----------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"top": -1}, "^top must be a positive integer, got -1$"),
    ({"top": 0}, "^top must be a positive integer, got 0$"),
    ({"top": 2.5}, "^top must be a positive integer, got float 2.5$"),
    ({"gpus": 0}, "^gpus must be a positive integer, got 0$"),
    ({"gpus": "2"}, "^gpus must be a positive integer, got str '2'$"),
    ({"gpus": True}, "^gpus must be a positive integer, got bool True$"),
    ({"base": Layout(tp=2, global_batch=4, seq=32)}, "^base: search chooses tp itself"),
    ({"base": Layout(zero=1, micro_batch=2, global_batch=4, seq=32)},
     "^base: search chooses zero, micro_batch itself"),
    ({"gpu": "h100"}, r"^gpu: expected a Gpu \(tfgraph.parallel.gpus.gpu\('h100'\)\), got str$"),
])
def test_search_refuses_impossible_arguments(train: tfgraph.Graph, kwargs: dict,
                                             message: str) -> None:
    args = {"gpus": 2, "base": LAYOUT, "gpu": gpu("h100"), **kwargs}
    with pytest.raises(TfgraphError, match=message):
        search(train, **args)


def test_search_takes_numpy_counts(train: tfgraph.Graph) -> None:
    found = search(train, np.int64(2), LAYOUT, gpu("h100"), top=np.int32(3))
    assert len(found) == 3 and all(p["layout"]["gpus"] == 2 for p in found)


def test_public_functions_refuse_a_path_for_a_graph(train: tfgraph.Graph) -> None:
    from tfgraph.exporters.onnx.model import to_onnx, write_onnx
    from tfgraph.exporters.torch.module import to_torch

    expected = r"^graph: expected a compiled graph \(tfgraph.compile\(spec or path\)\), got str"
    for call in (lambda: to_torch(str(LLAMA)), lambda: to_onnx(str(LLAMA)),  # type: ignore
                 lambda: write_onnx(LLAMA, "unused.onnx"),  # type: ignore[arg-type]
                 lambda: plan(str(LLAMA), LAYOUT, gpu("h100"))):  # type: ignore[arg-type]
        with pytest.raises(TfgraphError, match=expected.replace("got str", "got")):
            call()
    with pytest.raises(TfgraphError, match=r"^gpu: expected a Gpu .*gpu\('h100'\)"):
        plan(train, LAYOUT, "h100")  # type: ignore[arg-type]
    with pytest.raises(TfgraphError, match=r"^layout: expected a .*Layout, got dict"):
        plan(train, {"tp": 1}, gpu("h100"))  # type: ignore[arg-type]
    with pytest.raises(TfgraphError, match=r"^graphs\[1\]: expected a compiled graph"):
        compare([train, str(LLAMA)])  # type: ignore[list-item]
    with pytest.raises(TfgraphError, match="^graphs: expected a list of compiled graphs"):
        compare(str(LLAMA))  # type: ignore[arg-type]


# ---- 6. to_onnx's opset ----------------------------------------------------------------------

def test_onnx_opset_numpy_int_and_wrong_types(spec: tfgraph.Spec) -> None:
    from tfgraph.exporters.onnx.model import to_onnx

    graph = tfgraph.compile(spec.model_copy(update={"layers": 1}))
    model = to_onnx(graph, opset=np.int64(17))  # type: ignore[arg-type]
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]
    for bad, words in (("23", "str '23'"), (17.0, "float 17.0"), (True, "a bool")):
        with pytest.raises(TfgraphError, match=f"^opset must be an integer, got {words}"):
            to_onnx(graph, opset=bad)  # type: ignore[arg-type]
    with pytest.raises(TfgraphError, match="^opset 16 is not supported: choose 17..23"):
        to_onnx(graph, opset=16)
