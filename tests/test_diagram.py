"""Architecture diagrams: levels, labels, norm placement read off the edges, rendered
formats, missing ``dot``, annotations, and the ``tfgraph draw`` command.

Rendering tests need the graphviz ``dot`` program: they fail in CI (which installs it) when it
is missing and skip elsewhere. DOT-level tests need only the python package.
"""

from __future__ import annotations

import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, SPEC_FILES

import tfgraph
from tfgraph.cli import main
from tfgraph.errors import TfgraphError
from tfgraph.exporters.diagram.draw import diagram_source, write_diagram
from tfgraph.exporters.diagram.style import Annotator

SVG_NS = "{http://www.w3.org/2000/svg}"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# ---- helpers (also imported by the compare tests) ------------------------------------------

_EDGE = re.compile(r'^\s*("(?:[^"\\]|\\.)*"|[\w.]+)\s*->\s*("(?:[^"\\]|\\.)*"|[\w.]+)(.*)$')


def _unquote(token: str) -> str:
    return token[1:-1] if token.startswith('"') else token


def dot_edges(source: str) -> list[tuple[str, str, str]]:
    """(tail, head, attribute text) of every edge statement in DOT text, in order."""
    out = []
    for line in source.splitlines():
        m = _EDGE.match(line)
        if m:
            out.append((_unquote(m.group(1)), _unquote(m.group(2)), m.group(3)))
    return out


def edge_set(source: str) -> set[tuple[str, str]]:
    return {(a, b) for a, b, _ in dot_edges(source)}


def require_binary(name: str) -> str:
    """Path of a system program a test needs. CI (CI=true) installs it in .ci/run, so there
    its absence fails the test; elsewhere the test is skipped."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{name!r} is not installed, but CI installs it (.ci/run)")
        package = "graphviz" if name == "dot" else name
        pytest.skip(f"{name!r} is not installed (apt-get install {package})")
    return path


def svg_texts(data: bytes) -> list[str]:
    """Every text run of an SVG document (parsing it as XML on the way)."""
    root = ET.fromstring(data)
    return ["".join(t.itertext()).strip() for t in root.iter(f"{SVG_NS}text")]


def compiled(name: str) -> tfgraph.graph.ir.Graph:
    return tfgraph.compile(ROOT / "specs" / name)


# ---- rendered formats ----------------------------------------------------------------------


def test_model_svg_parses_and_shows_folded_stacks(tmp_path: Path) -> None:
    require_binary("dot")
    out = write_diagram(compiled("base.yaml"), tmp_path / "base.svg", "svg", "model")
    texts = svg_texts(out.read_bytes())
    assert "Encoder × 6" in texts and "Decoder × 6" in texts
    assert any("into every decoder layer (× 6)" in t for t in texts)
    assert "Output head" in texts and "Legend" in texts
    assert any("embed.tokens.weight" in t for t in texts)


def test_layer_svg_names_every_sublayer(tmp_path: Path) -> None:
    require_binary("dot")
    out = write_diagram(compiled("base.yaml"), tmp_path / "layer.svg", "svg", "layer")
    texts = svg_texts(out.read_bytes())
    for label in ("Encoder layer × 6", "Decoder layer × 6", "Self-attention",
                  "Masked self-attention", "Cross-attention", "Feed-forward", "LayerNorm",
                  "self_attn_norm", "cross_attn_norm", "ffn_norm", "residual", "K, V"):
        assert label in texts, label


def test_op_svg_labels_edges_with_symbolic_shapes(tmp_path: Path) -> None:
    require_binary("dot")
    out = write_diagram(compiled("base.yaml"), tmp_path / "op.svg", "svg", "op")
    texts = svg_texts(out.read_bytes())
    for shape in ("B×S×512", "B×T×512", "B×S×2048", "B×T×2048"):
        assert shape in texts, shape
    assert "layers.0 (× 6: one drawn, all identical)" in texts
    assert any(t.startswith("B×S×512") and "(residual)" in t for t in texts)


def test_png_and_pdf_signatures(tmp_path: Path) -> None:
    require_binary("dot")
    graph = compiled("tiny-llama.yaml")
    png = write_diagram(graph, tmp_path / "d.png", "png", "layer")
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert png.stat().st_size > 10_000
    pdf = write_diagram(graph, tmp_path / "d.pdf", "pdf", "model")
    assert pdf.read_bytes().startswith(b"%PDF-")


# ---- DOT structure: what the edges say --------------------------------------------------------


def _chain(stack: str, sub: str, position: str, first: str) -> list[tuple[str, str]]:
    """Expected data edges of one sublayer for a norm placement (README, ``norm.position``),
    entering from ``first``: post norm(x + f(x)); pre x + f(norm(x)); branch x + norm(f(x));
    sandwich x + norm(f(norm(x)))."""
    p = f"{stack}.{sub}"
    if position == "post":
        return [(first, f"{p}.fn"), (f"{p}.fn", f"{p}.add"), (f"{p}.add", f"{p}.norm")]
    if position == "pre":
        return [(first, f"{p}.norm"), (f"{p}.norm", f"{p}.fn"), (f"{p}.fn", f"{p}.add")]
    if position == "branch":
        return [(first, f"{p}.fn"), (f"{p}.fn", f"{p}.norm"), (f"{p}.norm", f"{p}.add")]
    return [(first, f"{p}.norm"), (f"{p}.norm", f"{p}.fn"), (f"{p}.fn", f"{p}.out_norm"),
            (f"{p}.out_norm", f"{p}.add")]


@pytest.mark.parametrize("spec_path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_layer_edges_follow_norm_placement(spec_path: Path) -> None:
    graph = tfgraph.compile(spec_path)
    spec = graph.spec
    edges = dot_edges(diagram_source(graph, "layer"))
    pairs = {(a, b) for a, b, _ in edges}
    position = spec.norm.position
    for stack in spec.stacks:
        subs = ["self_attn"] + (["cross_attn"] if stack == "decoder"
                                and spec.arch == "encoder-decoder" else []) + ["ffn"]
        x = f"{stack}.layer_in"
        if spec.block.residual == "parallel":  # both sublayers read the layer input
            norms = [f"{stack}.layer.norm"] if spec.block.shared_norm else \
                [f"{stack}.self_attn.norm", f"{stack}.ffn.norm"]
            assert {(x, n) for n in norms} <= pairs
            if spec.block.shared_norm:
                assert {(norms[0], f"{stack}.self_attn.fn"), (norms[0], f"{stack}.ffn.fn")} \
                    <= pairs
            assert {(f"{stack}.self_attn.fn", f"{stack}.layer.branches"),
                    (f"{stack}.ffn.fn", f"{stack}.layer.branches"),
                    (x, f"{stack}.layer.residual"),
                    (f"{stack}.layer.branches", f"{stack}.layer.residual")} <= pairs
            continue
        for sub in subs:
            x_in = x
            chain = _chain(stack, sub, position, x)
            if sub == "self_attn" and spec.norm.skip_first:  # layer 0 (drawn) has no pre-norm
                chain = [(x, f"{stack}.{sub}.fn"), (f"{stack}.{sub}.fn", f"{stack}.{sub}.add")]
                assert (x, f"{stack}.{sub}.norm") not in pairs
            for edge in chain:
                assert edge in pairs, f"{spec.name}: missing {edge} for {position} norm"
            # the residual edge: the sublayer's input straight into its add, drawn as such
            residual = [attrs for a, b, attrs in edges if (a, b) == (x, f"{stack}.{sub}.add")]
            assert residual and "residual" in residual[0] and "dashed" in residual[0]
            x = f"{stack}.{sub}.norm" if position == "post" else f"{stack}.{sub}.add"
            p = f"{stack}.{sub}"
            if position == "post":  # the norm reads the sum, never the sublayer's input
                assert (f"{p}.add", f"{p}.norm") in pairs and (x_in, f"{p}.norm") not in pairs
            else:  # the residual stream passes the add un-normalised
                assert (f"{p}.add", f"{p}.norm") not in pairs
        norm_nodes = {n for e in pairs for n in e if n.endswith("norm")}
        if spec.norm.final:
            assert f"{stack}.norm" in norm_nodes
        else:
            assert f"{stack}.norm" not in norm_nodes


def test_pre_norm_puts_norm_before_attention_and_post_norm_after_the_add() -> None:
    pre = edge_set(diagram_source(compiled("gpt2.yaml"), "layer"))
    assert ("decoder.layer_in", "decoder.self_attn.norm") in pre
    assert ("decoder.self_attn.norm", "decoder.self_attn.fn") in pre
    assert ("decoder.self_attn.add", "decoder.self_attn.norm") not in pre
    post = edge_set(diagram_source(compiled("base.yaml"), "layer"))
    assert ("encoder.self_attn.add", "encoder.self_attn.norm") in post
    assert ("encoder.layer_in", "encoder.self_attn.fn") in post
    assert ("encoder.self_attn.norm", "encoder.self_attn.fn") not in post


def test_masked_and_cross_attention_are_told_apart() -> None:
    src = diagram_source(compiled("base.yaml"), "layer")
    blocks = dict(re.findall(r'^\s*"([\w.]+)" \[label="([^"]*)"', src, re.M))
    assert blocks["encoder.self_attn.fn"].startswith("Self-attention")
    assert blocks["decoder.self_attn.fn"].startswith("Masked self-attention")
    assert blocks["decoder.cross_attn.fn"].startswith("Cross-attention")
    colours = dict(re.findall(r'^\s*"([\w.]+)" \[label="[^"]*" fillcolor="(#\w+)"', src, re.M))
    assert len({colours["encoder.self_attn.fn"], colours["decoder.self_attn.fn"],
                colours["decoder.cross_attn.fn"]}) == 3
    # the encoder output feeds the decoder's cross-attention (K, V)
    kv = [attrs for a, b, attrs in dot_edges(src) if b == "decoder.cross_attn.fn"
          and a.startswith("encoder.")]
    assert kv and "K, V" in kv[0]


def test_model_level_cross_attention_edge_and_tying() -> None:
    src = diagram_source(compiled("base.yaml"), "model")
    edges = dot_edges(src)
    cross = [attrs for a, b, attrs in edges if (a, b) == ("encoder.layers", "decoder.layers")]
    assert cross and "every decoder layer (× 6)" in cross[0]
    pairs = {(a, b) for a, b, _ in edges}
    # one shared table feeds both embeddings and the (tied) head
    assert {("embed.tokens.weight", "encoder.embed"), ("embed.tokens.weight", "decoder.embed"),
            ("embed.tokens.weight", "head")} <= pairs
    untied = edge_set(diagram_source(compiled("llama.yaml"), "model"))
    assert ("embed.tokens.weight", "head") not in untied
    assert ("decoder.norm", "head") in untied


@pytest.mark.parametrize("name, dense, experts", [
    ("tiny-deepseek-v3.yaml", "FFN layer 0: gated SwiGLU", "FFN layers 1–: experts ×8, top-2"),
    ("deepseek-v3.yaml", "FFN layers 0–2: gated SwiGLU, 7168 → 18432 → 7168",
     "FFN layers 3–: experts ×256, top-8: gated SwiGLU, 7168 → 2048 → 7168"),
    ("mixtral-8x7b.yaml", None, "FFN experts ×8, top-2: gated SwiGLU, 4096 → 14336 → 4096"),
])
def test_model_level_stack_names_its_expert_layers(name: str, dense: str | None,
                                                    experts: str) -> None:
    """The folded stack box described layer 0's feed-forward only: DeepSeek-V3's 58 layers
    of 256 experts (ffn.dense_layers 3) were drawn as one dense SwiGLU."""
    src = diagram_source(compiled(name), "model")
    label = next(line for line in src.splitlines() if line.strip().startswith('"decoder.layers" ['))
    ffn = [part for part in label.split("\\n") if part.startswith("FFN")]
    want = ([dense] if dense else []) + [experts]
    assert len(ffn) == len(want) and all(f.startswith(w) for f, w in zip(ffn, want)), ffn


def test_op_level_folds_layers_unless_unfolded() -> None:
    graph = compiled("tiny-llama.yaml")
    folded = diagram_source(graph, "op")
    unfolded = diagram_source(graph, "op", unfold=True)
    assert '"decoder.layers.0.ffn.up"' in folded and '"decoder.layers.1.ffn.up"' not in folded
    assert '"decoder.layers.1.ffn.up"' in unfolded
    # every op is a node of the unfolded drawing, and every non-parameter edge is drawn
    for node in graph.ops():
        assert f'"{node.name}" [' in unfolded or f"\t{node.name} [" in unfolded, node.name
    data_edges = {(i, n.name) for n in graph.ops() for i in n.inputs
                  if not graph.node(i).is_param}
    assert data_edges == edge_set(unfolded) - {("legend", "legend_notes")}
    # the folded drawing maps the last layer's output onto layer 0's
    assert ("decoder.layers.0.ffn.residual", "decoder.norm") in edge_set(folded)
    assert "(from layers.1)" in folded
    assert 'label=" B×S×64"' in folded  # shapes on edges


def test_dot_output_is_deterministic() -> None:
    for level in ("model", "layer", "op"):
        a = diagram_source(tfgraph.compile(ROOT / "specs" / "tiny-seq2seq.yaml"), level)
        b = diagram_source(tfgraph.compile(ROOT / "specs" / "tiny-seq2seq.yaml"), level)
        assert a == b


def test_legend_lists_only_kinds_drawn() -> None:
    enc = diagram_source(compiled("tiny-encoder.yaml"), "layer")
    assert "self-attention (bidirectional)" in enc
    assert "masked (causal) self-attention" not in enc and "cross-attention (over" not in enc
    seq2seq = diagram_source(compiled("tiny-seq2seq.yaml"), "layer")
    assert "cross-attention (over encoder output)" in seq2seq


# ---- annotations ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["base.yaml", "gpt2.yaml", "tiny-sandwich.yaml"])
def test_annotations_add_up_to_the_report(name: str) -> None:
    graph = compiled(name)
    rep = graph.report(batch=2, seq=64)
    ann = Annotator(graph, ["params", "flops"], batch=2, seq=64)
    ops = [n.name for n in graph.ops()]
    assert ann.params(ops) == rep["params"]
    assert sum(ann._flops.values()) == rep["flops"]["forward"]
    # a tied table is counted once: with its first reader, not again with the head
    tied = graph.node("logits").inputs[1]
    if graph.node(tied).scope != "head":
        assert ann.params(["logits"]) == 0


def test_annotated_labels_show_params_and_flop_share() -> None:
    src = diagram_source(compiled("gpt2.yaml"), "layer", annotate=["params", "flops"])
    assert re.search(r"all 12: 56\.7M params · \d+\.\d% FLOPs", src)  # the FFN of 12 layers
    assert "FLOP share of the forward pass at B=1, S=T=128" in src
    with pytest.raises(TfgraphError, match="annotate"):
        diagram_source(compiled("gpt2.yaml"), "model", annotate=["bytes"])



@pytest.mark.parametrize("spec", ["tiny-llama.yaml", "gpt2.yaml", "base.yaml"])
def test_model_level_params_add_up_to_the_report(spec: str) -> None:
    """Token tables are counted in their own boxes (once when tied: GPT-2's, base's shared
    encoder-decoder table), so the model-level boxes sum to the report's parameters (each
    box's figure is rounded to three digits)."""
    graph = compiled(spec)
    src = diagram_source(graph, "model", annotate=["params"])
    scale = {"": 1, "k": 1e3, "M": 1e6, "B": 1e9}
    shown = sum(float(n) * scale[u] for n, u in re.findall(r"([\d.]+)([kMB]?) params", src))
    assert shown == pytest.approx(graph.report()["params"], rel=5e-3)

# ---- missing dot, atomic writes, bad arguments ---------------------------------------------


def test_missing_dot_writes_dot_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    spec = ROOT / "specs" / "tiny.yaml"
    runner = CliRunner()
    result = runner.invoke(main, ["draw", str(spec), "-o", str(tmp_path / "t.svg")],
                           env={"PATH": str(empty)})
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert "\n" not in message and "Traceback" not in message
    assert "'dot'" in message and "apt-get install graphviz" in message
    assert (tmp_path / "t.dot").read_text(encoding="utf-8").startswith("digraph")
    assert not (tmp_path / "t.svg").exists()


def test_failed_render_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    target = tmp_path / "keep.svg"
    target.write_text("old", encoding="utf-8")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(TfgraphError, match="not on PATH"):
        write_diagram(compiled("tiny.yaml"), target, "svg", "layer")
    assert target.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.dot", "keep.svg"]


def test_draw_command_default_path_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    spec = str(ROOT / "specs" / "tiny-decoder.yaml")
    ok = runner.invoke(main, ["draw", spec, "-o", "x.dot", "--level", "op", "--unfold"])
    assert ok.exit_code == 0, ok.output
    assert '"decoder.layers.1.ffn.up"' in (tmp_path / "x.dot").read_text(encoding="utf-8")
    for args, words in (
        (["draw", spec, "-o", "x.txt"], "unknown diagram format"),
        (["draw", spec, "--unfold"], "--unfold applies to --level op"),
        (["draw", spec, "--annotate", "params,bytes"], "--annotate"),
        (["draw", str(tmp_path / "missing.yaml")], "missing.yaml"),
        (["draw", spec, "-o", str(tmp_path / "x.dot" / "dir.svg")], "cannot write"),
    ):
        bad = runner.invoke(main, args)
        assert bad.exit_code == 2, (args, bad.output)
        assert words in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    require_binary("dot")
    made = runner.invoke(main, ["draw", spec, "--level", "layer", "--annotate", "params"])
    assert made.exit_code == 0, made.output
    out = tmp_path / "build" / "tiny-decoder-layer.svg"
    assert "Decoder layer × 2" in svg_texts(out.read_bytes())


def test_too_many_boxes_are_refused_before_dot_runs(tmp_path: Path) -> None:
    """A 200-layer TinyLlama at --level op --unfold: 3,206 boxes, past the 3,000 dot renders
    in reasonable time (1,024 layers ran for minutes in graphviz): one line naming the .dot
    output, nothing written; the DOT text itself is written."""
    from tfgraph.exporters.diagram.draw import MAX_RENDERED_BOXES, boxes

    text = (ROOT / "specs" / "tiny-llama.yaml").read_text(encoding="utf-8")
    assert "\nlayers: 2\n" in text
    spec = tmp_path / "deep.yaml"
    spec.write_text(text.replace("\nlayers: 2\n", "\nlayers: 200\n"), encoding="utf-8")
    empty = tmp_path / "bin"  # no dot: the refusal must come before it would run
    empty.mkdir()
    runner = CliRunner()
    for name in ("big.svg", "big.png"):
        result = runner.invoke(main, ["draw", str(spec), "--level", "op", "--unfold", "-o",
                                      str(tmp_path / name)], env={"PATH": str(empty)})
        assert result.exit_code == 2, result.output
        message = result.stderr.strip()
        assert "\n" not in message and "boxes" in message and "-o big.dot" in message, message
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "deep.yaml"]
    dot = runner.invoke(main, ["draw", str(spec), "--level", "op", "--unfold", "-o",
                               str(tmp_path / "big.dot")])
    assert dot.exit_code == 0, dot.output
    drawn = boxes((tmp_path / "big.dot").read_text(encoding="utf-8"))
    assert drawn > MAX_RENDERED_BOXES and f"{drawn:,} boxes" in message
    folded = runner.invoke(main, ["draw", str(spec), "--level", "op", "-o",
                                  str(tmp_path / "folded.dot")])  # the first layer only
    assert folded.exit_code == 0
    assert boxes((tmp_path / "folded.dot").read_text(encoding="utf-8")) < 100
    assert boxes('digraph {\n\tnode [shape=box]\n\ta [label=x]\n\t"b.c" [label="y [z]"]\n'
                 '\ta -> "b.c" [label=s]\n\tsubgraph cluster_a {\n\t\tlabel=a\n\t}\n}') == 2


# ---- the committed example images ------------------------------------------------------------

EXAMPLES = {"base-model.svg": "model", "base-layer.svg": "layer"}


@pytest.mark.parametrize(("name", "level"), sorted(EXAMPLES.items()))
def test_readme_example_images_are_the_tools_output(name: str, level: str) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    path = ROOT / "examples" / "diagrams" / name
    assert f"examples/diagrams/{name}" in readme
    assert f"tfgraph draw specs/base.yaml --level {level} -o examples/diagrams/{name}" in readme
    committed = svg_texts(path.read_bytes())
    # every label of today's drawing is in the committed image (layout may differ by
    # graphviz version; the words may not)
    source = diagram_source(compiled("base.yaml"), level)
    labels = re.findall(r'\[label="([^"]+)"', source)
    for label in labels:
        for line in re.split(r"\\[nl]", label):
            if line.strip():
                assert line.strip() in committed, (name, line)


# ---- drawn from the graph alone ------------------------------------------------------------


@pytest.mark.parametrize("name", ["base.yaml", "tiny-llama.yaml", "tiny-sandwich.yaml"])
def test_diagrams_never_read_the_spec(name: str) -> None:
    """Every level is the same drawing when the graph has no spec attached."""
    graph = compiled(name)
    before = {level: diagram_source(graph, level) for level in ("model", "layer", "op")}
    graph.spec = None
    for level, source in before.items():
        assert diagram_source(graph, level) == source, level


def _parallel_graph(summed: bool = False) -> tfgraph.graph.ir.Graph:
    """tiny-llama lowered with a parallel residual (GPT-J, GPT-NeoX): each layer computes
    x + self_attn(norm(x)) + ffn(norm(x)), both sublayers reading the layer input. Lowering
    has no such option: this stands for any wiring lowering may produce, which diagrams must
    show as computed rather than as a fixed template."""
    from tfgraph.compiler import CompiledGraph
    from tfgraph.graph.ir import NodeMeta
    from tfgraph.spec.loader import load_spec
    from tfgraph.graph.lower import SUBLAYER_CLASSES, Sizes, _Lowering, _role

    class Parallel(_Lowering):
        """Each sublayer reads the layer input; its output is added to the stream
        (``summed``: GPT-NeoX's form, the branch outputs added first by an op of the layer
        itself, in no sublayer)."""

        def layer(self, stack: str, i: int, x: str, causal: bool, memory: str | None) -> str:
            path = f"{stack}.layers.{i}"
            self.g.module(path, "ParallelLayer", "x + attn(norm(x)) + ffn(norm(x))")
            out, branches = x, []
            for sub in ("self_attn", "ffn"):
                cls, doc = SUBLAYER_CLASSES[sub]
                self.g.module(f"{path}.{sub}", cls, doc)
                wrap = NodeMeta("layer", stack, i, sub, module=path)
                inner = NodeMeta("layer", stack, i, sub, module=f"{path}.{sub}")
                scope = f"{path}.{sub}"
                h = self.norm(x, f"{scope}.norm", f"{path}.{sub}_norm", scope, wrap, "norm")
                h = self.ffn(h, scope, inner) if sub == "ffn" else \
                    self.attention(h, h, scope, inner, causal=causal, rope=True)
                branches.append(h)
                if not summed:
                    out = self.g.add("add", [out, h], name=f"{scope}.residual", scope=scope,
                                     meta=_role(wrap, "residual"))
            if not summed:
                return out
            meta = NodeMeta("layer", stack, i, module=path)
            y = self.g.add("add", branches, name=f"{path}.branches", scope=path,
                           meta=_role(meta, "branches"))
            return self.g.add("add", [x, y], name=f"{path}.residual", scope=path,
                              meta=_role(meta, "residual"))

    spec = load_spec(ROOT / "specs" / "tiny-llama.yaml")
    graph = Parallel(spec, Sizes.of(spec), CompiledGraph).model()
    graph.lint()
    return graph


def test_parallel_residual_is_drawn_as_computed() -> None:
    graph = _parallel_graph()
    layer = edge_set(diagram_source(graph, "layer"))
    # both sublayers read the layer input; the FFN's norm does not read attention's sum
    assert ("decoder.layer_in", "decoder.self_attn.norm") in layer
    assert ("decoder.layer_in", "decoder.ffn.norm") in layer
    assert ("decoder.self_attn.add", "decoder.ffn.norm") not in layer
    assert ("decoder.self_attn.add", "decoder.ffn.add") in layer
    model = diagram_source(graph, "model")
    box = dict(re.findall(r'^\s*"([\w.]+)" \[label="([^"]*)"', model, re.M))["decoder.layers"]
    assert "masked self-attention ∥ feed-forward" in box
    assert "x = x + self_attn(norm(x)) + ffn(norm(x))" in box
    # the sequential model says so, in the same words
    sequential = diagram_source(compiled("tiny-llama.yaml"), "model")
    assert "masked self-attention → feed-forward" in sequential
    assert "pre-norm: x + f(norm(x))" in sequential


def test_branches_summed_by_the_layer_itself_are_drawn() -> None:
    """Catches ops of a layer that belong to no sublayer (the sum of parallel branches)
    being dropped from the drawing, which left the model box's wiring text empty."""
    graph = _parallel_graph(summed=True)
    layer = edge_set(diagram_source(graph, "layer"))
    assert ("decoder.self_attn.fn", "decoder.layer.branches") in layer
    assert ("decoder.ffn.fn", "decoder.layer.branches") in layer
    assert ("decoder.layer.branches", "decoder.layer.residual") in layer
    assert ("decoder.layer_in", "decoder.layer.residual") in layer
    model = diagram_source(graph, "model")
    box = dict(re.findall(r'^\s*"([\w.]+)" \[label="([^"]*)"', model, re.M))["decoder.layers"]
    assert "masked self-attention ∥ feed-forward" in box
    assert "x = x + self_attn(norm(x)) + ffn(norm(x))" in box


@pytest.mark.parametrize(("name", "wiring"), [
    ("base.yaml", "post-norm: norm(x + f(x))"), ("gpt2.yaml", "pre-norm: x + f(norm(x))"),
    ("named-tensor.yaml", "branch norm: x + norm(f(x))"),
    ("tiny-sandwich.yaml", "sandwich: x + norm(f(norm(x)))")])
def test_model_level_names_the_wiring_its_edges_show(name: str, wiring: str) -> None:
    assert wiring in diagram_source(compiled(name), "model")


def test_labels_come_from_node_attributes() -> None:
    """The attention box reads its op's heads / kv_heads / head_dim: changing them on the
    node changes the drawing (nothing is looked up elsewhere)."""
    graph = compiled("tiny-llama.yaml")
    att = next(n for n in graph.ops() if n.op == "attention" and n.meta.layer == 0)
    assert "4 heads × 16, 2 kv heads (GQA)" in diagram_source(graph, "layer")
    att.attrs.update(kv_heads=1)
    assert "4 heads × 16, 1 kv head (MQA)" in diagram_source(graph, "layer")


def test_boxes_read_the_diagram_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """What an op adds to a drawing is its row in DIAGRAM_OPS (the drawing code names no op):
    changing the row changes the drawing."""
    import dataclasses

    from tfgraph.exporters.diagram.ops import DIAGRAM_OPS

    graph = compiled("tiny-llama.yaml")
    assert "Feed-forward\\ngated SwiGLU, 64 → 96 → 64" in diagram_source(graph, "layer")
    assert "rope θ=" in diagram_source(graph, "op")
    monkeypatch.setitem(DIAGRAM_OPS, "mul", dataclasses.replace(DIAGRAM_OPS["mul"], gates=False))
    monkeypatch.setitem(DIAGRAM_OPS, "rope", dataclasses.replace(
        DIAGRAM_OPS["rope"], text=lambda g, node: f"turns {node.attrs['heads']} heads"))
    assert "Feed-forward\\nSiLU, 64 → 96 → 64" in diagram_source(graph, "layer")
    op_level = diagram_source(graph, "op")
    assert "turns 4 heads" in op_level and "rope θ=" not in op_level
