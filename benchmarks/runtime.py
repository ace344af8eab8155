"""Inference latency on the CPU: onnxruntime on tfgraph's ONNX model against its peers.

    python benchmarks/runtime.py [--spec specs/base.yaml] [--batch 8] [--seq 128] [--repeat 10]
                                 [--threads N] [--no-export-peer]

One process, one set of weights (tfgraph.weights.generate at seed 0), the same random ids for
everyone, the same intra-op thread count for every engine (default: the physical cores as
onnxruntime counts them; torch.set_num_threads to the same), inter-op parallelism off for both.
Contenders, each timed over ``--repeat`` forward passes after two warm-up passes, interleaved
round by round so that background load hits them alike:

- tfgraph ONNX (opset 23) on onnxruntime, graph optimizations ORT_ENABLE_ALL except
  SkipLayerNormFusion (slower on the CPU: see tfgraph.exporters.onnx_runtime), as
  ``tfgraph run`` does;
- tfgraph ONNX (opset 17, decomposed), same session options;
- torch eager, stock: embeddings + ``torch.nn.Transformer`` + tied head with tfgraph's weights
  copied in (benchmarks/transformer_peer.py), eval + inference_mode: the named peer of the goal
  (tfgraph's ONNX <= 1.0x torch eager);
- torch eager, tfgraph's own PyTorch back end (to_torch) on the same weights;
- ``torch.onnx.export(dynamo=True)`` of the stock model on onnxruntime, same session options.

Prints the median and p90 of each, the ratios to stock torch eager, and the largest
|difference| of each output from it (all run the same weights, so they must agree).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PEER = "torch eager, stock nn.Transformer"
EXPORTED = "torch.onnx.export(stock) / onnxruntime"


def _physical_cores() -> int:
    try:  # physical cores, as onnxruntime's default thread pool counts them
        with open("/proc/cpuinfo") as f:
            pairs = {line for line in f if line.startswith(("physical id", "core id"))}
        cores = len(pairs) - len({p for p in pairs if p.startswith("physical id")})
        return max(1, cores) if cores > 0 else (os.cpu_count() or 1)
    except OSError:
        return os.cpu_count() or 1


def ort_session(model: bytes | str, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    from tfgraph.exporters.onnx_runtime import CPU_DISABLED_OPTIMIZERS

    # The same options for every onnxruntime contender, tfgraph's and torch.onnx.export's.
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(CPU_DISABLED_OPTIMIZERS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(ROOT / "specs" / "base.yaml"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128, help="source and target length")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-export-peer", action="store_true",
                        help="skip torch.onnx.export (slow; needs onnxscript)")
    args = parser.parse_args()
    threads = args.threads or _physical_cores()

    import onnxruntime as ort
    import torch

    import tfgraph
    from tfgraph.exporters import to_onnx, to_torch
    from tfgraph.weights import generate

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    graph = tfgraph.compile(args.spec)
    weights = generate(graph, seed=0)
    rng = np.random.default_rng(0)
    vocab = graph.spec.vocab_size("source")
    feeds = {name: rng.integers(0, vocab, (args.batch, args.seq), dtype=np.int64)
             for name in graph.inputs}
    print(f"{graph.name}: batch {args.batch}, length {args.seq} ({', '.join(graph.inputs)}), "
          f"{sum(v.size for v in weights.values()):,} params, {graph.spec.dtype}, "
          f"{threads} intra-op threads, onnxruntime {ort.__version__}, torch {torch.__version__}")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from transformer_peer import for_spec, load_tfgraph_weights

    stock = for_spec(graph.spec).eval()
    load_tfgraph_weights(stock, weights)
    ours_torch = to_torch(graph, weights=weights).eval()
    torch_inputs = [torch.from_numpy(feeds[name]) for name in graph.inputs]

    def eager(module: Any) -> Callable[[], np.ndarray]:
        def forward() -> np.ndarray:
            with torch.inference_mode():
                return module(*torch_inputs).numpy()

        return forward

    contenders: dict[str, Callable[[], np.ndarray]] = {}
    for opset in (23, 17):
        session = ort_session(to_onnx(graph, weights=weights, opset=opset).SerializeToString(),
                              threads)
        contenders[f"tfgraph ONNX opset {opset} / onnxruntime"] = (
            lambda s=session: s.run(None, feeds)[0])
    contenders[PEER] = torch_eager = eager(stock)
    contenders["torch eager, tfgraph's to_torch"] = eager(ours_torch)
    if not args.no_export_peer:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "exported.onnx")
            start = time.perf_counter()
            exported = _torch_export(stock, torch_inputs, graph.inputs, path)
            print(f"torch.onnx.export (dynamo) of the stock model took "
                  f"{time.perf_counter() - start:.1f} s")
            if exported:
                session = ort_session(path, threads)
                contenders[EXPORTED] = lambda s=session: s.run(None, feeds)[0]

    reference = torch_eager()
    for name, fn in contenders.items():  # warm-up (also compares the outputs)
        out = fn()
        fn()
        diff = float(np.abs(out - reference).max())
        print(f"  {name}: max |out - stock torch eager| = {diff:.2e}")
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeat):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    eager = statistics.median(times[PEER])
    print(f"\n{'contender':46} {'median':>9} {'p90':>9} {'vs stock eager':>15}")
    for name, values in times.items():
        values.sort()
        med = statistics.median(values)
        p90 = values[min(len(values) - 1, int(np.ceil(0.9 * len(values))) - 1)]
        print(f"{name:46} {med * 1e3:7.1f}ms {p90 * 1e3:7.1f}ms {med / eager:14.2f}x")
    ours = statistics.median(times["tfgraph ONNX opset 23 / onnxruntime"])
    print(f"\ngoal: tfgraph ONNX (opset 23) <= 1.0x stock torch eager: {ours / eager:.2f}x "
          f"({'met' if ours <= eager else 'NOT met'})")
    if EXPORTED in times:
        print(f"tfgraph ONNX is {statistics.median(times[EXPORTED]) / ours:.2f}x as fast as "
              "torch.onnx.export's ONNX, both on onnxruntime")


def _torch_export(module: Any, inputs: list[Any], names: list[str], path: str) -> bool:
    import torch

    batch = torch.export.Dim("batch", min=1, max=1024)
    lengths = {"input_ids": torch.export.Dim("seq_len", min=2, max=4096),
               "src_ids": torch.export.Dim("src_len", min=2, max=4096),
               "tgt_ids": torch.export.Dim("tgt_len", min=2, max=4096)}
    shapes = {name: {0: batch, 1: lengths[name]} for name in names}
    try:
        torch.onnx.export(module, tuple(inputs), path, dynamo=True, input_names=list(names),
                          output_names=["logits"], dynamic_shapes=shapes, verbose=False)
    except Exception as err:  # noqa: BLE001 - report and go on with the other contenders
        print(f"torch.onnx.export failed: {type(err).__name__}: {str(err)[:300]}",
              file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    main()
