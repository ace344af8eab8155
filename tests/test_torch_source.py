"""model.py (``tfgraph build --to torch``) is rendered from the op graph and computes exactly
what ``to_torch`` computes: the same outputs in eval and training mode (same dropout masks for
the same RNG state), the same gradients and the same state_dict keys, for every spec in specs/.
User text reaches the file only as escaped docstring text.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import sympy
import torch

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch.folder import write_torch_folder
from tfgraph.exporters.torch.ops import TORCH_SOURCE
from tfgraph.exporters.torch.render_spelling import axis_of, literal, spell, value_axes
from tfgraph.exporters.torch.source import docstring, generate_source, wrap
from tfgraph.graph.ir import B, S, Graph, ModuleInfo
from tfgraph.spec.loader import load_spec
from tfgraph.graph.ops import OPS
from tfgraph.spec.schema import Spec

from conftest import ROOT, SPEC_FILES, small
from test_torch_module import make_ids

HOSTILE = ('"""\nopen("pwned.txt", "w").write("x")\n"""' + " ''' \\ \\n \r\n \u2028 \u2029 "
           "\x00 \x1b[2J\x1b]0;title\x07 \u202e tail\\")


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"model_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with(spec: Spec, **changes: object) -> Spec:
    return Spec.model_validate({**spec.model_dump(), **changes})


def _variants(path: Path) -> list[Spec]:
    """The spec at tiny sizes, and with dropout when it has none (so training mode differs)."""
    spec = small(load_spec(path))
    return [spec] if spec.dropout > 0 else [spec, _with(spec, dropout=0.25)]


def _generated(graph: Graph, folder: Path, seed: int) -> torch.nn.Module:
    write_torch_folder(graph, folder, None, seed=seed)
    net: torch.nn.Module = _import(folder / "model.py").load(str(folder))
    return net


def _run(net: torch.nn.Module, ids: tuple[torch.Tensor, ...], seed: int) -> torch.Tensor:
    torch.manual_seed(seed)  # the dropout masks
    out: torch.Tensor = net(*ids)
    return out


def _exact(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype, what
    torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m: f"{what}: {m}")


def _check_against_to_torch(graph: Graph, folder: Path) -> None:
    ref = to_torch(graph, seed=4)
    net = _generated(graph, folder, seed=4)
    assert list(net.state_dict()) == list(ref.state_dict())
    ids = make_ids(graph, 2, 7, 5)
    with torch.no_grad():
        evaluated = ref(*ids)
        _exact(net(*ids), evaluated, "eval")
    ref.train()
    net.train()
    want, got = _run(ref, ids, 11), _run(net, ids, 11)
    _exact(got, want, "train")
    if any(node.op == "dropout" for node in graph.ops()):
        assert not torch.equal(want, evaluated), "dropout was not active in training mode"
    weights = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    (want.float() * weights).sum().backward()  # a loss every output element reaches
    (got.float() * weights).sum().backward()
    grads = dict(net.named_parameters())
    for name, param in ref.named_parameters():
        got_grad = grads[name].grad
        if param.grad is None:  # hard attention's q and k: the arg-max has no gradient
            assert got_grad is None, name
        else:
            assert got_grad is not None, name
            _exact(got_grad, param.grad, f"gradient of {name}")


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.stem for p in SPEC_FILES])
def test_generated_model_matches_to_torch(path: Path, tmp_path: Path) -> None:
    for i, spec in enumerate(_variants(path)):
        _check_against_to_torch(tfgraph.compile(spec), tmp_path / str(i))


def test_every_op_has_a_source_template() -> None:
    """Every op of a full-sequence graph; the KV-cache graph's own ops are not rendered."""
    from tfgraph.exporters.torch.ops import CACHE_OPS

    assert set(TORCH_SOURCE) == set(OPS) - CACHE_OPS, (
        f"missing: {sorted(set(OPS) - CACHE_OPS - set(TORCH_SOURCE))}, "
        f"unknown: {sorted(set(TORCH_SOURCE) - set(OPS))}")
    with pytest.raises(TfgraphError, match="full-sequence"):
        generate_source(tfgraph.compile(ROOT / "specs" / "tiny-llama.yaml", cache=True))


def test_reads_the_graph_not_the_spec(tmp_path: Path) -> None:
    """What model.py computes is the graph: a change no spec can express (layer 1 of the
    encoder with its own norm eps and dropout) shows up, and the spec is not needed."""
    spec = small(load_spec(ROOT / "specs" / "tiny-seq2seq.yaml"))
    graph = tfgraph.compile(spec)
    for node in graph.ops():
        if node.meta.stack == "encoder" and node.meta.layer == 1:
            if node.op == "layernorm":
                node.attrs["eps"] = 0.5
            if node.op == "dropout":
                node.attrs["p"] = 0.6
    source = generate_source(graph)
    assert "eps=0.5" in source and "p=0.6" in source
    _check_against_to_torch(graph, tmp_path / "edited")
    graph.spec = None  # nothing of the file comes from the spec; the description from info
    graph.info = dataclasses.replace(graph.info, description="")
    plain = tfgraph.compile(_with(spec, description=""))
    for node in plain.ops():
        node.attrs.update(graph.node(node.name).attrs)
    assert generate_source(graph) == generate_source(plain)


def test_a_graph_built_by_hand(tmp_path: Path) -> None:
    """Ops in an order no spec lowers to, and no declared modules: one Model class."""
    graph = Graph("hand")
    graph.sizes = {"d_model": 8, "vocab": 11}
    ids = graph.input("input_ids", (B, S))
    table = graph.param("embed.tokens.weight", (11, 8), "embed", "normal", "float32",
                        dims=("vocab", "d_model"))
    x = graph.add("embedding", [table, ids], name="tokens", scope="embed")
    x = graph.add("scale", [x], name="scale", scope="embed", factor=2.5)
    x = graph.add("gelu_tanh", [x], name="act", scope="embed")
    w = graph.param("head.weight", (11, 8), "head", "normal", "float32", dims=("vocab", "d_model"))
    b = graph.param("head.bias", (11,), "head", "zeros", "float32", dims=("vocab",))
    x = graph.add("linear", [x, w, b], name="logits", scope="head")
    graph.set_output(graph.add("softmax", [x], name="probs", scope="head"))
    graph.lint()
    (tmp_path / "model.py").write_text(generate_source(graph))
    net = _import(tmp_path / "model.py").Model()
    ref = to_torch(graph, seed=1)
    net.load_state_dict(ref.state_dict())
    ids_in = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _exact(net(ids_in), ref(ids_in), "hand-built graph")


def test_any_symbol_of_a_shape_is_spelled() -> None:
    """Shape comments name every symbol a shape holds, not only B, S and T: a symbol of its
    own, an expression over symbols (each symbol spelled), a number as it is."""
    p, n = sympy.Symbol("P", integer=True, nonnegative=True), sympy.Symbol("N", positive=True)
    name = {"P": "<P>", "S": "<S>", "N": "<N>"}.__getitem__
    assert spell(axis_of(n), name) == "<N>"
    assert spell(axis_of(p + S), name) == "<P> + <S>"
    assert spell(axis_of(2 * n), name) == "2*<N>"
    assert spell(axis_of(4096), name) == "4096"


def test_a_shape_with_a_new_symbol_renders_in_model_py(tmp_path: Path) -> None:
    """A graph whose input has an axis no spec lowers to (N) and integer dimensions: the
    axes are named in the comments and model.py runs."""
    n = sympy.Symbol("N", positive=True, integer=True)
    graph = Graph("new-axis")
    graph.sizes = {"d_model": 8, "vocab": 11}
    ids = graph.input("input_ids", (B, n))
    table = graph.param("embed.tokens.weight", (11, 8), "embed", "normal", "float32",
                        dims=("vocab", "d_model"))
    x = graph.add("embedding", [table, ids], name="tokens", scope="embed")
    graph.set_output(graph.add("linear", [x, table], name="logits", scope="head"))
    graph.lint()
    axes = value_axes(graph, graph.sizes)
    assert [a.text for a in axes["logits"]] == ["B", "N", "V"]
    source = generate_source(graph)
    assert "(B, N, V)" in source
    (tmp_path / "model.py").write_text(source)
    net = _import(tmp_path / "model.py").Model()
    net.load_state_dict(to_torch(graph, seed=1).state_dict())
    with torch.no_grad():
        assert net(torch.zeros((2, 3), dtype=torch.long)).shape == (2, 3, 11)


def test_layers_share_a_class_and_configuration_is_an_argument() -> None:
    source = generate_source(tfgraph.compile(small(load_spec(ROOT / "specs" / "base.yaml"))))
    tree = ast.parse(source)
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert classes == ["SelfAttention", "FeedForward", "CrossAttention", "EncoderLayer",
                       "DecoderLayer", "Encoder", "Decoder", "Model"]
    assert "def __init__(self, causal: bool) -> None:" in source
    assert "SelfAttention(causal=False)" in source and "SelfAttention(causal=True)" in source
    assert "nn.ModuleList(EncoderLayer() for _ in range(ENCODER_LAYERS))" in source
    assert "for layer in self.layers:" in source
    assert "D_MODEL = 32  # d" in source and "HEADS * HEAD_DIM" in source
    # Only the kernels the graph's ops call are copied in.
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert functions == {"sinusoidal_positions", "attention", "explicit_attention",
                         "attention_mask", "soft_cap", "dropout", "tied_head", "load",
                         "init_weights", "check_tp", "parallelize"}  # TP_PLAN's; tied head


def test_learned_positions_past_max_len_name_it(tmp_path: Path) -> None:
    graph = tfgraph.compile(small(load_spec(ROOT / "specs" / "tiny-decoder.yaml")))
    net = _generated(graph, tmp_path / "m", seed=0)
    assert graph.spec is not None and graph.spec.max_len is not None
    ids = torch.zeros(1, graph.spec.max_len + 1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="max_len"):
        net(ids)


def _module_level(tree: ast.Module) -> list[str]:
    """Kinds of module-level statements other than imports, definitions and constants."""
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
    odd = []
    for node in tree.body[1:]:
        if isinstance(node, ast.Assign) and all(
                isinstance(t, ast.Name) and t.id.isupper() for t in node.targets):
            continue
        if not isinstance(node, allowed):
            odd.append(ast.dump(node)[:80])
    return odd


def test_hostile_text_stays_in_the_docstring(tmp_path: Path) -> None:
    spec = _with(small(load_spec(ROOT / "specs" / "tiny.yaml")), description=HOSTILE)
    graph = tfgraph.compile(spec)
    graph.name = HOSTILE
    graph.modules[""] = ModuleInfo("", "Model", HOSTILE)
    source = generate_source(graph)
    assert all(ch == "\n" or ch.isprintable() for ch in source), "raw control characters"
    tree = ast.parse(source)
    assert isinstance(tree.body[0], ast.Expr)
    assert HOSTILE in (ast.get_docstring(tree, clean=False) or "")
    assert _module_level(tree) == []
    model = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"][0]
    assert ast.get_docstring(model, clean=False) == HOSTILE
    # A fresh process imports it: nothing runs at import, and the docstring round-trips.
    (tmp_path / "model.py").write_text(source, encoding="utf-8")
    (tmp_path / "expected.json").write_text(json.dumps(HOSTILE))
    child = ("import importlib.util, json, sys\n"
             "spec = importlib.util.spec_from_file_location('m', 'model.py')\n"
             "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
             "expected = json.load(open('expected.json'))\n"
             "assert expected in m.__doc__ and m.Model.__doc__ == expected\n"
             "m.Model()\n")
    result = subprocess.run([sys.executable, "-I", "-c", child], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (tmp_path / "pwned.txt").exists()


@pytest.mark.parametrize("text", [HOSTILE, '"', '""', "\\", "a\"b'c", "\u2028", "\ud800",
                                  "", "trailing \"", "\x1b[31mred"])
def test_literals_and_docstrings_escape_everything(text: str) -> None:
    assert ast.literal_eval(literal(text)) == text
    assert all(ch.isprintable() for ch in literal(text))
    body = docstring(text)
    assert all(ch == "\n" or ch.isprintable() for ch in body)
    assert ast.literal_eval(f'"""{body}"""') == text


def test_long_lines_wrap_at_commas_outside_strings() -> None:
    line = ('h = attention(q, k, v, HEADS, KV_HEADS, HEAD_DIM, causal=self.causal, '
            'normalize="a, b  # c, (d", impl=ATTENTION_IMPL)  # (B, L, h*hd)')
    lines = wrap(line, 8)
    assert len(lines) == 2 and all(len(x) <= 99 for x in lines)
    assert lines[-1].endswith("  # (B, L, h*hd)")
    joined = textwrap.dedent("\n".join(lines))
    assert ast.dump(ast.parse(joined)) == ast.dump(ast.parse(line))


# ---- model.py stands alone (issue 15, item 7) ----------------------------------------------


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_model_py_passes_pyflakes_and_resolves_its_type_hints(path: Path, tmp_path: Path) -> None:
    from pyflakes.api import check
    from pyflakes.reporter import Reporter
    import io
    import typing

    source = generate_source(tfgraph.compile(small(load_spec(path))))
    out, err = io.StringIO(), io.StringIO()
    problems = check(source, "model.py", Reporter(out, err))
    assert problems == 0, out.getvalue() + err.getvalue()
    (tmp_path / "model.py").write_text(source)
    module = _import(tmp_path / "model.py")
    for name, obj in vars(module).items():  # get_type_hints raised NameError on 'Any'
        if getattr(obj, "__module__", None) == module.__name__:
            typing.get_type_hints(obj)
            for member in vars(obj).values() if isinstance(obj, type) else ():
                if callable(member):
                    typing.get_type_hints(member)


@pytest.mark.parametrize("name", ["tiny", "tiny-llama", "tiny-moe", "tiny-seq2seq"])
def test_model_without_weights_starts_from_tfgraphs_own_initial_values(
        name: str, tmp_path: Path) -> None:
    from tfgraph.graph.weights import generate

    graph = tfgraph.compile(small(load_spec(ROOT / "specs" / f"{name}.yaml")))
    (tmp_path / "model.py").write_text(generate_source(graph))
    module = _import(tmp_path / "model.py")
    for seed in (0, 7):
        state = module.Model(seed=seed).state_dict()
        want = generate(graph, seed)  # what `tfgraph build --seed` writes
        assert set(state) == set(want)
        for key, value in want.items():
            assert torch.equal(state[key].float(), torch.from_numpy(value)), (seed, key)
    weights = [v for k, v in module.Model().state_dict().items() if k.endswith("q.weight")]
    assert abs(float(torch.cat([w.flatten() for w in weights]).std()) - 0.02) < 0.002


def test_model_of_a_bfloat16_spec_builds_in_its_dtype(tmp_path: Path) -> None:
    """Model() / Model(seed=s) of a bfloat16 spec: parameters in DTYPE, the logits of
    to_torch's module (README: Model(seed=N) starts from the values of build --seed N)."""
    graph = tfgraph.compile(ROOT / "specs" / "tiny-bf16.yaml")
    (tmp_path / "model.py").write_text(generate_source(graph))
    module = _import(tmp_path / "model.py")
    assert module.DTYPE == torch.bfloat16
    net = module.Model(seed=3).eval()
    assert {p.dtype for p in net.parameters()} == {torch.bfloat16}
    ids = torch.tensor([[5, 17, 42, 9]])
    with torch.no_grad():
        torch.testing.assert_close(net(ids), to_torch(graph, seed=3)(ids), atol=0, rtol=0)
