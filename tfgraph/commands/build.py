"""``tfgraph build SPEC --to TARGET``: compile a spec and write one artifact (README.md, `tfgraph build`).

Targets are a table: each names its default output and a writer imported only when chosen, so
``--to onnx`` never imports torch or graphviz. Every writer writes atomically (tfgraph.io): a
failed build leaves no partial file and keeps an older one.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from tfgraph.cli_support import load_spec_arg
from tfgraph.errors import TfgraphError
from tfgraph.terminal import printable
from tfgraph.ir import Graph

# Weights above this size get a progress bar (when stderr is a terminal).
PROGRESS_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Target:
    """One ``--to`` choice: where it writes by default and how."""

    default: Callable[[str], Path]  # spec name -> default output path
    write: Callable[[Graph, Path, dict[str, Any]], Path]
    takes_weights: bool  # accepts --weights / --seed
    takes_opset: bool = False


def _write_onnx(graph: Graph, out: Path, opts: dict[str, Any]) -> Path:
    from tfgraph.cost import weights_bytes
    from tfgraph.exporters.onnx_model import write_onnx

    total = weights_bytes(graph)
    with _progress(total, f"writing {out.name}") as advance:
        return write_onnx(graph, out, weights=opts["weights"], seed=opts["seed"],
                          opset=opts["opset"], progress=advance)


def _write_torch(graph: Graph, out: Path, opts: dict[str, Any]) -> Path:
    module = importlib.import_module("tfgraph.exporters.torch_folder")
    return Path(module.write_torch_folder(graph, out, opts["weights"], opts["seed"]))


def _diagram(fmt: str) -> Callable[[Graph, Path, dict[str, Any]], Path]:
    def write(graph: Graph, out: Path, opts: dict[str, Any]) -> Path:
        module = importlib.import_module("tfgraph.exporters.diagram")
        return Path(module.write_diagram(graph, out, fmt, level="model"))

    return write


def _write_json(graph: Graph, out: Path, opts: dict[str, Any]) -> Path:
    module = importlib.import_module("tfgraph.graph_json")
    return Path(module.write_graph_json(graph, out))


TARGETS: dict[str, Target] = {
    "onnx": Target(lambda name: Path("build") / f"{name}.onnx", _write_onnx, True, True),
    "torch": Target(lambda name: Path("build") / name, _write_torch, True),
    "svg": Target(lambda name: Path("build") / f"{name}.svg", _diagram("svg"), False),
    "png": Target(lambda name: Path("build") / f"{name}.png", _diagram("png"), False),
    "dot": Target(lambda name: Path("build") / f"{name}.dot", _diagram("dot"), False),
    "json": Target(lambda name: Path("build") / f"{name}.json", _write_json, False),
}


class _progress:
    """A rich progress bar over bytes written, shown only for big builds on a terminal."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label = total, label
        self.bar: Any = None

    def __enter__(self) -> Callable[[int], None] | None:
        if self.total < PROGRESS_BYTES or not _stderr_is_terminal():
            return None
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn)

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                            TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task(self.label, total=self.total)
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    size = path.stat().st_size
    data = path.with_name(path.name + ".data")  # ONNX external weights, when written
    return size + (data.stat().st_size if data.is_file() else 0)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


@click.command()
@click.argument("spec", metavar="SPEC")
@click.option("--to", "target", required=True, type=click.Choice(list(TARGETS)),
              help="What to build.")
@click.option("-o", "--output", type=click.Path(dir_okay=True, path_type=Path),
              help="Output path (default: build/<name>.<ext>, or build/<name>/ for torch).")
@click.option("--weights", type=click.Path(dir_okay=False, path_type=Path),
              help="Parameter values from a .safetensors file (names as in the docs); "
                   "default: generated from --seed.")
@click.option("--seed", type=int, default=None,
              help="Seed of the generated weights (default 0); same seed, same weights in "
                   "every back end.")
@click.option("--opset", type=int, default=None,
              help="ONNX opset: 23 (default) uses fused Attention/RMSNormalization/"
                   "RotaryEmbedding; 17 decomposes them for older runtimes.")
def build(spec: str, target: str, output: Path | None, weights: Path | None, seed: int | None,
          opset: int | None) -> None:
    """Compile SPEC and write it as an ONNX model, a PyTorch folder, a diagram or graph JSON."""
    start = time.perf_counter()
    how = TARGETS[target]
    if not how.takes_weights:
        for flag, value in (("--weights", weights), ("--seed", seed)):
            if value is not None:
                raise TfgraphError(f"{flag} applies to --to onnx and --to torch, not {target}")
    if opset is not None and not how.takes_opset:
        raise TfgraphError(f"--opset applies to --to onnx only, not {target}")
    from tfgraph.compiler import compile as compile_spec

    graph = compile_spec(load_spec_arg(spec))
    values = None
    if weights is not None:
        from tfgraph.weights import load_weights

        values = load_weights(os.fspath(weights), graph)
    if opset is not None:
        from tfgraph.exporters.onnx_model import check_opset

        check_opset(opset)
    out = output if output is not None else how.default(graph.name)
    if target in ("svg", "png", "dot") and out.suffix.lower() != f".{target}":
        # The content follows --to, so "-o x.png --to svg" would write SVG into x.png.
        raise TfgraphError(f"{out}: --to {target} writes a .{target} file; give -o a .{target} "
                           "name (tfgraph draw picks the format from the suffix)")
    if output is None:
        out.parent.mkdir(parents=True, exist_ok=True)
    opts = {"weights": values, "seed": 0 if seed is None else seed,
            "opset": 23 if opset is None else opset}
    written = how.write(graph, out, opts)
    from tfgraph.cost import param_count

    params = sum(param_count(p) for p in graph.params())
    details = [_human(_size(written)), f"{params:,} params"]
    if target == "onnx":
        details.append(f"opset {opts['opset']}")
    if how.takes_weights:
        details.append(f"weights {weights}" if weights is not None else f"seed {opts['seed']}")
    details.append(f"{time.perf_counter() - start:.2f} s")
    click.echo(f"wrote {printable(str(written))}{os.sep if written.is_dir() else ''} ({', '.join(details)})")
