"""The eager kernel count behind ``tfgraph plan --kernels eager``, checked on a second module:
transformers' ``LlamaForCausalLM`` beside tfgraph's own, the training step measured on GPUs.

    python benchmarks/eager_step.py

Both modules (TinyLlama-1.1B sizes, ``specs/llama.yaml``; bfloat16; SDPA; batch 4 x 1024;
forward + token cross-entropy on float32 logits + backward, benchmarks/gpu.py's step) run on
the meta device under ``exporters.torch.kernels.record``: every ATen kernel with its bytes, GEMM
dimensions and flash FLOPs, CUDA's fused SDPA as one kernel. Each is timed as the planner times
it (``tfgraph.parallel.timing.kernel_seconds``, the cited rates of ``tfgraph/parallel/gpus.py``):
nothing here is measured or fitted. transformers' RMSNorm is Python (a float32 upcast, a square,
a mean, a reciprocal square root, two products and a downcast); tfgraph's calls ``F.rms_norm``,
which CUDA runs fused: the count predicts how much slower transformers' step is, and the
measurements (issue 26's H100, benchmarks/RESULTS.md's two H200 machines) say how much slower it
was. The absolute times are the plan's (``--kernels eager``), and its gap to the measured steps
shows beside them.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

import tfgraph  # noqa: E402
from tfgraph.exporters import to_torch  # noqa: E402
from tfgraph.exporters.torch.kernels import Kernel, record  # noqa: E402
from tfgraph.hf.export_config import hf_config  # noqa: E402
from tfgraph.parallel.gpus import gpu  # noqa: E402
from tfgraph.parallel.timing import kernel_seconds  # noqa: E402

BATCH, SEQ = 4, 1024
# (GPU row, tfgraph ms, transformers ms, where): the same step on the same machine
MEASURED = [("h100", 66.7, 92.9, "issue 26 (H100 80GB)"),
            ("h200", 61.0, 81.0, "RESULTS.md \"On a GPU\", H200"),
            ("h200", 69.9, 85.8, "RESULTS.md \"On a GPU\", second H200")]


def step_of(model: torch.nn.Module, hf: bool) -> Callable[[], None]:
    ids = torch.empty((BATCH, SEQ), dtype=torch.long, device="meta")

    def step() -> None:
        logits = model(ids).logits if hf else model(ids)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        torch.autograd.backward(loss, torch.empty_like(loss))
    return step


def modules() -> dict[str, tuple[torch.nn.Module, bool]]:
    spec = tfgraph.load_spec(ROOT / "specs" / "llama.yaml").model_copy(
        update={"dtype": "bfloat16"})
    ours = to_torch(tfgraph.compile(spec), device="meta").train()
    exported = hf_config(spec)  # the config.json `build --to hf` writes (a Llama)
    config = transformers.AutoConfig.for_model(**exported.config)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).train()
    n_ours = sum(p.numel() for p in ours.parameters())
    n_hf = sum(p.numel() for p in hf.parameters())
    assert n_ours == n_hf, (n_ours, n_hf)  # the same model
    return {"tfgraph": (ours, False), "transformers": (hf, True)}


def seconds(kernels: list[Kernel], row: str) -> Counter[str]:
    device = gpu(row)
    parts: Counter[str] = Counter()
    for k in kernels:
        parts[k.kind] += kernel_seconds(k, device, device.peak_flops, 2)
    return parts


def main() -> int:
    recorded = {name: record(step_of(model, hf)) for name, (model, hf) in modules().items()}
    for name, kernels in recorded.items():
        memory = [k for k in kernels if k.kind == "memory"]
        print(f"{name}: {len(kernels)} kernels, {len(memory)} memory-bound moving "
              f"{sum(k.nbytes for k in memory) / 1e9:.1f} GB")
    print(f"{'GPU row':8} {'module':13} {'gemm ms':>8} {'attn ms':>8} {'memory ms':>9} "
          f"{'predicted':>9} {'measured':>9} {'meas/pred':>9}")
    done: dict[str, dict[str, float]] = {}
    for row, ours_ms, hf_ms, where in MEASURED:
        if row not in done:
            done[row] = {}
            for name, kernels in recorded.items():
                parts = seconds(kernels, row)
                done[row][name] = sum(parts.values()) * 1e3
                print(f"{row:8} {name:13} {parts['gemm'] * 1e3:8.1f} "
                      f"{parts['attention'] * 1e3:8.1f} {parts['memory'] * 1e3:9.1f} "
                      f"{done[row][name]:9.1f}", end="")
                print(f" {ours_ms if name == 'tfgraph' else hf_ms:9.1f} "
                      f"{(ours_ms if name == 'tfgraph' else hf_ms) / done[row][name]:9.3f}")
        predicted = done[row]["transformers"] / done[row]["tfgraph"]
        measured = hf_ms / ours_ms
        print(f"  {where}: transformers / tfgraph measured {measured:.3f}, predicted "
              f"{predicted:.3f} (predicted / measured {predicted / measured:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
