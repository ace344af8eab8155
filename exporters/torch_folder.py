"""``tfgraph build SPEC --to torch -o DIR``: a standalone PyTorch folder.

DIR gets ``model.py`` (generated source importing only torch, see ``torch_source``),
``weights.safetensors`` (README.md's parameter names, at the spec's dtype) and ``spec.yaml`` (the spec with
every default written out). The folder appears whole or not at all: everything is written into
a temporary sibling directory first, which then replaces DIR with renames, so a failed build
leaves the old folder as it was. DIR must be new, empty, or an earlier such folder: anything
else in it is refused rather than deleted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.ir import Graph
from tfgraph.loader import dump_spec

FILES = ("model.py", "weights.safetensors", "spec.yaml")


def write_torch_folder(graph: Graph, out_dir: Path, weights: dict[str, np.ndarray] | None,
                       seed: int) -> Path:
    """Write the folder for ``graph`` at ``out_dir`` and return it.

    ``weights``: values by parameter name (checked: TfgraphError listing missing, unexpected
    and mis-shaped names), else generated from ``seed`` by tfgraph.weights.generate.
    """
    from safetensors.torch import save_file

    from tfgraph.exporters.torch_module import to_torch
    from tfgraph.exporters.torch_source import generate_source

    out_dir = Path(out_dir)
    _check_target(out_dir)
    if graph.spec is None:
        raise TfgraphError(f"{graph.name}: graph has no spec; compile it from a spec")
    # Every weight is held at once: generated in float32, then the module's (and the file
    # writer's) copy at the spec's dtype.
    from tfgraph.cost import param_count
    from tfgraph.cost import weights_bytes
    from tfgraph.io import check_capacity

    total = weights_bytes(graph)
    check_capacity(out_dir, total, total + 4 * sum(param_count(p) for p in graph.params()))
    module = to_torch(graph, seed=seed, weights=weights)  # checks names and shapes
    state = {k: v.contiguous() for k, v in module.state_dict().items()}
    try:
        stage = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    except OSError as exc:
        raise TfgraphError(f"{out_dir}: cannot write: {exc.strerror or exc}") from None
    try:
        (stage / "model.py").write_text(generate_source(graph), encoding="utf-8")
        save_file(state, os.fspath(stage / "weights.safetensors"),
                  metadata={"tfgraph.spec": graph.spec.name, "format": "pt"})
        (stage / "spec.yaml").write_text(dump_spec(graph.spec), encoding="utf-8")
        umask = _umask()
        for name in FILES:  # on disk before the rename makes the folder visible
            with open(stage / name, "rb") as handle:
                os.fsync(handle.fileno())
            os.chmod(stage / name, 0o666 & ~umask)
        os.chmod(stage, 0o777 & ~umask)
        _swap_in(stage, out_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return out_dir


def _check_target(out_dir: Path) -> None:
    if not out_dir.parent.is_dir():
        raise TfgraphError(f"{out_dir}: directory {out_dir.parent} does not exist")
    if out_dir.exists() and not out_dir.is_dir():
        raise TfgraphError(f"{out_dir}: exists and is not a directory; --to torch writes a "
                           "folder")
    if out_dir.is_dir():
        foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in FILES
                         and p.name != "__pycache__")
        if foreign:
            raise TfgraphError(f"{out_dir}: not a tfgraph torch folder (has {', '.join(foreign[:3])}"
                               f"{', ...' if len(foreign) > 3 else ''}); choose a new or empty "
                               "directory")


def _swap_in(stage: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by ``stage`` with renames; the old folder is removed afterwards."""
    if not out_dir.exists():
        os.replace(stage, out_dir)
        return
    old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
    os.rmdir(old)  # only the unique name is wanted
    os.replace(out_dir, old)
    try:
        os.replace(stage, out_dir)
    except BaseException:
        with contextlib.suppress(OSError):
            os.replace(old, out_dir)  # put the previous folder back
        raise
    shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
