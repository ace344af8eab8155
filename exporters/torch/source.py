"""Readable PyTorch source for a compiled graph: the ``model.py`` of ``tfgraph build --to torch``.

Rendered from the op graph alone, in tinygrad's renderer style: every module the graph declares
(Model, Encoder, DecoderLayer, SelfAttention, FeedForward, ...) becomes a class whose
``forward`` is its nodes in the walk's order (``tfgraph.passes.liveness``), one line per node from the
per-op templates ``TORCH_SOURCE`` (next to the lowering table ``TORCH_OPS``), with nanoGPT-style
shape comments. ``torch_render`` renders one module at a time, reading the graph's structure
from ``torch_render_graph``, planning each forward's statements and variables with
``torch_render_forward`` and writing values, axes and names as ``torch_render_spelling`` says.
Here instances are grouped into classes: the layers of a stack render to the same text and share
one class, and a value that differs between instances (``causal`` of the encoder's and the
decoder's self-attention) becomes a constructor argument. Hyper-parameters are constants on top
(``graph.sizes`` and the values every node of an op shares); a new architecture knob therefore
reaches model.py through lowering and the op tables alone, exactly as it reaches ``to_torch``
and the ONNX exporter.

The file imports only torch and the standard library: the ``torch_functional`` kernels its
lines call are copied in verbatim (``inspect.getsource``), so ``to_torch``'s interpreter and
this file run the same kernels in the same order and agree bit for bit, with dropout and
gradients too. ``load()`` reads weights.safetensors with the safetensors package.

User text (the model's name and description) reaches the file only inside docstrings, escaped
by ``docstring``: no name or description can end the string or add code.
"""

from __future__ import annotations

import ast
import inspect
import io
import keyword
import re
import textwrap
import tokenize
import unicodedata
from dataclasses import dataclass
from typing import Any

from torch import nn

from tfgraph.passes.cost import param_count
from tfgraph.exporters.torch import functional as torch_functional
from tfgraph.exporters.torch.module import TORCH_DTYPES
from tfgraph.errors import TfgraphError
from tfgraph.exporters.torch.ops import CACHE_OPS, SOURCE_SETTINGS
from tfgraph.exporters.torch.render import SLOT, ChildClass, Instance, InstanceRenderer
from tfgraph.exporters.torch.render_graph import GraphView
from tfgraph.exporters.torch.render_spelling import ABBREVIATIONS, RESERVED, literal, variant
from tfgraph.exporters.torch.source_parallel import parallel_source
from tfgraph.graph.ir import Graph
from tfgraph.graph.weights import INIT_STD

IMPORTS = """from __future__ import annotations

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor"""

PARAMETERS = '''class Parameters(nn.Module):
    """Named parameters that a functional call reads (a norm's gain, a position table)."""

    def __init__(self, **values: Tensor) -> None:
        super().__init__()
        for name, value in values.items():
            self.register_parameter(name, nn.Parameter(value))'''

# Attributes every module already has: constructor arguments, stored as self.<name>, avoid them.
MODULE_NAMES = frozenset(dir(nn.Module))
# Characters a docstring must not hold as they are: NUL cannot appear in source, a CR would
# become a newline, separators and bidirectional controls change how the file reads in an editor
# and ANSI sequences act on a terminal showing it (Unicode general categories).
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


@dataclass
class ClassText:
    """A resolved class: slots replaced by literals, constructor arguments or axis names."""

    name: str
    doc: str
    args: list[tuple[str, str]]
    init: list[str]
    params: list[str]
    returns: int
    body: list[str]


def generate_source(graph: Graph) -> str:
    """The text of ``model.py`` for ``graph`` (a full-sequence graph: the KV-cache graph runs
    through ``to_torch`` and ONNX, README "KV cache")."""
    cached = sorted({n.op for n in graph.ops()} & CACHE_OPS)
    if cached or "attention_mask" in graph.inputs:
        raise TfgraphError(f"{graph.name}: model.py is written for the full-sequence graph; "
                           "the KV-cache graph runs through to_torch and ONNX")
    view = GraphView(graph)
    rendered = render_classes(view)
    root = rendered[-1]  # children come first: the model's own class is the last
    root.args.append(("seed", "int = 0"))
    # parameters in the spec's dtype before the initial values are written (copy_ rounds
    # them as to_torch's cast does), so Model(seed=s) equals to_torch(graph, seed=s)
    root.init.append("self.to(DTYPE)")
    root.init.append("init_weights(self, seed)")
    classes = "\n\n\n".join(_class_source(c) for c in rendered)
    constants = _constants(graph, view, classes)
    kernels = _kernels(classes)
    helpers = [PARAMETERS] if "Parameters" in view.helpers else []
    imports = IMPORTS + ("\nfrom typing import Any" if "Any" in _names_in(kernels) else "")
    parts = [_header(graph, view, classes), imports, constants, kernels, *helpers,
             _initialisation(graph), classes, parallel_source(graph),
             _load(view.modules[""].cls)]
    return "\n\n\n".join(p.strip("\n") for p in parts if p) + "\n"


# ---- classes ------------------------------------------------------------------------------


def render_classes(view: GraphView) -> list[ClassText]:
    """One class per distinct module body, children before parents."""
    heights = {path: view.height(path) for path in view.modules}
    classes: dict[str, ChildClass] = {}
    taken: set[str] = set(RESERVED)
    out = []
    for level in sorted(set(heights.values())):
        groups: dict[tuple[Any, ...], list[Instance]] = {}
        for path in (p for p in view.modules if heights[p] == level):
            instance = InstanceRenderer(view, path, classes).render()
            groups.setdefault(instance.key(), []).append(instance)
        for members in groups.values():
            name = variant(members[0].info.cls, taken)
            taken.add(name)
            text, values = _resolve(name, members)
            out.append(text)
            for member, member_values in zip(members, values):
                classes[member.path] = (name, member_values)
    return out


def _resolve(name: str, members: list[Instance]) -> tuple[ClassText, list[list[tuple[str, Any]]]]:
    """Fill the slots of instances sharing one body: a value the same in all of them is a
    literal, one that differs a constructor argument; a sequence axis that differs is L."""
    first = members[0]
    args: dict[tuple[str, tuple[Any, ...]], str] = {}
    in_body: dict[int, str] = {}
    in_init: dict[int, str] = {}
    varying_axes = 0
    for i, slot in enumerate(first.slots):
        values = tuple(m.slots[i].value for m in members)
        if all(type(v) is type(values[0]) and v == values[0] for v in values):
            in_body[i] = in_init[i] = literal(values[0]) if slot.kind == "attr" else values[0]
        elif slot.kind == "axis":
            varying_axes += 1
            in_body[i] = in_init[i] = "L" if varying_axes == 1 else f"L{varying_axes}"
        else:
            base = slot.key if slot.key.isidentifier() and not keyword.iskeyword(slot.key) \
                else "arg"
            arg = args.get((slot.key, values)) or variant(base, set(args.values()) | MODULE_NAMES)
            args[(slot.key, values)] = arg
            in_body[i], in_init[i] = f"self.{arg}", arg
    arg_values = [(arg, values) for (_, values), arg in args.items()]
    text = ClassText(
        name, first.info.doc,
        [(arg, type(values[0]).__name__) for arg, values in arg_values],
        [f"self.{arg} = {arg}" for arg, _ in arg_values] + _fill(first.init, in_init),
        first.params, first.returns, _fill(first.body, in_body))
    per_member = [[(arg, values[k]) for arg, values in arg_values] for k in range(len(members))]
    return text, per_member


def _fill(lines: list[str], texts: dict[int, str]) -> list[str]:
    pattern = re.compile(f"{SLOT}(\\d+){SLOT}")
    return [pattern.sub(lambda m: texts[int(m.group(1))], line) for line in lines]


def _class_source(c: ClassText) -> str:
    signature = "".join(f", {arg}: {annotation}" for arg, annotation in c.args)
    returns = "Tensor" if c.returns == 1 else f"tuple[{', '.join(['Tensor'] * c.returns)}]"
    return "\n".join([
        f"class {c.name}(nn.Module):",
        f'    """{docstring(c.doc)}"""',
        "",
        f"    def __init__(self{signature}) -> None:",
        "        super().__init__()",
        *(wrapped for line in c.init for wrapped in wrap(line, 8)),
        "",
        *wrap(f"def forward(self, {', '.join(c.params)}) -> {returns}:", 4),
        *(wrapped for line in c.body for wrapped in wrap(line, 8)),
    ])


def wrap(line: str, indent: int, width: int = 99) -> list[str]:
    """``line`` indented; when longer than ``width``, the arguments of its first bracket are
    broken over lines aligned after that bracket (the shape comment stays last). Python's
    tokenizer finds the commas, so none inside a string literal is taken for one."""
    pad = " " * indent
    if len(pad + line) <= width:
        return [pad + line]
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError):
        return [pad + line]
    comment = next((t.string for t in tokens if t.type == tokenize.COMMENT), "")
    opened: dict[int, int] = {}  # depth -> end of the first bracket opening it
    cuts: dict[int, list[int]] = {}  # depth -> ends of the commas at that depth
    depth = 0
    for token in tokens:
        if token.type != tokenize.OP:
            continue
        if token.string in "([{":
            depth += 1
            opened.setdefault(depth, token.end[1])
        elif token.string in ")]}":
            depth -= 1
        elif token.string == "," and opened.get(depth, len(line)) < token.start[1]:
            cuts.setdefault(depth, []).append(token.end[1])
    code = line[:line.index(comment)].rstrip() if comment else line
    if not cuts:
        return [pad + line]
    level = min(cuts)  # the outermost bracket with several arguments
    opened_at, cuts_at = opened[level], cuts[level]
    bounds = [opened_at, *cuts_at, len(code)]
    pieces = [code[a:b].strip() for a, b in zip(bounds, bounds[1:])]
    lines, current = [], pad + code[:opened_at]
    hang = " " * (indent + opened_at)
    for piece in pieces:
        if len(current) + len(piece) + 1 > width and current.strip() and \
                not current.endswith(("(", "[", "{")):
            lines.append(current.rstrip())
            current = hang
        current += piece + " "
    lines.append(current.rstrip() + (f"  {comment}" if comment else ""))
    return lines


# ---- the rest of the file -----------------------------------------------------------------


def _header(graph: Graph, view: GraphView, classes: str) -> str:
    root = view.modules[""]
    params = sum(param_count(p) for p in graph.params())
    title = f"{root.doc.rstrip('.') or graph.name}, {params:,} parameters."
    description = graph.info.description  # set by lowering ("" for a graph built by hand)
    ids = ", ".join(graph.inputs)
    shapes = ", ".join(_plain_shape(view, i) for i in graph.inputs)
    out = graph.outputs[0]
    legend = ["B batch", "S source (or only) length", "T target length"]
    if re.search(r"# .*\bL\b", classes):
        legend.append("L either length (in a class both stacks use)")
    legend += [f"{short} {name}" for name, short in ABBREVIATIONS.items() if name in view.sizes]
    usage = f"""Generated by tfgraph from the op graph of spec.yaml (in this folder); imports torch
(numpy too when Model() is built without a weights file: tfgraph's own initial values).
Parameter names are tfgraph's (README, "Parameter names"), so weights.safetensors loads with
strict=True. Regenerate rather than edit: tfgraph build spec.yaml --to torch -o DIR.

    import model
    net = model.load("path/to/this/folder")  # weights.safetensors, {graph.dtype}, eval mode
    out = net({ids})  # int64 {shapes} -> {out} {_plain_shape(view, out)}

{textwrap.fill("Shapes in comments: " + ", ".join(legend) + ".", 95)}
"""
    text = "\n\n".join(p for p in (title, description, usage) if p)
    return '"""' + docstring(text) + '"""'


def _plain_shape(view: GraphView, value: str) -> str:
    return "(" + ", ".join(a.text for a in view.axes[value]) + ")"


def _constants(graph: Graph, view: GraphView, code: str) -> str:
    lines = ["# ---- hyper-parameters (the graph's sizes and shared attributes) " + "-" * 27]
    for name, value in view.sizes.items():
        short = ABBREVIATIONS.get(name)
        lines.append(f"{name.upper()} = {literal(value)}" + (f"  # {short}" if short else ""))
    for name, (value, comment) in view.constants.defined.items():
        lines.append(f"{name} = {value}  # {comment}")
    lines.append(f"DTYPE = {TORCH_DTYPES[graph.dtype]}  # parameters and activations")
    used = _names_in(code)
    for name, (value, comment) in SOURCE_SETTINGS.items():
        if name in used:
            lines.append(f"{name} = {value}  # {comment}")
    return "\n".join(lines)


def _kernels(code: str) -> str:
    """The torch_functional functions (and classes) ``code`` calls, with those they call,
    copied verbatim in their order in torch_functional."""
    available = {name: obj for name, obj in vars(torch_functional).items()
                 if (inspect.isfunction(obj) or inspect.isclass(obj))
                 and obj.__module__ == torch_functional.__name__}
    wanted: set[str] = set()
    todo = _names_in(code) & set(available)
    while todo:
        name = todo.pop()
        wanted.add(name)
        todo |= (_names_in(inspect.getsource(available[name])) & set(available)) - wanted
    if not wanted:
        return ""
    ordered = sorted(wanted, key=lambda n: inspect.getsourcelines(available[n])[1])
    head = "# ---- kernels (tfgraph.exporters.torch.functional, verbatim) " + "-" * 30
    return head + "\n\n" + "\n\n\n".join(inspect.getsource(available[n]).strip()
                                         for n in ordered)


def _names_in(code: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name)}


def _init_patterns(graph: Graph) -> dict[str, list[str]]:
    """Parameter-name patterns (layer indices as ``*``) by init kind, for model.py's
    init_weights; a pattern whose layers disagree stays as exact names."""
    kinds: dict[str, set[str]] = {}
    names: dict[str, list[str]] = {}
    for p in graph.params():
        pattern = re.sub(r"\.layers\.\d+\.", ".layers.*.", p.name)
        kinds.setdefault(pattern, set()).add(p.attrs["init"])
        names.setdefault(pattern, []).append(p.name)
    out: dict[str, list[str]] = {"ones": [], "zeros": []}
    for pattern, found in kinds.items():
        for kind in found & set(out):
            out[kind] += [pattern] if len(found) == 1 else \
                [n for n in names[pattern] if graph.node(n).attrs["init"] == kind]
    return out


def _initialisation(graph: Graph) -> str:
    """init_weights: tfgraph's own initial values (tfgraph.graph.weights), so ``Model(seed=s)``
    holds exactly the weights ``tfgraph build --seed s`` writes."""
    patterns = _init_patterns(graph)
    tuples = {kind: "(" + "".join(f"\n    {literal(n)}," for n in names) + "\n)"
              if names else "()" for kind, names in patterns.items()}
    return f'''# ---- initialisation (tfgraph.graph.weights: GPT-2's scheme, Radford et al. 2019) {"-" * 17}
# Matrices and tables ~ N(0, INIT_STD), each drawn from its own stream seeded by (seed,
# crc32(name)), so Model(seed=s) equals `tfgraph build --seed s`; norm gains start at 1 and
# biases at 0 (these patterns; * is a layer index).
INIT_STD = {INIT_STD}
INIT_ONES = {tuples["ones"]}
INIT_ZEROS = {tuples["zeros"]}


def init_weights(model: nn.Module, seed: int = 0) -> None:
    """Set every parameter of ``model`` to tfgraph's initial value for ``seed`` (parameters on
    the meta device are left alone: load() fills them from the folder's weights)."""
    import zlib
    from fnmatch import fnmatchcase

    import numpy as np

    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.is_meta:
                continue
            if any(fnmatchcase(name, pattern) for pattern in INIT_ONES):
                param.fill_(1.0)
            elif any(fnmatchcase(name, pattern) for pattern in INIT_ZEROS):
                param.zero_()
            else:
                rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
                value = rng.standard_normal(size=tuple(param.shape), dtype=np.float32)
                value *= np.float32(INIT_STD)
                param.copy_(torch.from_numpy(value))'''


def _load(model: str) -> str:
    return f'''def load(folder: str = os.path.dirname(os.path.abspath(__file__)),
         device: str | torch.device = "cpu") -> {model}:
    """The model with the folder's weights.safetensors, in eval mode (needs safetensors)."""
    from safetensors.torch import load_file

    with torch.device("meta"):  # no throw-away initialisation; the file has every weight
        model = {model}()
    weights = load_file(os.path.join(folder, "weights.safetensors"), device=str(device))
    # Fresh copies: safetensors' storages are only 8-byte aligned, and a one-row matmul (a
    # gemv: one token routed to an expert) rounds differently on those than on aligned ones.
    model.load_state_dict({{k: v.to(DTYPE, copy=True) for k, v in weights.items()}},
                          strict=True, assign=True)
    return model.eval()'''


def docstring(text: str) -> str:
    """``text`` as the inside of a triple-quoted (non-raw) docstring that evaluates back to
    ``text``: backslashes are escaped, and every double quote followed by another or by the
    closing quotes, so no run of three can end the string; control, format, surrogate and
    separator characters are written as escapes. Newlines stay, so a multi-line description
    reads as itself."""
    out = []
    for i, ch in enumerate(text):
        if ch == "\\" or (ch == '"' and text[i + 1:i + 2] in ('"', "")):
            out.append("\\" + ch)  # a quote before a quote or the closing quotes
        elif ch != "\n" and unicodedata.category(ch) in _ESCAPED_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else
                       f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)
