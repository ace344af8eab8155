"""Forward latency of tfgraph's PyTorch module against hand-written torch.nn.Transformer.

    python benchmarks/torch_forward.py [--spec specs/base.yaml] [--batch 8] [--seq 128]
                                       [--tgt-seq 128] [--repeat 9] [--threads N]

Contenders, same process, same weights (tfgraph.graph.weights.generate, seed 0), same ids, CPU,
eval mode under torch.no_grad():

- tfgraph: ``to_torch(graph)`` (SDPA attention, the default);
- peer: token embedding + ``torch.nn.Transformer`` + tied head, written by hand in
  ``benchmarks/transformer_peer.py`` (its encoder takes PyTorch's fused inference fast path,
  ``torch._transformer_encoder_layer_fwd``, whenever it applies).

Two warm-up passes each, then ``--repeat`` rounds that run both back to back, alternating
which goes first, so background load hits them alike. Prints each contender's median, the
ratio of the medians tfgraph / peer (goal <= 1.0), the median of the per-round ratios (the
paired figure: on a shared machine whose load changes from second to second it is the steadier
one) and the largest |difference| between their logits (they compute the same function).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def _time(fn: Callable[[], torch.Tensor]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(ROOT / "specs" / "base.yaml"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--tgt-seq", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import tfgraph
    from tfgraph.exporters import to_torch
    from tfgraph.graph.weights import generate
    from transformer_peer import for_spec, load_tfgraph_weights

    graph = tfgraph.compile(args.spec)
    spec = graph.spec
    weights = generate(graph, 0)
    ours = to_torch(graph, weights=weights).eval()
    peer = for_spec(spec).eval()
    load_tfgraph_weights(peer, weights)
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, spec.vocab_size("source"), (args.batch, args.seq), generator=gen)
    tgt = torch.randint(0, spec.vocab_size("target"), (args.batch, args.tgt_seq), generator=gen)

    contenders = {"tfgraph to_torch": lambda: ours(src, tgt),
                  "torch.nn.Transformer": lambda: peer(src, tgt)}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    with torch.no_grad():
        diff = (ours(src, tgt) - peer(src, tgt)).abs().max().item()
        for fn in contenders.values():  # second warm-up pass each
            fn()
        names = list(contenders)
        for r in range(args.repeat):
            for name in names if r % 2 == 0 else names[::-1]:
                times[name].append(_time(contenders[name]))

    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"spec {spec.name}: batch {args.batch}, source {args.seq}, target {args.tgt_seq}, "
          f"{spec.dtype}, CPU, eval + no_grad, {torch.get_num_threads()} threads, "
          f"{args.repeat} rounds")
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}")
    for name, m in med.items():
        spread = f"min {min(times[name]) * 1e3:.1f} ms, max {max(times[name]) * 1e3:.1f} ms"
        print(f"  {name:22s} median {m * 1e3:9.1f} ms  ({spread})")
    ours_t, peer_t = times["tfgraph to_torch"], times["torch.nn.Transformer"]
    ratio = med["tfgraph to_torch"] / med["torch.nn.Transformer"]
    paired = statistics.median(a / b for a, b in zip(ours_t, peer_t))
    print(f"ratio tfgraph / torch.nn.Transformer = {ratio:.3f} (medians; goal <= 1.0), "
          f"{paired:.3f} (median of per-round ratios)")
    print(f"max |logits difference| = {diff:.2e}")


if __name__ == "__main__":
    main()
