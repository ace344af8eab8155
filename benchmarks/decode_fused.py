"""Cached decoding, fused attention vs written out: the same decoder built twice with
``tfgraph build --kv-cache`` and with ``--fused-attention`` (onnxruntime's GroupQueryAttention,
packed QKV, rotary in the kernel, shared past/present buffers; exporters/onnx/fused_attention.py),
each driven by ``tfgraph.generate`` on onnxruntime (the CPU provider here; ``--provider cuda``
on a GPU, where the float16 builds are the ones to time: benchmarks/gpu.py has the row).

    python benchmarks/decode_fused.py [--rounds 3] [--new-tokens 32] [--provider cpu]

Models (random weights, float32 on the CPU): tiny-llama (94.5K parameters: each step is
onnxruntime's per-node overhead, so the node count shows) and a 30.7M Llama-style decoder
(d 512, 8 layers, 8/2 heads of 64, SwiGLU 1408, vocab 8000), at batch 1 and 8 with 16-token
prompts, and batch 1 with a 512-token prompt (attention over a long cache). Greedy, EOS
ignored. Decode tokens/s: tfgraph's Result (tokens after each row's first over the time after
the first token); rounds alternate the order of the two builds, medians printed, and the
tokens of the two builds are compared. Then the two builds' decode steps taken in turn, one
step of each alternately (2x the new tokens), median ms per step: background load on a shared
machine falls on both alike there. Also: the ONNX nodes of one layer, as written and after
onnxruntime's graph optimizations (what a step launches).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from machine import load_average  # noqa: E402

MID = {
    "name": "llama-31m", "arch": "decoder-only", "vocab": 8000, "d_model": 512,
    "layers": 8, "max_len": 2048, "dtype": "float32", "dropout": 0.0,
    "attention": {"heads": 8, "kv_heads": 2, "bias": False},
    "ffn": {"hidden": 1408, "activation": "swiglu", "bias": False},
    "norm": {"kind": "rmsnorm", "position": "pre", "eps": 1e-5},
    "embedding": {"positions": "rope", "rope_theta": 10000.0, "scale": False,
                  "tie_output": False},
}


def build(spec: Any, folder: Path) -> dict[str, Path]:
    import tfgraph
    from tfgraph.exporters.onnx.model import write_onnx

    graph = tfgraph.compile(spec, cache=True)
    paths = {}
    for kind in ("written", "fused"):
        path = folder / f"{graph.name}-{kind}" / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_onnx(graph, path, seed=0, fused_attention=kind == "fused")
        paths[kind] = path
    return paths


def nodes_per_layer(path: Path, layer: int = 1) -> tuple[int, int, dict[str, int]]:
    """(nodes of decoder layer ``layer`` as written, after onnxruntime's optimizations
    (ORT_ENABLE_ALL, CPU), the optimized op counts)."""
    import onnx
    import onnxruntime as ort

    def count(model: Any) -> collections.Counter[str]:
        return collections.Counter(
            n.op_type for n in model.graph.node
            if f"layers.{layer}." in n.name or n.name.startswith(f"present.{layer}."))

    written = count(onnx.load(str(path)))
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        optimized = count(onnx.load(options.optimized_model_filepath))
    return sum(written.values()), sum(optimized.values()), dict(sorted(optimized.items()))


def decode(path: Path, prompts: list[list[int]], new: int, provider: str
           ) -> tuple[float, list[list[int]]]:
    import tfgraph

    r = tfgraph.generate(str(path), prompts, max_new_tokens=new, eos_token_id=None,
                         provider=provider)
    assert r.decode_tokens_per_s is not None
    return r.decode_tokens_per_s, r.tokens


def interleaved_steps(paths: dict[str, Path], prompts: list[list[int]], steps: int
                      ) -> dict[str, float]:
    """Median milliseconds of one decode step of each build, the two builds' steps taken in
    turn (alternating which goes first), so background load falls on both alike: the
    steppers tfgraph generate uses (onnx_cached with I/O binding; FusedOnnx), one session
    each, after the same prefill."""
    import time

    import onnxruntime as ort

    from tfgraph.exporters.generation.cached_steppers import onnx_cached
    from tfgraph.exporters.generation.fused_stepper import FusedOnnx
    from tfgraph.exporters.onnx.runtime import CPU_DISABLED_OPTIMIZERS
    from tfgraph.generation.loop import left_pad

    def session(path: Path) -> Any:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(CPU_DISABLED_OPTIMIZERS))

    sessions = {kind: session(paths[kind]) for kind in ("written", "fused")}
    vocab = int(sessions["fused"].get_outputs()[0].shape[-1])  # the fused stepper's logits
    steppers: dict[str, Any] = {
        "written": onnx_cached(sessions["written"], vocab, None),
        "fused": FusedOnnx(sessions["fused"], vocab, None)}
    steppers["fused"].prepare(len(prompts), max(len(p) for p in prompts), steps + 1)
    ids, lengths = left_pad([np.array(p) for p in prompts])
    nxt = {k: s.prefill(ids, lengths).argmax(-1) for k, s in steppers.items()}
    times: dict[str, list[float]] = {k: [] for k in steppers}
    for i in range(steps):
        for kind in (("written", "fused") if i % 2 == 0 else ("fused", "written")):
            start = time.perf_counter()
            nxt[kind] = steppers[kind].step(nxt[kind]).argmax(-1)
            times[kind].append(time.perf_counter() - start)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--quick", action="store_true",
                        help="tiny-llama only, one round of 4 tokens: that the script runs "
                             "(tests/test_decode_benchmarks.py)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.new_tokens = 1, 4
    import tfgraph
    from tfgraph.spec.schema import Spec

    print(f"{os.cpu_count()} CPUs, {load_average()} at the start; provider {args.provider}; "
          f"median of {args.rounds} alternating rounds; {args.new_tokens} new tokens")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="tfgraph-fused-") as tmp:
        cases = [("tiny-llama", tfgraph.load_spec(ROOT / "specs" / "tiny-llama.yaml")),
                 ("llama-31m", Spec.model_validate(MID))][:1 if args.quick else 2]
        for label, spec in cases:
            paths = build(spec, Path(tmp))
            for kind, path in paths.items():
                w, o, ops = nodes_per_layer(path)
                print(f"{label} {kind}: {w} ONNX nodes per layer as written, {o} after "
                      f"onnxruntime's optimizations: {ops}")
            vocab = spec.vocab_size("source")
            shapes = [(1, 16), (8, 16)] + ([(1, 512)] if label == "llama-31m" else [])
            for batch, length in shapes:
                prompts = [[int(t) for t in rng.integers(0, vocab, length)]
                           for _ in range(batch)]
                for path in paths.values():  # warm-up: sessions, allocations
                    decode(path, prompts, 4, args.provider)
                rates: dict[str, list[float]] = {"written": [], "fused": []}
                tokens: dict[str, list[list[int]]] = {}
                for r in range(args.rounds):
                    order = list(paths) if r % 2 == 0 else list(paths)[::-1]
                    for kind in order:
                        rate, tokens[kind] = decode(paths[kind], prompts, args.new_tokens,
                                                    args.provider)
                        rates[kind].append(rate)
                med = {k: statistics.median(v) for k, v in rates.items()}
                same = "same tokens" if tokens["written"] == tokens["fused"] else \
                    "TOKENS DIFFER"
                ms = interleaved_steps(paths, prompts, 2 * args.new_tokens)
                print(f"  {label}, batch {batch}, prompt {length}, steps taken in turn: "
                      f"written out {ms['written']:.3f} ms/step, fused {ms['fused']:.3f} "
                      f"ms/step: {ms['written'] / ms['fused']:.2f}x")
                print(f"  {label}, batch {batch}, prompt {length}: written out "
                      f"{med['written']:,.1f} tokens/s (rounds "
                      f"{[round(x, 1) for x in rates['written']]}), fused "
                      f"{med['fused']:,.1f} (rounds {[round(x, 1) for x in rates['fused']]}): "
                      f"{med['fused'] / med['written']:.2f}x; {same}")
    print(f"{load_average()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
