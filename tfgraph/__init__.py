"""tfgraph: a declarative Transformer architecture compiler (YAML spec -> op graph -> back ends).

Importing the package is cheap and needs neither torch, onnx nor graphviz; the back ends live
in ``tfgraph.exporters`` and import those libraries themselves.
"""

from importlib.metadata import PackageNotFoundError, version

from tfgraph.compiler import compile
from tfgraph.loader import dump_spec, load_spec, parse_spec
from tfgraph.spec import Spec

try:
    __version__ = version("tfgraph")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.1.0"

__all__ = ["Spec", "__version__", "compile", "dump_spec", "load_spec", "parse_spec"]
