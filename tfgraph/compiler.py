"""``tfgraph.compile``: spec (or path) -> lowered, linted graph with its report on demand.

The top of the core's layering (tensor <- ops <- ir <- lower <- passes <- compiler): the IR
knows nothing of reports; the graph ``compile`` returns is a ``CompiledGraph``, which adds
``report()`` on top of the IR.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tfgraph.graph.ir import Graph
from tfgraph.graph.lengths import check_lengths, default_seq
from tfgraph.graph.lower import lower
from tfgraph.errors import TfgraphError
from tfgraph.passes.report import build_report, check_reportable
from tfgraph.spec.recheck import rechecked
from tfgraph.spec.schema import Spec


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (and back on after, if it was).

    Lowering and the report allocate tens of thousands of small objects (nodes, types, sympy
    expressions) and free almost none, so the collector's full passes, each scanning every
    object alive (sympy's caches included), ran again and again for nothing: a third of a
    96-layer compile + report, and more than a linear share at more layers."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class CompiledGraph(Graph):
    """A graph lowered from a spec, with the cost report as a method."""

    def report(self, batch: int = 1, seq: int | None = None, tgt_seq: int | None = None,
               fused_attention: bool = False, states: str = "mixed") -> dict[str, Any]:
        """The cost report (same dict as ``tfgraph report --json``); see tfgraph.passes.report.

        ``states``: the model-state convention of 16-bit training, "mixed" (16-bit gradients,
        16 bytes per parameter) or "megatron" (fp32 gradients, 18), as ``tfgraph plan
        --states`` (tfgraph.passes.figures.STATES).

        ``seq`` defaults to 128, or the spec's max_len when that is smaller (as the command).
        Lengths past the spec's max_len follow tfgraph.graph.lengths: a learned position table
        refuses them (TfgraphError), other positions are reported there with a
        BeyondMaxLenWarning.

        ``tgt_seq`` is an encoder-decoder's target length: on a model with one sequence it is
        refused (TfgraphError), as ``tfgraph report --tgt-seq``. So is the report of a
        KV-cache graph (``compile(..., cache=True)``): the report is of the full graph."""
        check_reportable(self)
        two = self.spec is not None and self.spec.arch == "encoder-decoder"
        if tgt_seq is not None and not two:
            arch = self.spec.arch if self.spec is not None else self.info.arch
            raise TfgraphError(f"tgt_seq: {self.name} is {arch} with one sequence; use seq")
        if seq is None:
            seq = default_seq(self.spec)
        check_lengths(self.spec, ("seq", seq), ("tgt_seq", tgt_seq if two else None))
        with gc_paused():
            return build_report(self, batch=batch, seq=seq, tgt_seq=tgt_seq,
                                fused_attention=fused_attention, states=states)


def compile(spec: Spec | str | Path, lint: bool = True,  # noqa: A001
            cache: bool = False, part: str | None = None, loss: bool = False
            ) -> CompiledGraph:
    """Lower ``spec`` to an op graph with symbolic shapes; ``lint`` checks it (on by default).
    ``cache``: the KV-cache inference graph of a decoder (README, "KV cache"); for an
    encoder-decoder, ``part`` "encoder" or "decoder" says which of its two graphs.
    ``loss``: the training graph: a ``labels`` input (B, L) int64 and the token
    cross-entropy ``loss`` (a float32 scalar, the graph's only output) after the logits
    (tfgraph.graph.ops_loss); what ``tfgraph.passes.train_walk`` walks.

    A ``Spec`` is validated again, as its file would be (a SpecError naming the field):
    ``spec.model_copy(update=...)`` and attribute assignment do not validate.

    Costs are computed lazily by ``graph.report(...)`` (tfgraph.passes.report) and memoised on the
    graph until it changes.
    """
    if isinstance(spec, Spec):
        # changed after it was built (model_copy(update=...), attribute assignment), a Spec
        # is not validated by pydantic: refused here as its file would be
        spec = rechecked(spec)
    elif isinstance(spec, (str, os.PathLike)):
        from tfgraph.spec.loader import load_spec

        spec = load_spec(spec)
    else:
        raise TfgraphError(f"spec: expected a tfgraph.Spec or the path of a spec file, got "
                           f"{type(spec).__name__}")
    with gc_paused():
        graph = lower(spec, None, CompiledGraph, cache, part, loss)
        if lint:  # add checked each node's attributes and type as lowering added it
            graph.lint(recheck_added=False)
    return graph


def decoding_graphs(spec: Spec, cache: bool = True) -> list[CompiledGraph]:
    """The graphs a decoding loop runs (tfgraph generate): with ``cache``, a decoder's
    KV-cache graph or an encoder-decoder's two (encoder, decoder: tfgraph.graph.lower.cache_parts);
    else, or where there is no cache graph, the full-sequence graph. An encoder has nothing
    to decode: TfgraphError."""
    from tfgraph.graph.lower import cache_parts

    check_decodes(spec)
    parts = cache_parts(spec) if cache else None
    if parts is None:
        return [compile(spec)]
    return [compile(spec, cache=True, part=part) for part in parts]


def check_decodes(spec: Spec) -> None:
    """TfgraphError unless ``spec`` has a decoder to generate with."""
    from tfgraph.errors import TfgraphError

    if spec.arch == "encoder-only":
        raise TfgraphError(f"{spec.name} is an encoder-only model: it has no decoder to "
                           "generate with")
