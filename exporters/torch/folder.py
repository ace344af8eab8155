"""``tfgraph build SPEC --to torch -o DIR``: a standalone PyTorch folder.

DIR gets ``model.py`` (generated source importing only torch, see ``torch_source``),
``weights.safetensors`` (README.md's parameter names, at the spec's dtype), ``spec.yaml`` (the
spec with every default written out) and, when the weights come from a Hugging Face folder,
its tokenizer files. The folder appears whole or not at all (``staged_folder``). The weights
are streamed to the file one parameter at a time (``safetensors_writer``), never held all at
once: no module is built, so a checkpoint larger than memory still converts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tfgraph.errors import TfgraphError
from tfgraph.hf.tokenizer import FILES as TOKENIZER_FILES
from tfgraph.graph.ir import Graph
from tfgraph.graph.ir import SPEC_METADATA_KEY

FILES = ("model.py", "weights.safetensors", "spec.yaml")
KIND = "tfgraph torch folder"
"""What the folder is called in refusals (tfgraph.exporters.files.staged_folder)."""

def write_torch_folder(graph: Graph, out_dir: Path, weights: Mapping[str, Any] | None,
                       seed: int, extra_files: Sequence[Path] = (),
                       progress: Callable[[int], None] | None = None) -> Path:
    """Write the folder for ``graph`` at ``out_dir`` and return it.

    ``weights``: values by parameter name (checked: TfgraphError listing missing, unexpected
    and mis-shaped names), else generated from ``seed`` by tfgraph.graph.weights (the values
    ``to_torch(graph, seed)`` holds). ``extra_files`` (tokenizer files) are copied in.
    """
    from tfgraph.passes.cost import weights_bytes
    from tfgraph.exporters.onnx.model import written_values
    from tfgraph.exporters.onnx.weights import write_memory_bytes
    from tfgraph.exporters.files.safetensors_writer import Entry, write_safetensors
    from tfgraph.exporters.files.staged_folder import staged_folder
    from tfgraph.exporters.torch.source import generate_source
    from tfgraph.io import check_capacity

    out_dir = Path(out_dir)
    source = graph.info.source
    if source is None:
        raise TfgraphError(f"{graph.name}: graph has no spec; compile it from a spec")
    check_capacity(out_dir, weights_bytes(graph), write_memory_bytes(graph))
    params = graph.params()
    entries = [Entry(p.name, p.type.dtype, tuple(p.attrs["shape"])) for p in params]
    stream = written_values(graph, weights, seed)  # checks names and shapes first
    names = FILES + TOKENIZER_FILES
    try:
        with staged_folder(out_dir, names, KIND) as stage:
            (stage / "model.py").write_text(generate_source(graph), encoding="utf-8")
            write_safetensors(stage / "weights.safetensors", entries,
                              ((p.name, value) for p, value in stream),
                              {SPEC_METADATA_KEY: source.name, "format": "pt"}, progress)
            (stage / "spec.yaml").write_text(source.yaml(), encoding="utf-8")
            for extra in extra_files:
                (stage / extra.name).write_bytes(extra.read_bytes())
    finally:
        stream.close()
    return out_dir
