"""The installed package's version (``tfgraph.__version__``), in a module of its own so that a
back end can stamp it on what it writes without importing the package's ``__init__``."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tfgraph")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.1.0"
