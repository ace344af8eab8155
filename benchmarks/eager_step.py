"""The eager kernel count behind ``tfgraph plan --kernels eager``, checked on a second module:
transformers' ``LlamaForCausalLM`` beside tfgraph's own, the training step measured on GPUs.

    python benchmarks/eager_step.py             # predicted, against the measured steps
    python benchmarks/eager_step.py --measure   # on a GPU: each kind's time, profiled

Both modules (TinyLlama-1.1B sizes, ``specs/llama.yaml``; bfloat16; SDPA; batch 4 x 1024;
forward + token cross-entropy on float32 logits + backward, benchmarks/gpu.py's step) run on
the meta device under ``exporters.torch.kernels.record``: every ATen kernel with its bytes, GEMM
dimensions and flash FLOPs, CUDA's fused SDPA as its flash kernels (one each way, their shapes
kept for FlashAttention-2's measured Hopper rates). Each is timed as the planner times
it (``tfgraph.parallel.timing.kernel_seconds``, the cited rates of ``tfgraph/parallel/gpus.py``):
nothing here is measured or fitted. transformers' RMSNorm is Python (a float32 upcast, a square,
a mean, a reciprocal square root, two products and a downcast); tfgraph's calls ``F.rms_norm``,
which CUDA runs fused (one kernel forward, two backward): the count predicts how much slower transformers' step is, and the
measurements (issue 26's H100, benchmarks/RESULTS.md's two H200 machines) say how much slower it
was. The absolute times are the plan's (``--kernels eager``), and its gap to the measured steps
shows beside them.

``--measure`` (a GPU session's job; ``--cpu`` smoke-runs it on tiny-llama) runs both steps for
real under ``torch.profiler`` and sums the device time of their kernels by kind (GEMM: cuBLAS /
CUTLASS kernels; attention: flash / fmha; the rest memory-bound) beside the predicted time of
the same kind: what rate each kind reached (GEMM TFLOP/s, memory-bound GB/s over the counted
bytes), the figures the planner's rates could then cite as measured here.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # an installed tfgraph first (its tfgraph.exporters); else this checkout
sys.path.insert(0, str(ROOT / "benchmarks"))  # plan_step: a card's GPU-table row

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
            ("h100", 69.0, 96.8, "RESULTS.md \"third H100 run\""),
            ("h200", 61.0, 81.0, "RESULTS.md \"On a GPU\", H200"),
            ("h200", 69.9, 85.8, "RESULTS.md \"On a GPU\", second H200")]


def step_of(model: torch.nn.Module, hf: bool, ids: torch.Tensor) -> Callable[[], None]:
    """benchmarks/gpu.py's training step: forward, token cross-entropy on float32 logits,
    backward (on the meta device with an uninitialised gradient, else ``loss.backward()``)."""
    def step() -> None:
        logits = model(ids).logits if hf else model(ids)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        if ids.is_meta:
            torch.autograd.backward(loss, torch.empty_like(loss))
        else:
            loss.backward()
            model.zero_grad(set_to_none=True)
    return step


def modules(spec_path: Path, device: str, dtype: torch.dtype
            ) -> dict[str, tuple[torch.nn.Module, bool]]:
    """tfgraph's module and transformers' for ``spec_path``, in training mode, on ``device``
    (meta: shapes only; else random weights)."""
    spec = tfgraph.load_spec(spec_path).model_copy(update={"dtype": "bfloat16"})
    ours = to_torch(tfgraph.compile(spec), device="meta" if device == "meta" else None)
    ours = ours.to(device=device, dtype=dtype).train()
    exported = hf_config(spec)  # the config.json `build --to hf` writes (a Llama)
    config = transformers.AutoConfig.for_model(**exported.config)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(config).to(dtype).train()
    n_ours = sum(p.numel() for p in ours.parameters())
    n_hf = sum(p.numel() for p in hf.parameters())
    assert n_ours == n_hf, (n_ours, n_hf)  # the same model
    return {"tfgraph": (ours, False), "transformers": (hf, True)}


# The H200 profile of both steps (``--measure``; benchmarks/RESULTS.md, "the FSDP2 step
# profiled"): device seconds per step of each module's memory-bound kernels
PROFILED_MEMORY = ("h200", {"tfgraph": 17.07e-3, "transformers": 33.56e-3})


def seconds(kernels: list[Kernel], row: str, share: float | None = None) -> Counter[str]:
    """Predicted seconds per kind (``share``: ``Gpu.kernel_share`` in place of the table's)."""
    device = gpu(row)
    if share is not None:
        device = replace(device, kernel_share=share)
    parts: Counter[str] = Counter()
    for k in kernels:
        parts[k.kind] += kernel_seconds(k, device, device.peak_flops, 2)
    return parts


def solved_share(recorded: dict[str, list[Kernel]]) -> float:
    """The ``kernel_share`` at which the plan's memory-bound kernel times (each its bytes at
    the share of the streaming rate, at least ``LAUNCH_S``) add up to the profiled time of both
    modules' memory-bound kernels: where tfgraph/parallel/gpus.py's KERNEL_SHARE comes from."""
    row, measured = PROFILED_MEMORY
    memory = [k for name in measured for k in recorded[name] if k.kind == "memory"]
    want = sum(measured.values())
    low, high = 0.05, 1.0  # the memory time falls as the share grows
    for _ in range(60):
        mid = (low + high) / 2
        if seconds(memory, row, mid)["memory"] > want:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def predict() -> int:
    ids = torch.empty((BATCH, SEQ), dtype=torch.long, device="meta")
    recorded = {name: record(step_of(model, hf, ids)) for name, (model, hf)
                in modules(ROOT / "specs" / "llama.yaml", "meta", torch.bfloat16).items()}
    for name, kernels in recorded.items():
        memory = [k for k in kernels if k.kind == "memory"]
        print(f"{name}: {len(kernels)} kernels, {len(memory)} memory-bound moving "
              f"{sum(k.nbytes for k in memory) / 1e9:.1f} GB")
    row, measured = PROFILED_MEMORY
    print(f"memory-bound share of the streaming rate at which both modules' memory-bound kernels "
          f"take their profiled {sum(measured.values()) * 1e3:.2f} ms on the {row.upper()} "
          f"(KERNEL_SHARE): {solved_share(recorded):.3f}")
    print(f"{'GPU row':8} {'module':13} {'gemm ms':>8} {'attn ms':>8} {'memory ms':>9} "
          f"{'predicted':>9} {'measured':>9} {'meas/pred':>9}")
    done: dict[str, dict[str, float]] = {}
    for row, ours_ms, hf_ms, where in MEASURED:
        if row not in done:
            done[row] = {}
            for name, kernels in recorded.items():
                parts = seconds(kernels, row)
                done[row][name] = sum(parts.values()) * 1e3
                real = ours_ms if name == "tfgraph" else hf_ms
                print(f"{row:8} {name:13} {parts['gemm'] * 1e3:8.1f} "
                      f"{parts['attention'] * 1e3:8.1f} {parts['memory'] * 1e3:9.1f} "
                      f"{done[row][name]:9.1f} {real:9.1f} {real / done[row][name]:9.3f}")
        predicted = done[row]["transformers"] / done[row]["tfgraph"]
        measured = hf_ms / ours_ms
        print(f"  {where}: transformers / tfgraph measured {measured:.3f}, predicted "
              f"{predicted:.3f} (predicted / measured {predicted / measured:.3f})")
    return 0


def kind_of(kernel_name: str, cuda: bool) -> str:
    """A profiled kernel's kind: cuBLAS / CUTLASS GEMMs, flash / fmha attention, the rest
    memory-bound (on the CPU: the ATen op's name)."""
    name = kernel_name.lower()
    if any(word in name for word in ("flash", "fmha", "attention")):
        return "attention"
    gemm = ("gemm", "cutlass", "nvjet", "xmma", "cublas") if cuda else \
        ("aten::mm", "aten::addmm", "aten::bmm")
    return "gemm" if any(word in name for word in gemm) else "memory"


def measure(cpu: bool, repeat: int = 5) -> int:
    """Both steps for real, profiled: device time per step by kind beside the prediction."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available() and not cpu
    spec = ROOT / "specs" / ("llama.yaml" if cuda else "tiny-llama.yaml")
    batch, seq = (BATCH, SEQ) if cuda else (2, 32)
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    row = "h100"
    if cuda:
        from plan_step import gpu_for_card  # the card's row of the GPU table

        card = torch.cuda.get_device_name(0)
        row = gpu_for_card(card) or "h100"
        print(f"card {card} (--gpu {row}), torch {torch.__version__}, {spec.name}, "
              f"batch {batch} x {seq}, bfloat16, median of {repeat} steps")
    else:
        print(f"CPU SMOKE, NOT A MEASUREMENT: {spec.name}, batch {batch} x {seq}, float32 on "
              "the CPU; predicted for --gpu h100; the ratios mean nothing")
    real = modules(spec, device, dtype)
    shapes = modules(spec, "meta", torch.bfloat16 if cuda else torch.float32)
    vocab = tfgraph.load_spec(spec).vocab_size("source")
    ids = torch.randint(3, vocab, (batch, seq), device=device)
    meta_ids = torch.empty((batch, seq), dtype=torch.long, device="meta")
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    for name, (model, hf) in real.items():
        step = step_of(model, hf, ids)
        for _ in range(2):  # warm-up: cuBLAS heuristics, the allocator
            step()
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=[activity]) as prof:
            for _ in range(repeat):
                step()
            if cuda:
                torch.cuda.synchronize()
        got: Counter[str] = Counter()
        for event in prof.key_averages():
            spent = getattr(event, "self_device_time_total", 0) if cuda else \
                event.self_cpu_time_total
            got[kind_of(event.key, cuda)] += spent / 1e6 / repeat  # us -> s per step
        kernels = record(step_of(shapes[name][0], shapes[name][1], meta_ids))
        want = seconds(kernels, row)
        flops = sum(k.flops for k in kernels if k.kind == "gemm")
        nbytes = sum(k.nbytes for k in kernels if k.kind == "memory")
        print(f"{name}: measured / predicted per kind (ms per step):")
        for kind in ("gemm", "attention", "memory"):
            print(f"  {kind:9} {got[kind] * 1e3:8.2f} / {want[kind] * 1e3:8.2f} = "
                  f"{got[kind] / want[kind] if want[kind] else float('nan'):.3f}")
        if got["gemm"] and got["memory"]:
            print(f"  GEMMs at {flops / got['gemm'] / 1e12:.0f} TFLOP/s; memory-bound kernels "
                  f"at {nbytes / got['memory'] / 1e9:.0f} GB/s over the {nbytes / 1e9:.2f} GB "
                  "counted")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--measure", action="store_true",
                        help="run both steps under torch.profiler (a GPU's job)")
    parser.add_argument("--cpu", action="store_true",
                        help="with --measure: the CPU even where CUDA is (a smoke run)")
    args = parser.parse_args()
    return measure(args.cpu) if args.measure else predict()


if __name__ == "__main__":
    sys.exit(main())
