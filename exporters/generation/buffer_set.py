"""The device values one fused-attention decode step runs on (exporters/generation/
fused_stepper.py): each layer's key and value buffer, bound as its past input and its present
output at once, and the step's fixed inputs and logits, all bound once in one I/O binding, with
the onnxruntime CUDA graph id a step on them runs under.

A decode step only refills the inputs in place (``OrtValue.update_inplace``), so every step on
one set has the same shapes and device addresses: what onnxruntime's CUDA graph capture needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tfgraph.errors import TfgraphError


@dataclass(frozen=True)
class CacheLayout:
    """What a fused KV-cache model's buffers look like (read from its session)."""

    names: list[str]
    """The past inputs, ``past_key_values.{i}.key|value``."""
    presents: list[str]
    """The present output of each past input, in the same order."""
    dims: dict[str, tuple[int, int]]
    """(kv_heads, head_dim) of each past input."""
    dtype: Any
    """numpy dtype of the cache (float16 or float32)."""
    logits: str
    """The logits output's name."""
    logits_dtype: Any
    vocab: int
    with_positions: bool
    """Whether the model takes position_ids."""
    device: str
    """Where the session's tensors live: "cuda" or "cpu"."""

    def bytes_per_row(self, capacity: int) -> int:
        """Bytes of one row's buffers over every layer, ``capacity`` positions each."""
        per_row = sum(kv * hd for kv, hd in self.dims.values()) * capacity
        return per_row * np.dtype(self.dtype).itemsize


@dataclass
class BufferSet:
    """One set of bound device values: (rows, kv, capacity, hd) buffers per layer, (rows, 1)
    ids and positions, a (rows, capacity) mask and (rows, 1, vocab) logits."""

    rows: int
    capacity: int
    cache: dict[str, Any]
    """past name -> OrtValue, also bound as that layer's present."""
    fixed: dict[str, Any]
    """input_ids, attention_mask, position_ids (if taken) and the logits output."""
    binding: Any
    graph_id: int
    """onnxruntime's ``gpu_graph_id`` of the decode steps on this set (from 1)."""
    ran: bool = False
    """Whether a decode step ran on it (with CUDA graphs: its graph was captured)."""

    def fill(self, keep: dict[str, np.ndarray], layout: CacheLayout) -> None:
        """Write ``keep``'s (rows, kv, n, hd) host values into the buffers' first n
        positions (the rest zero), in place: the addresses, and so a captured graph, stay."""
        for name in layout.names:
            self.cache[name].update_inplace(_padded(keep[name], layout, name, self.rows,
                                                    self.capacity))


def device_bytes(layout: CacheLayout, rows: int, capacity: int) -> int:
    """Bytes a set of ``rows`` x ``capacity`` takes on the device: the buffers, the mask, ids
    and positions (int64) and the logits."""
    logits = rows * layout.vocab * np.dtype(layout.logits_dtype).itemsize
    return rows * layout.bytes_per_row(capacity) + 8 * rows * (capacity + 2) + logits


def _size(n: float) -> str:
    return f"{n:,.0f} bytes ({n / 1e9:,.2f} GB)"


def what(rows: int, capacity: int) -> str:
    """How the errors name a set."""
    return f"the fused-attention KV cache of {rows} rows x {capacity} positions"


def check_device_memory(layout: CacheLayout, rows: int, capacity: int) -> None:
    """Refuse (one line) a set the GPU's free memory cannot hold, before allocating it, where
    that memory can be read: a CUDA session, and torch seeing the GPU (torch.cuda.mem_get_info,
    on the primary CUDA context the session made). Else, or on the host: not checked here
    (the host's memory is tfgraph.limits.check_memory's)."""
    if layout.device != "cuda":
        return
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    free = int(torch.cuda.mem_get_info(0)[0])
    need = device_bytes(layout, rows, capacity)
    if need > free:
        raise TfgraphError(f"{what(rows, capacity)}: needs {_size(need)} of GPU memory, "
                           f"only {_size(free)} free on cuda:0")


def allocate(session: Any, layout: CacheLayout, rows: int, capacity: int, graph_id: int,
             keep: dict[str, np.ndarray] | None = None) -> BufferSet:
    """A new set on the session's device, ``keep``'s values copied into the buffers' first
    positions (else zeros). The device refusing the memory is one line (TfgraphError) naming
    the bytes asked for."""
    check_device_memory(layout, rows, capacity)
    try:
        cache, inputs, logits = _values(layout, rows, capacity, keep)
    except MemoryError:
        raise TfgraphError(f"{what(rows, capacity)}: out of host memory for its copy of "
                           f"{_size(rows * layout.bytes_per_row(capacity))}") from None
    except Exception as err:  # noqa: BLE001 - onnxruntime's exception types vary by build
        text = " ".join(str(err).split())[:160]
        raise TfgraphError(f"{what(rows, capacity)}: allocating "
                           f"{_size(device_bytes(layout, rows, capacity))} on {layout.device} "
                           f"failed: {text}") from None
    binding = session.io_binding()
    for name, v in inputs.items():
        binding.bind_ortvalue_input(name, v)
    binding.bind_ortvalue_output(layout.logits, logits)
    for past, present in zip(layout.names, layout.presents):
        binding.bind_ortvalue_input(past, cache[past])
        binding.bind_ortvalue_output(present, cache[past])  # the kernel writes in place
    return BufferSet(rows, capacity, cache, {**inputs, layout.logits: logits}, binding,
                     graph_id)


def _values(layout: CacheLayout, rows: int, capacity: int,
            keep: dict[str, np.ndarray] | None) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """The set's device values: (cache, fixed inputs, logits)."""
    import onnxruntime as ort

    cache = {}
    for name in layout.names:
        host = _padded(keep[name] if keep is not None else None, layout, name, rows, capacity)
        cache[name] = ort.OrtValue.ortvalue_from_numpy(host, layout.device, 0)

    def value(shape: tuple[int, ...], dtype: Any) -> Any:
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, layout.device, 0)

    inputs = {"input_ids": value((rows, 1), np.int64),
              "attention_mask": value((rows, capacity), np.int64)}
    if layout.with_positions:
        inputs["position_ids"] = value((rows, 1), np.int64)
    return cache, inputs, value((rows, 1, layout.vocab), layout.logits_dtype)


def _padded(old: np.ndarray | None, layout: CacheLayout, name: str, rows: int,
            capacity: int) -> np.ndarray:
    """(rows, kv, capacity, hd) host values: ``old``'s first positions, then zeros."""
    kv_heads, head_dim = layout.dims[name]
    host = np.zeros((rows, kv_heads, capacity, head_dim), layout.dtype)
    if old is not None:
        host[:, :, :old.shape[2]] = old[:, :, :capacity]
    return host
