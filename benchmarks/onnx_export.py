"""Whole-process time to an ONNX file of the base Transformer: tfgraph vs torch.onnx.export.

    python benchmarks/onnx_export.py [--spec specs/base.yaml] [--repeat 3]

Both sides are timed as what a user waits for, a fresh process from start to written file:

- tfgraph: ``python -m tfgraph build SPEC --to onnx -o FILE`` (spec -> graph -> weights from the
  shared generator -> ONNX written atomically);
- the named peer: a fresh ``python`` that imports torch, builds the equivalent stock model
  (embeddings + ``torch.nn.Transformer`` + tied head, benchmarks/transformer_peer.py) and calls
  ``torch.onnx.export(..., dynamo=True)``, in two variants:
  - dynamic: batch and lengths dynamic, as tfgraph's model has them (the equivalent artifact);
  - static: example shapes baked in, the exporter's fastest configuration (its model only runs
    at batch 2, length 16). The headline ratio is against this, the faster of the two.

Runs alternate (tfgraph, peer, peer, tfgraph, ...) so background load hits all alike; the
medians and the ratios are printed (goal: tfgraph >= 10x faster). To say where tfgraph's own
time goes, the same run also times a process that only imports what ``tfgraph build`` imports,
and the build's own closing line (its time after imports).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import load_average  # benchmarks/ is sys.path[0] when run as a script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GOAL = 10.0

PEER = r"""
import sys, time
sys.path.insert(0, {here!r})
import torch
import tfgraph
from transformer_peer import for_spec
spec = tfgraph.load_spec({spec!r})
model = for_spec(spec).eval()
src = torch.randint(0, spec.vocab_size("source"), (2, 16))
tgt = torch.randint(0, spec.vocab_size("target"), (2, 16))
batch = torch.export.Dim("batch", min=1, max=1024)
shapes = {{"src_ids": {{0: batch, 1: torch.export.Dim("src_len", min=2, max=4096)}},
          "tgt_ids": {{0: batch, 1: torch.export.Dim("tgt_len", min=2, max=4096)}}}}
if {static}:
    shapes = None
torch.onnx.export(model, (src, tgt), {out!r}, dynamo=True, input_names=["src_ids", "tgt_ids"],
                  output_names=["logits"], dynamic_shapes=shapes, verbose=False)
"""

IMPORTS_ONLY = ("import tfgraph.cli, tfgraph.compiler, tfgraph.exporters.onnx.model, "
                "tfgraph.graph.weights")


def timed(cmd: list[str], cwd: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-2000:]}")
    return elapsed, done.stdout


def main() -> None:
    try:  # the peer's torch.onnx.export(dynamo=True) needs it (pyproject's bench extra)
        import onnxscript  # noqa: F401
    except ImportError:
        sys.exit("onnx_export.py: the peer (torch.onnx.export, dynamo=True) needs onnxscript: "
                 "pip install -e '.[bench]'")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(ROOT / "specs" / "base.yaml"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spec = os.path.abspath(args.spec)
    start_load = load_average()
    ours: list[float] = []
    inner: list[float] = []
    imports: list[float] = []
    peers: dict[str, list[float]] = {"dynamic": [], "static": []}
    with tempfile.TemporaryDirectory() as tmp:
        ours_out = os.path.join(tmp, "tfgraph.onnx")
        code = {kind: PEER.format(here=str(HERE), spec=spec, static=kind == "static",
                                  out=os.path.join(tmp, f"peer-{kind}.onnx"))
                for kind in peers}
        for _ in range(args.repeat):
            t, out = timed([sys.executable, "-m", "tfgraph", "build", spec, "--to", "onnx",
                            "-o", ours_out], tmp)
            ours.append(t)
            closing = re.search(r", ([\d.]+) s\)$", out.strip())  # the build's own time
            assert closing, out
            inner.append(float(closing.group(1)))
            for kind in peers:
                peers[kind].append(timed([sys.executable, "-c", code[kind]], tmp)[0])
            imports.append(timed([sys.executable, "-c", IMPORTS_ONLY], tmp)[0])
        size = os.path.getsize(ours_out)
    med = statistics.median

    def runs(values: list[float]) -> str:
        return ", ".join(f"{t:.2f}" for t in values)

    print(f"{Path(spec).name}, whole process, median of {args.repeat} alternating runs "
          f"({os.cpu_count()} CPUs; at the start {start_load}, at the end {load_average()}):")
    print(f"  tfgraph build --to onnx                      {med(ours):6.2f} s  "
          f"(file {size / 1e6:.1f} MB; runs {runs(ours)})")
    print(f"    of which python + imports                  {med(imports):6.2f} s")
    print(f"    of which the build itself                  {med(inner):6.2f} s  "
          "(lower, generate weights, write)")
    for kind, values in peers.items():
        print(f"  torch.onnx.export(dynamo=True), {kind:8}     {med(values):6.2f} s  "
              f"(runs {runs(values)}): {med(values) / med(ours):.1f}x tfgraph's time")
    theirs = min(med(values) for values in peers.values())
    ratio = theirs / med(ours)
    print(f"tfgraph is {ratio:.1f}x faster than the faster torch.onnx.export variant "
          f"(goal >= {GOAL:.0f}x: {'met' if ratio >= GOAL else 'NOT met'})")


if __name__ == "__main__":
    main()
