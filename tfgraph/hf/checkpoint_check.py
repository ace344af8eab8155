"""A checkpoint's headers checked against the model its config.json describes, in the
checkpoint's own terms.

The back ends check given weights against the graph too (tfgraph.graph.weights.check_weights), but in
tfgraph's parameter names, which a user of a Hugging Face folder never wrote and cannot find in
their files. Here every problem is one line naming the file and the Hugging Face tensor to look
at (a tensor the model has no place for, a shape the config does not give, a tensor the model
needs and no file holds: tfgraph.hf.checkpoint.Checkpoint.open has refused a tensor a shard
holds and the index does not list), before any weight is read or any output written.
"""

from __future__ import annotations

from collections.abc import Mapping

from tfgraph.hf.checkpoint import Checkpoint, CheckpointError, TensorInfo
from tfgraph.hf.names import NameMap, NameMapError

Shape = tuple[int, ...]


def check_checkpoint(checkpoint: Checkpoint, names: NameMap, expected: Mapping[str, Shape]
                     ) -> None:
    """Refuse ``checkpoint`` unless its tensors, through ``names``, make exactly the parameters
    ``expected`` (tfgraph name -> shape: the graph's)."""
    found: set[str] = set()
    for hf, info in checkpoint.tensors.items():
        for ours, shape in _parts(names, hf, info):
            found.add(ours)
            want = expected.get(ours)
            if want is None:
                raise CheckpointError(f"{info.file}: {info.key} has no place in config.json's "
                                      f"model (it would be {ours})")
            if tuple(want) != shape:
                hf_want = _hf_shape(names, hf, info, expected)
                needs = (f"{list(hf_want)}" if hf_want is not None else
                         f"{ours} {list(want)}, and this makes it {list(shape)}")
                raise CheckpointError(f"{info.file}: {info.key} is {list(info.shape)}, but "
                                      f"config.json's model needs {needs}")
    missing = [ours for ours in expected if ours not in found]
    if missing:
        wanted = _hf_names(names, missing) or missing
        more = f" ({len(wanted)} tensors missing)" if len(wanted) > 1 else ""
        raise CheckpointError(f"{checkpoint.folder}: no file holds {wanted[0]}, which "
                              f"config.json's model needs{more}")


def _parts(names: NameMap, hf: str, info: TensorInfo) -> list[tuple[str, Shape]]:
    """The tfgraph (name, shape) pairs tensor ``hf`` makes (one expert: its stacked parameter)."""
    slot = names.expert_slot(hf)
    if slot is not None:
        return [(slot[0], (slot[2], *info.shape))]
    return names.shapes_one(hf, info.shape)


def _hf_shape(names: NameMap, hf: str, info: TensorInfo, expected: Mapping[str, Shape]
              ) -> Shape | None:
    """The shape ``hf`` should have for the parameters ``expected`` (None when that cannot be
    said, e.g. a part the model lacks)."""
    parts = [ours for ours, _ in _parts(names, hf, info)]
    if any(ours not in expected for ours in parts):
        return None
    for layout in ("disk", "memory"):
        try:
            tensors = names.hf_tensors(parts, layout=layout)
        except NameMapError:
            continue
        for tensor in tensors:
            if tensor.name == hf:
                return tensor.shape(expected)
    return None


def _hf_names(names: NameMap, ours: list[str]) -> list[str]:
    """The Hugging Face tensors holding the parameters ``ours``, as ``save_pretrained`` names
    them (empty when the map cannot say)."""
    try:
        return [t.name for t in names.hf_tensors(ours, aliases=False, layout="disk")]
    except NameMapError:
        return []
