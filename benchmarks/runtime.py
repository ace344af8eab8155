"""Inference latency on the CPU: onnxruntime on tfgraph's ONNX model against its peers.

    python benchmarks/runtime.py [--spec specs/base.yaml] [--batch 8] [--seq 128] [--repeat 10]
                                 [--threads N] [--no-export-peer]

One process, one set of weights (tfgraph.graph.weights.generate at seed 0), the same random ids for
everyone, the same intra-op thread count for every engine (default: the physical cores as
onnxruntime counts them; torch.set_num_threads to the same), inter-op parallelism off for both.
Contenders, each timed over ``--repeat`` forward passes after two warm-up passes, interleaved
round by round so that background load hits them alike:

- tfgraph ONNX (opset 23) on onnxruntime, graph optimizations ORT_ENABLE_ALL except
  SkipLayerNormFusion (slower on the CPU: see tfgraph.exporters.onnx.runtime), as
  ``tfgraph run`` does;
- tfgraph ONNX (opset 17, decomposed), same session options;
- torch eager, stock: embeddings + ``torch.nn.Transformer`` + tied head with tfgraph's weights
  copied in (benchmarks/transformer_peer.py), eval + inference_mode: the named peer of the goal
  (tfgraph's ONNX <= 1.0x torch eager);
- torch eager, tfgraph's own PyTorch back end (to_torch) on the same weights;
- ``torch.onnx.export(dynamo=True)`` of the stock model on onnxruntime, same session options.

Prints the median and p90 of each, the ratios to stock torch eager, and the largest
|difference| of each output from it (all run the same weights, so they must agree).

On a machine with a usable GPU, ``--device cuda [--dtype float16]`` runs the same comparison
with onnxruntime's CUDA provider (logits kept on the GPU through I/O binding, as torch keeps
them) against torch eager on CUDA.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from machine import load_average  # benchmarks/ is sys.path[0] when run as a script

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


def ort_session(model: bytes | str, threads: int, device: str, all_fusions: bool = False) -> Any:
    import onnxruntime as ort

    from tfgraph.exporters.onnx.runtime import CPU_DISABLED_OPTIMIZERS

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # The same options for every onnxruntime contender, tfgraph's and torch.onnx.export's.
    if device == "cuda":
        session = ort.InferenceSession(model, options,
                                       providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        if session.get_providers()[0] != "CUDAExecutionProvider":
            sys.exit("onnxruntime gave no CUDA provider: this machine has no usable GPU")
        return session
    disabled = [] if all_fusions else list(CPU_DISABLED_OPTIMIZERS)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=disabled)


class OrtContender:
    """Timed runs keep the logits where they are computed (on the GPU with CUDA)."""

    def __init__(self, session: Any, feeds: dict[str, np.ndarray], device: str) -> None:
        self.session, self.feeds, self.device = session, feeds, device
        if device == "cuda":
            self.binding = session.io_binding()
            for name, value in feeds.items():
                self.binding.bind_cpu_input(name, value)
            self.binding.bind_output(session.get_outputs()[0].name, "cuda")

    def run(self) -> None:
        if self.device == "cuda":
            self.session.run_with_iobinding(self.binding)
            self.binding.synchronize_outputs()
        else:
            self.session.run(None, self.feeds)

    def result(self) -> np.ndarray:
        if self.device == "cuda":
            self.run()
            return self.binding.copy_outputs_to_cpu()[0].astype(np.float32)
        return self.session.run(None, self.feeds)[0].astype(np.float32)


class TorchContender:
    def __init__(self, module: Any, inputs: list[Any], device: str) -> None:
        self.module, self.inputs, self.device = module, inputs, device

    def run(self) -> None:
        import torch

        with torch.inference_mode():
            self.module(*self.inputs)
        if self.device == "cuda":
            torch.cuda.synchronize()

    def result(self) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return self.module(*self.inputs).float().cpu().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(ROOT / "specs" / "base.yaml"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128, help="source and target length")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "float16"], default=None,
                        help="override the spec's dtype (float16 is for --device cuda)")
    parser.add_argument("--all-fusions", action="store_true",
                        help="onnxruntime's default rewrites, SkipLayerNormFusion included "
                             "(to measure what disabling it is worth)")
    parser.add_argument("--no-export-peer", action="store_true",
                        help="skip torch.onnx.export (slow; needs onnxscript)")
    args = parser.parse_args()
    threads = args.threads or _physical_cores()

    import onnxruntime as ort
    import torch

    import tfgraph
    from tfgraph.exporters import to_onnx, to_torch
    from tfgraph.spec.schema import Spec
    from tfgraph.graph.weights import generate

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    spec = tfgraph.load_spec(args.spec)
    if args.dtype:
        spec = Spec.model_validate({**spec.model_dump(), "dtype": args.dtype})
    graph = tfgraph.compile(spec)
    weights = generate(graph, seed=0)
    rng = np.random.default_rng(0)
    vocab = graph.spec.vocab_size("source")
    feeds = {name: rng.integers(0, vocab, (args.batch, args.seq), dtype=np.int64)
             for name in graph.inputs}
    machine = (torch.cuda.get_device_name() if args.device == "cuda"
               else f"{os.cpu_count()} CPUs, {threads} intra-op threads")
    print(f"{graph.name}: batch {args.batch}, length {args.seq} ({', '.join(graph.inputs)}), "
          f"{sum(v.size for v in weights.values()):,} params, {graph.spec.dtype}, "
          f"{args.device} ({machine}), onnxruntime {ort.__version__}, torch {torch.__version__}, "
          f"{load_average()}")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from transformer_peer import for_spec, load_tfgraph_weights

    torch_dtype = {"float32": torch.float32, "float16": torch.float16}[graph.spec.dtype]
    stock = for_spec(graph.spec).eval()
    load_tfgraph_weights(stock, weights)
    stock = stock.to(device=args.device, dtype=torch_dtype)
    ours_torch = to_torch(graph, weights=weights).eval().to(args.device)
    torch_inputs = [torch.from_numpy(feeds[name]).to(args.device) for name in graph.inputs]

    contenders: dict[str, Any] = {}
    for opset in (23, 17):
        model = to_onnx(graph, weights=weights, opset=opset).SerializeToString()
        contenders[f"tfgraph ONNX opset {opset} / onnxruntime"] = OrtContender(
            ort_session(model, threads, args.device, args.all_fusions), feeds, args.device)
    contenders[PEER] = TorchContender(stock, torch_inputs, args.device)
    contenders["torch eager, tfgraph's to_torch"] = TorchContender(ours_torch, torch_inputs,
                                                                   args.device)
    if not args.no_export_peer:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "exported.onnx")
            start = time.perf_counter()
            exported = _torch_export(stock, torch_inputs, graph.inputs, path)
            print(f"torch.onnx.export (dynamo) of the stock model took "
                  f"{time.perf_counter() - start:.1f} s")
            if exported:
                contenders[EXPORTED] = OrtContender(
                    ort_session(path, threads, args.device, args.all_fusions), feeds, args.device)

    reference = contenders[PEER].result()
    for name, contender in contenders.items():  # warm-up (also compares the outputs)
        diff = float(np.abs(contender.result() - reference).max())
        contender.run()
        print(f"  {name}: max |out - stock torch eager| = {diff:.2e}")
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeat):
        for name, contender in contenders.items():
            start = time.perf_counter()
            contender.run()
            times[name].append(time.perf_counter() - start)
    eager = statistics.median(times[PEER])
    print(f"\n{'contender':46} {'median':>9} {'p90':>9} {'vs stock eager':>15}")
    for name, values in times.items():
        values.sort()
        med = statistics.median(values)
        p90 = values[min(len(values) - 1, int(np.ceil(0.9 * len(values))) - 1)]
        print(f"{name:46} {med * 1e3:7.1f}ms {p90 * 1e3:7.1f}ms {med / eager:14.2f}x")
    print(load_average())
    ours = statistics.median(times["tfgraph ONNX opset 23 / onnxruntime"])
    print(f"goal: tfgraph ONNX (opset 23) <= 1.0x stock torch eager: {ours / eager:.2f}x "
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
