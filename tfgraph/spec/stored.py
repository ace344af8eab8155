"""The spec tfgraph stores in the ONNX models it builds (metadata key ``tfgraph.spec.schema``), read as
untrusted input: a model file can come from anyone, and its metadata can be malformed or disagree
with the graph it rides on (a 10,000-layer spec in a tiny model would take half a minute and
gigabytes to compile before the mismatch showed).

Preconditions: none on the text. Postconditions: :func:`stored_spec` returns a validated
:class:`~tfgraph.spec.schema.Spec` or raises a one-line :class:`~tfgraph.errors.SpecError`;
:func:`model_graph` compiles the spec only after its layer counts agree with the model's
initializers, and returns a graph whose parameters match them name for name and shape for shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import yaml

from tfgraph.errors import SpecError, TfgraphError
from tfgraph.graph.ir import SPEC_METADATA_KEY, Graph
from tfgraph.spec.loader import parse_spec
from tfgraph.spec.name_mismatch import mismatch_line
from tfgraph.spec.safe_yaml import MAX_BYTES
from tfgraph.spec.schema import Spec
from tfgraph.terminal import printable

__all__ = ["SPEC_METADATA_KEY", "model_graph", "stored_spec"]
_LAYER_NAME = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.")


def stored_spec(text: str, where: str) -> Spec:
    """The spec of ``text`` (JSON) validated like a spec file: the JSON is read by ``json``
    (YAML would read an escaped surrogate pair, JSON's way to write an emoji, as two lone
    surrogates), written back as YAML and read by the spec reader with its size, nesting and
    count limits. Errors name ``where``, the metadata key and the field; no line and column
    (they would point into the rewritten text, not the model's)."""
    name = f"{printable(where)}[{SPEC_METADATA_KEY}]"
    if len(text) > MAX_BYTES:
        raise SpecError(f"larger than {MAX_BYTES:,} characters; not a spec", file=name)
    try:
        data = json.loads(text)
        rewritten = yaml.safe_dump(data, sort_keys=False)
    except json.JSONDecodeError as err:
        raise SpecError(f"not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})",
                        file=name) from None
    except RecursionError:
        raise SpecError("nested too deeply; not a spec", file=name) from None
    try:
        return parse_spec(rewritten, name)
    except SpecError as err:
        for problem in {id(p): p for p in (err, *err.problems)}.values():
            problem.line = problem.col = None
        raise


def _layers_held(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    held: dict[str, int] = {}
    for name in shapes:
        match = _LAYER_NAME.match(name)
        if match:
            stack, index = match.group(1), int(match.group(2))
            held[stack] = max(held.get(stack, 0), index + 1)
    return held


def model_graph(spec: Spec, shapes: Mapping[str, tuple[int, ...]], where: str) -> Graph:
    """The graph of ``spec``, checked against the model's initializer ``shapes`` (name -> dims):
    the layer count of each stack first (cheap: names only), then, once compiled, every
    parameter (tfgraph.spec.name_mismatch)."""
    from tfgraph.compiler import compile as compile_spec

    held = _layers_held(shapes)
    for stack in spec.stacks:
        says, has = spec.layer_count(stack), held.get(stack, 0)
        if says != has:
            raise TfgraphError(f"{where}: the spec in its metadata has {says} {stack} layers, "
                               f"its weights {has}; the metadata does not describe this model")
    graph = compile_spec(spec)
    problem = mismatch_line({p.name: tuple(p.attrs["shape"]) for p in graph.params()}, shapes)
    if problem:
        raise TfgraphError(f"{where}: the spec in its metadata does not match the model's "
                           f"weights: {problem}")
    return graph
