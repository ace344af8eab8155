"""The Python API's arguments of ``plan``, ``staged`` and ``search`` refused at their entry,
one line naming the argument (TfgraphError), before anything deep inside trips on them:
a graph that is not one or that a plan does not cover (a KV-cache graph: one step over a
past of any length, no training step), a layout or GPU of another type, a graph in another
precision than the layout trains in, and ``search``'s counts and base layout.

``tfgraph plan`` builds its arguments right (it compiles the spec at the layout's dtype);
these are the mistakes a caller of the functions can make.
"""

from __future__ import annotations

import operator

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import Graph, expect_graph
from tfgraph.limits import MAX_GPUS
from tfgraph.parallel.gpus import Gpu
from tfgraph.parallel.layout import Layout

SEARCHED = ("tp", "pp", "vpp", "stage_layers", "dp", "ep", "zero", "sp", "recompute",
            "micro_batch")
"""The Layout fields ``search`` chooses itself (the CLI's options refused with --search)."""


def check_graph(graph: object, layout: object) -> Graph:
    """``graph`` when a plan of ``layout`` can be made of it; TfgraphError otherwise."""
    graph = expect_graph(graph)
    if not isinstance(layout, Layout):
        raise TfgraphError(f"layout: expected a tfgraph.parallel.layout.Layout, got "
                           f"{type(layout).__name__}")
    if graph.info.kind == "cached":
        part = f" {graph.info.part}" if graph.info.part else ""
        raise TfgraphError(f"{graph.name}: a plan is of the training graph, not the KV-cache"
                           f"{part} graph (compile with loss=True, without cache=True)")
    if graph.dtype != layout.dtype:
        raise TfgraphError(
            f"dtype: the graph is {graph.dtype} but the layout trains in {layout.dtype} "
            f"(Layout.dtype, bfloat16 by default): the activations would be counted in one "
            f"and the weights in the other; compile the spec at the layout's precision "
            f"(spec.model_copy(update={{'dtype': '{layout.dtype}'}})) or give "
            f"Layout(dtype='{graph.dtype}')")
    return graph


def check_gpu(chosen: object) -> Gpu:
    """``chosen`` when it is a Gpu; TfgraphError saying how to get one otherwise."""
    if isinstance(chosen, Gpu):
        return chosen
    shown = f"gpu({chosen!r:.40})" if isinstance(chosen, str) else "gpu('h100')"
    raise TfgraphError(f"gpu: expected a Gpu (tfgraph.parallel.gpus.{shown}), got "
                       f"{type(chosen).__name__}")


def count(name: str, value: object, maximum: int | None = None) -> int:
    """``value`` as a positive int (a numpy integer too; not a bool), at most ``maximum``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TfgraphError(f"{name} must be a positive integer, got {type(value).__name__} "
                           f"{value!r:.40}") from None
    if number < 1:
        raise TfgraphError(f"{name} must be a positive integer, got {number}")
    if maximum is not None and number > maximum:
        raise TfgraphError(f"{name} must be at most {maximum:,}, got {number:,}")
    return number


def check_search(graph: object, gpus: object, base: object, chosen: object, top: object
                 ) -> tuple[Graph, int, Gpu, int]:
    """``search``'s arguments, checked: (graph, gpus, gpu, top). The base layout gives the
    batch, lengths and precision only; a layout field ``search`` chooses (tp, pp, ...) set
    in it would be replaced without a word, so it is refused, as ``tfgraph plan --search``
    refuses those options."""
    graph = check_graph(graph, base)
    assert isinstance(base, Layout)  # check_graph's postcondition
    number = count("gpus", gpus, MAX_GPUS)
    top_n = count("top", top)
    default = Layout()
    given = [name for name in SEARCHED if getattr(base, name) != getattr(default, name)]
    if given:
        raise TfgraphError(f"base: search chooses {', '.join(given)} itself; give a Layout "
                           "with only global_batch, seq, tgt_seq, dtype, states and "
                           "grad_reduce")
    return graph, number, check_gpu(chosen), top_n
