"""``tfgraph build SPEC --to hf -o DIR``: a Hugging Face model folder transformers loads.

DIR gets ``config.json`` (tfgraph.hf.export_config: the family whose config imports back to
the very spec), ``model.safetensors`` in the names and layout ``save_pretrained`` writes (the
family's name map, ``layout="disk"``: fused tensors fused back, per-expert MoE matrices, tied
tables once, config-fixed buffers rebuilt) and, when the weights came from a Hugging Face
folder, its tokenizer and generation files (tfgraph.hf.tokenizer); without ``--dtype`` each
tensor keeps the dtype its checkpoint stores it in. The weights are streamed: each Hugging
Face tensor is written as soon as the parameters it is made of have been produced (in graph
order), so memory holds a fused tensor's parts at most, never the model. The folder appears whole or not at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfgraph.hf.names import HFTensor, NameMap
from tfgraph.hf.tokenizer import FILES as TOKENIZER_FILES, side_file_bytes
from tfgraph.graph.ir import Graph

FILES = ("config.json", "model.safetensors")
KIND = "Hugging Face folder"
"""What the folder is called in refusals (tfgraph.exporters.files.staged_folder)."""


def write_order(tensors: list[HFTensor], params: Sequence[str]) -> list[HFTensor]:
    """``tensors`` in the order they are complete when ``params`` arrive one by one."""
    waiting: dict[str, list[HFTensor]] = {}
    for t in tensors:
        for part in set(t.parts):
            waiting.setdefault(part, []).append(t)
    seen: set[str] = set()
    done: set[str] = set()
    order: list[HFTensor] = []
    for name in params:
        seen.add(name)
        for t in waiting.get(name, ()):
            if t.name not in done and all(p in seen for p in t.parts):
                done.add(t.name)
                order.append(t)
    return order


def _hf_values(order: list[HFTensor], stream: Iterator[tuple[str, np.ndarray]],
               buffers: Mapping[str, np.ndarray]) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, value) in ``order`` from tfgraph (name, value) in graph order;
    a parameter is dropped once every tensor made of it has been written."""
    uses: dict[str, int] = {}
    for t in order:
        for part in t.parts:
            uses[part] = uses.get(part, 0) + 1
    held: dict[str, np.ndarray] = {}
    pending = iter(order)
    current = next(pending, None)
    for name, value in stream:
        held[name] = value
        while current is not None and all(p in held for p in current.parts):
            yield current.name, current.fuse([held[p] for p in current.parts])
            for part in current.parts:
                uses[part] -= 1
                if not uses[part]:
                    del held[part]
            current = next(pending, None)
    yield from buffers.items()


def _generation_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's token ids as generation_config.json holds them (what save_pretrained
    writes: transformers' GenerationConfig.from_model_config takes the same keys)."""
    keys = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
    return {k: config[k] for k in keys if config.get(k) is not None}


def write_hf_folder(graph: Graph, out_dir: Path, config: Mapping[str, Any], names: NameMap,
                    weights: Mapping[str, Any] | None, seed: int,
                    extra_files: Sequence[Path] = (),
                    progress: Callable[[int], None] | None = None,
                    stored: Mapping[str, str] | None = None) -> Path:
    """Write ``graph``'s weights as a Hugging Face folder at ``out_dir``: ``config`` as its
    config.json, the tensors under ``names`` (both from
    tfgraph.hf.export_config.hf_folder_facts, which the build command asks; it raises
    TfgraphError when no Hugging Face family expresses the spec exactly).

    ``weights`` as for the other back ends (checked), else generated from ``seed``.
    ``stored``: Hugging Face name -> dtype of the tensors to write in a dtype of their own
    (the source checkpoint's), the others in the graph's dtype.
    """
    from tfgraph.passes.cost import weights_bytes
    from tfgraph.exporters.onnx.model import parameter_values
    from tfgraph.exporters.onnx.weights import write_memory_bytes
    from tfgraph.exporters.files.safetensors_writer import Entry, write_safetensors
    from tfgraph.exporters.files.staged_folder import staged_folder
    from tfgraph.io import check_capacity

    params = graph.params()
    shapes = {p.name: tuple(p.attrs["shape"]) for p in params}
    order = write_order(names.hf_tensors(shapes, aliases=False, layout="disk"), list(shapes))
    buffers = names.generated(np.zeros((), dtype=np.float32), layout="disk")
    stored = stored or {}
    entries = [Entry(t.name, stored.get(t.name, graph.dtype), t.shape(shapes)) for t in order]
    entries += [Entry(n, stored.get(n, graph.dtype), tuple(v.shape))
                for n, v in buffers.items()]
    out_dir = Path(out_dir)
    # tensors kept in a wider stored dtype take more than the graph's dtype says
    check_capacity(out_dir, max(weights_bytes(graph), sum(e.nbytes for e in entries)),
                   write_memory_bytes(graph))
    stream = parameter_values(graph, weights, seed)  # checks names and shapes first
    try:
        with staged_folder(out_dir, FILES + TOKENIZER_FILES, KIND) as stage:
            (stage / "config.json").write_text(json.dumps(config, indent=2) + "\n",
                                               encoding="utf-8")
            values = _hf_values(order, ((p.name, v) for p, v in stream), buffers)
            write_safetensors(stage / "model.safetensors", entries, values, {"format": "pt"},
                              progress)
            for extra in extra_files:  # as the source folder has them (tfgraph.hf.tokenizer)
                (stage / extra.name).write_bytes(side_file_bytes(extra))
            generation = _generation_config(config)
            if generation and not any(e.name == "generation_config.json" for e in extra_files):
                (stage / "generation_config.json").write_text(
                    json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    finally:
        stream.close()
    return out_dir
