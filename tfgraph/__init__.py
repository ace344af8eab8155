"""tfgraph: a declarative Transformer architecture compiler (YAML spec -> op graph -> back ends).

Importing the package is cheap and needs neither torch, onnx nor graphviz; the back ends live
in ``tfgraph.exporters`` and import those libraries themselves.
"""

import importlib
from typing import Any

from tfgraph._early_signals import install as _install_early_signals

_install_early_signals()  # the `tfgraph` program only: see tfgraph/_early_signals.py

from tfgraph.compiler import compile  # noqa: E402
from tfgraph.spec.loader import dump_spec, load_spec, parse_spec  # noqa: E402
from tfgraph.spec.schema import Spec  # noqa: E402
from tfgraph.version import __version__  # noqa: E402

__all__ = ["Spec", "__version__", "compile", "dump_spec", "generate", "load_spec", "parse_spec"]

# Attributes whose module runs a back end, imported on first use so ``import tfgraph`` stays
# cheap (the pattern of tfgraph.exporters): tfgraph.generate is the API of `tfgraph generate`.
_LAZY = {"generate": "tfgraph.commands.generate_api"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfgraph' has no attribute {name!r}")
