"""The accelerators ``tfgraph plan --gpu NAME`` knows: dense 16-bit tensor-core peak, memory,
memory bandwidth and the links between GPUs. Figures are the vendors' published data-sheet
values (dense, without sparsity); links are per GPU and per direction.

``--gpu-memory 80GB`` alone plans for an unnamed GPU with that memory and the H100's speeds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tfgraph.errors import TfgraphError

GB = 10**9
GIB = 2**30


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
    """GPU-to-GPU bandwidth inside a node (NVLink), bytes/s per direction."""
    inter_node: float
    """Bandwidth per GPU between nodes (InfiniBand / RoCE NIC), bytes/s per direction."""
    per_node: int = 8


GPUS: dict[str, Gpu] = {g.name: g for g in (
    # NVIDIA A100 data sheet (SXM): 312 TFLOPS bf16, 156 TF32; NVLink 3: 600 GB/s total.
    Gpu("a100-40gb", 312e12, 156e12, 40 * GB, 1.555e12, 300e9, 25e9),
    Gpu("a100-80gb", 312e12, 156e12, 80 * GB, 2.039e12, 300e9, 25e9),
    # NVIDIA H100 SXM: 989 TFLOPS bf16 dense, 495 TF32; NVLink 4: 900 GB/s total; 400 Gb/s NIC.
    Gpu("h100", 989e12, 495e12, 80 * GB, 3.35e12, 450e9, 50e9),
    # NVIDIA H200 SXM: H100's compute with 141 GB HBM3e at 4.8 TB/s.
    Gpu("h200", 989e12, 495e12, 141 * GB, 4.8e12, 450e9, 50e9),
    # NVIDIA B200 (HGX): 2.25 PFLOPS bf16 dense, 1.1 TF32; NVLink 5: 1.8 TB/s total.
    Gpu("b200", 2250e12, 1100e12, 180 * GB, 8e12, 900e9, 50e9),
    # NVIDIA V100 SXM2 32 GB: 125 TFLOPS fp16, 15.7 fp32; NVLink 2: 300 GB/s total.
    Gpu("v100-32gb", 125e12, 15.7e12, 32 * GB, 0.9e12, 150e9, 12.5e9),
    # NVIDIA L40S: 362 TFLOPS bf16 dense, 183 TF32; PCIe 4.0 x16 only.
    Gpu("l40s", 362e12, 183e12, 48 * GB, 0.864e12, 32e9, 25e9, per_node=8),
    # AMD MI300X: 1307 TFLOPS bf16 dense, 654 TF32; Infinity Fabric 896 GB/s total.
    Gpu("mi300x", 1307e12, 654e12, 192 * GB, 5.3e12, 448e9, 50e9),
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
    if not 0 < value < 10**15:
        raise TfgraphError(f"--gpu-memory {text!r}: not a plausible device memory")
    return int(value)


def gpu(name: str | None = None, memory: str | None = None) -> Gpu:
    """The named GPU (default h100), with ``memory`` overriding its memory when given."""
    key = (name or DEFAULT_GPU).lower()
    if key not in GPUS:
        raise TfgraphError(f"--gpu {name!r}: expected one of {', '.join(GPUS)}")
    chosen = GPUS[key]
    if memory is not None:
        chosen = replace(chosen, name=chosen.name if name else f"{parse_memory(memory) / GB:g}GB",
                         memory=parse_memory(memory))
    return chosen
