"""The accelerators ``tfgraph plan --gpu NAME`` knows: dense 16-bit tensor-core peak, memory,
memory bandwidth and the links between GPUs, and what share of them real kernels reach (the
inputs of the step-time model, ``tfgraph.parallel.timing``). Peaks are the vendors' published
data-sheet values (dense, without sparsity); links are per GPU and per direction.

Achievable rates, each from a published measurement (never fitted to a run the planner is
checked against, ``benchmarks/plan_published.py``):
- ``matmul_fraction``: the best share of the 16-bit peak cuBLAS reaches over a sweep of GEMM
  shapes, "maximum achievable matmul FLOPS" (MAMF; S. Bekman, *Machine Learning Engineering*,
  compute/accelerator, MAMF table, torch.mm bf16 sweeps): A100 SXM 271.2 of 312 TFLOP/s
  (0.87), H100 SXM 794.5 of 989 (0.80), MI300X 781.9 of 1307 (0.60). GPUs without a published
  figure take their generation's (stated per row);
- ``attention_fraction``: FlashAttention-2's share of peak, forward + backward, head dim 128,
  long sequences (Dao 2023, "FlashAttention-2", §4.1: up to 225 TFLOP/s on A100, 72%; 335
  TFLOP/s on H100, 34%, the Hopper kernel being Ampere's). The H100 and H200 use instead
  FlashAttention-2's measured rate by head dimension, length and mask (``flash_measured``,
  ``tfgraph.parallel.flash``: 229 TFLOP/s forward at head dim 64, 1k tokens, causal);
- ``memory_fraction``: the share of the data-sheet memory bandwidth a streaming kernel moves:
  0.9 where nothing better is known (device-to-device copies and STREAM triad reach 3.0-3.1 of
  3.35 TB/s on an H100 SXM). The H100 and H200 use this repository's own measurement of what a
  torch kernel reads on them (``amax`` over 2 GiB of float16, best of 10, benchmarks/gpu.py's
  bandwidth floor; benchmarks/RESULTS.md "On a GPU"): H100 2.63-2.79 of 3.35 TB/s on three
  machines, middle 2.71: 0.81; H200 3.45-3.51 of 4.8 TB/s: 0.72;
- ``kernel_share``: the share of that streaming rate the memory-bound kernels of a training
  step reach over the bytes the plan counts for them (norms, softmax, element-wise, the loss's;
  reductions and tails included), ``KERNEL_SHARE`` on every GPU: measured on one H200 by
  profiling the eager TinyLlama step of tfgraph's module and of transformers'
  ``LlamaForCausalLM`` (``benchmarks/eager_step.py --measure``; benchmarks/RESULTS.md "On a
  GPU: the FSDP2 step profiled"): their memory-bound kernels moved 41.52 + 87.33 GB in 17.07 +
  33.56 ms; the plan's kernel times (each its bytes at the share, at least
  ``timing.LAUNCH_S``) add up to that at 0.776 (``eager_step.py`` prints the solve). The
  H100's two step pairs, whose difference is mostly memory-bound bytes (transformers' module
  moves 87.3 GB to tfgraph's 41.5), solve to 0.64-0.68 of its streaming rate: slower still on
  that card (not used). GEMMs, optimizer passes, gradient accumulation and FSDP copies stream
  at the full rate;
- ``vector_flops``: non-tensor fp32 FLOP/s (data sheets), the rate of element-wise arithmetic;
- ``sms``: streaming multiprocessors (compute units), over which a GEMM's output tiles run in
  waves (``timing.gemm_efficiency``).

``--gpu-memory 80GB`` alone plans for an unnamed GPU with that memory and the H100's speeds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tfgraph.errors import TfgraphError

GB = 10**9
GIB = 2**30
KERNEL_SHARE = 0.776
"""Memory-bound kernels of a training step over a streaming read (the module docstring)."""


@dataclass(frozen=True)
class Gpu:
    """One accelerator model and the machine it sits in."""

    name: str
    peak_flops: float
    """Dense bf16/fp16 tensor-core FLOP/s (fp32 runs at ``fp32_flops``)."""
    fp32_flops: float
    """Dense fp32 FLOP/s (TF32 tensor cores where the GPU has them)."""
    memory: int
    """Bytes of device memory."""
    bandwidth: float
    """Device memory bandwidth, bytes/s."""
    intra_node: float
    """GPU-to-GPU bandwidth inside a node (over ``link``), bytes/s per direction."""
    inter_node: float
    """Bandwidth of one NIC between nodes (InfiniBand / RoCE), bytes/s per direction."""
    per_node: int = 8
    nics: int | None = None
    """NICs per node, each at ``inter_node`` (None: one per GPU, as DGX A100, H100, B200)."""
    link: str = "NVLink 4"
    """The link between the GPUs of a node that ``intra_node`` is the bandwidth of (NVLink,
    PCIe, AMD Infinity Fabric): named in the plan's ``assumptions.gpu``."""
    sms: int = 132
    """Streaming multiprocessors (AMD: compute units)."""
    matmul_fraction: float = 0.80
    """Best share of ``peak_flops`` cuBLAS reaches on large GEMMs (MAMF)."""
    attention_fraction: float = 0.34
    """Share of ``peak_flops`` a fused (flash) attention kernel reaches, forward + backward."""
    memory_fraction: float = 0.9
    """Share of ``bandwidth`` a streaming (memory-bound) kernel moves."""
    kernel_share: float = KERNEL_SHARE
    """Share of the streaming rate (``bandwidth`` x ``memory_fraction``) the memory-bound
    kernels of a training step reach over their counted bytes."""
    vector_flops: float = 67e12
    """Non-tensor fp32 FLOP/s (element-wise arithmetic)."""
    flash_measured: bool = False
    """Fused attention at FlashAttention-2's measured Hopper rate for its head dimension,
    length and mask (``tfgraph.parallel.flash``) rather than at ``attention_fraction``."""
    bfloat16: bool = True
    """Whether its tensor cores take bfloat16 (Volta's take float16 only: bf16 arrived with
    Ampere, compute capability 8.0; CUDA's ``__nv_bfloat16`` MMA needs sm_80)."""

    @property
    def network(self) -> float:
        """Bytes/s between nodes per GPU when every GPU of a node sends at once: its share of
        the node's NICs (one NIC each where there is one per GPU)."""
        return self.inter_node * (self.nics or self.per_node) / self.per_node

    @property
    def streaming(self) -> float:
        """Bytes/s a streaming kernel moves (GEMMs' operands, optimizer and copy passes)."""
        return self.bandwidth * self.memory_fraction

    @property
    def kernel_bandwidth(self) -> float:
        """Bytes/s the memory-bound kernels of a training step move (norms, softmax,
        element-wise, the loss's)."""
        return self.streaming * self.kernel_share


GPUS: dict[str, Gpu] = {g.name: g for g in (
    # NVIDIA A100 data sheet (SXM): 312 TFLOPS bf16, 156 TF32, 19.5 fp32; NVLink 3: 600 GB/s
    # total; 108 SMs; one 200 Gb/s HDR NIC per GPU (DGX A100). MAMF 0.87, FA2 0.72.
    Gpu("a100-40gb", 312e12, 156e12, 40 * GB, 1.555e12, 300e9, 25e9, link="NVLink 3", sms=108,
        matmul_fraction=0.87, attention_fraction=0.72, vector_flops=19.5e12),
    Gpu("a100-80gb", 312e12, 156e12, 80 * GB, 2.039e12, 300e9, 25e9, link="NVLink 3", sms=108,
        matmul_fraction=0.87, attention_fraction=0.72, vector_flops=19.5e12),
    # NVIDIA H100 SXM: 989 TFLOPS bf16 dense, 495 TF32, 67 fp32; NVLink 4: 900 GB/s total;
    # 132 SMs; 400 Gb/s NIC per GPU. MAMF 0.80, FA2 0.34; 2.71 TB/s read (0.81) measured here.
    # Attention: FlashAttention-2 as measured on it (tfgraph.parallel.flash).
    Gpu("h100", 989e12, 495e12, 80 * GB, 3.35e12, 450e9, 50e9, memory_fraction=0.81,
        flash_measured=True),
    # NVIDIA H200 SXM: H100's compute with 141 GB HBM3e at 4.8 TB/s (0.72 measured here).
    Gpu("h200", 989e12, 495e12, 141 * GB, 4.8e12, 450e9, 50e9, memory_fraction=0.72,
        flash_measured=True),
    # NVIDIA B200 (HGX): 2.25 PFLOPS bf16 dense, 1.1 TF32, 80 fp32; NVLink 5: 1.8 TB/s total;
    # 148 SMs. No published MAMF / FA2 figure: Hopper's shares assumed.
    Gpu("b200", 2250e12, 1100e12, 180 * GB, 8e12, 900e9, 50e9, link="NVLink 5", sms=148,
        vector_flops=80e12),
    # NVIDIA V100 SXM2 32 GB: 125 TFLOPS fp16, 15.7 fp32; NVLink 2: 300 GB/s total; 80 SMs;
    # DGX-1: four 100 Gb/s EDR InfiniBand NICs for its eight GPUs.
    # No FlashAttention-2 kernel for Volta: attention at the GEMM share; MAMF: Ampere's.
    Gpu("v100-32gb", 125e12, 15.7e12, 32 * GB, 0.9e12, 150e9, 12.5e9, nics=4, link="NVLink 2",
        sms=80,
        matmul_fraction=0.87, attention_fraction=0.5, vector_flops=15.7e12, bfloat16=False),
    # NVIDIA L40S: 362 TFLOPS bf16 dense, 183 TF32, 91.6 fp32; PCIe 4.0 x16 only; 142 SMs.
    Gpu("l40s", 362e12, 183e12, 48 * GB, 0.864e12, 32e9, 25e9, per_node=8,
        link="PCIe 4.0 x16", sms=142,
        vector_flops=91.6e12),
    # AMD MI300X: 1307 TFLOPS bf16 dense, 654 TF32, 163.4 fp32; Infinity Fabric 896 GB/s
    # total; 304 compute units. MAMF 0.60; attention assumed at the same share.
    Gpu("mi300x", 1307e12, 654e12, 192 * GB, 5.3e12, 448e9, 50e9,
        link="Infinity Fabric", sms=304,
        matmul_fraction=0.60, attention_fraction=0.30, vector_flops=163.4e12),
)}
DEFAULT_GPU = "h100"

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(GB|GIB|G|TB|MB|MIB)?\s*$", re.IGNORECASE)
_UNITS = {"GB": GB, "G": GB, "GIB": GIB, "TB": 1000 * GB, "MB": 10**6, "MIB": 2**20}


def parse_memory(text: str) -> int:
    """'80GB' / '80 GiB' / '80' (GB) -> bytes."""
    m = _SIZE.match(text)
    if not m:
        raise TfgraphError(f"--gpu-memory {text!r}: expected a size such as 80GB or 141GiB")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "GB").upper()]
    if not 1 <= value < 10**15:  # (under a byte would plan for a GPU of 0 bytes)
        raise TfgraphError(f"--gpu-memory {text!r}: not a plausible device memory")
    return int(value)


def gpu(name: str | None = None, memory: str | None = None) -> Gpu:
    """The named GPU (default h100), with ``memory`` overriding its memory when given."""
    key = (DEFAULT_GPU if name is None else name).lower()  # --gpu '' is no GPU's name
    if key not in GPUS:
        raise TfgraphError(f"--gpu {name!r}: expected one of {', '.join(GPUS)}")
    chosen = GPUS[key]
    if memory is not None:
        chosen = replace(chosen, name=chosen.name if name else f"{parse_memory(memory) / GB:g}GB",
                         memory=parse_memory(memory))
    return chosen


def check_dtype(chosen: Gpu, dtype: str) -> None:
    """Refuse a training precision the GPU's tensor cores do not run (bfloat16 on a V100):
    its peak would be a rate it has not. One line, the precisions it takes named."""
    if dtype == "bfloat16" and not chosen.bfloat16:
        raise TfgraphError(f"--dtype bfloat16: the {chosen.name} has no "
                           "bfloat16 tensor cores (float16 only, before Ampere); use --dtype "
                           "float16 or float32")
