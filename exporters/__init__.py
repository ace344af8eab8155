"""Back ends, installed as ``tfgraph.exporters`` (README.md, "How it works").

Each back end registers a lowering per op of ``tfgraph.graph.ops.OPS`` in its own table. Names are
resolved lazily so that ``import tfgraph.exporters`` imports neither torch, onnx nor graphviz:
``to_onnx`` never pulls in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "to_torch": "tfgraph.exporters.torch.module",
    "to_onnx": "tfgraph.exporters.onnx.model",
    "parallelize": "tfgraph.exporters.torch.parallel",
    "device_mesh": "tfgraph.exporters.torch.parallel",
    "load_full_state_dict": "tfgraph.exporters.torch.parallel",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfgraph.exporters' has no attribute {name!r}")
