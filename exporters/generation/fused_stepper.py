"""The cached stepper of a model built with onnxruntime's fused attention (right-padded rows,
one fixed-size key/value buffer per layer shared by past and present).

A ``build --kv-cache --fused-attention`` model (exporters/onnx/fused_attention.py) attends,
in row b, to cache positions 0..n_b-1 where n_b is the count of ones in its
``attention_mask`` row: rows are RIGHT-padded. The decoding loop hands prompts left-padded
(tfgraph.generation.backend.Stepper), so this stepper moves each prompt to the front of its
row, reads each row's logits at its own last prompt token, and from then on feeds one token
per row, its mask row ones for its n_b tokens (the mask is as wide as the buffers, or with
``share=False`` as the longest row).

The cache: ``share=True`` (default) allocates, per layer, one key and one value buffer of
(batch, kv_heads, capacity, head_dim) on the session's device and binds the same OrtValue as
the layer's past input and present output (onnxruntime I/O binding): the kernel writes each
step's keys/values into it in place (onnxruntime-genai's ``past_present_share_buffer``), so
nothing of the cache is copied, allocated or sent to the host between steps; only the ids and
the mask go in and the logits come back. The capacity is the prompt width plus the new tokens
(``prepare``, which tfgraph.generate calls), doubled through the host when a row outgrows it.
``share=False``: each step's present (one position longer) is bound as the next step's past,
as the written-out model is driven (exporters/generation/cached_steppers.onnx_cached).
Rows that leave the batch (``reorder``) go through the host once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.exporters.generation.cache_interface import present_name
from tfgraph.exporters.onnx.runtime import run_bound
from tfgraph.generation.cached import last_logits


class FusedOnnx:
    """A :class:`~tfgraph.generation.backend.Stepper` over an onnxruntime session of a fused
    KV-cache model (see the module docstring)."""

    encoder_decoder = False

    def __init__(self, session: Any, vocab: int, max_len: int | None,
                 output_probs: bool = False, share: bool = True) -> None:
        from tfgraph.exporters.generation.cached_steppers import session_device

        self.session, self.vocab, self.max_len = session, vocab, max_len
        self.output_probs, self.share = output_probs, share
        # (tfgraph.commands.steppers checks the model's inputs and outputs first:
        # exporters/generation/cache_interface.py)
        past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
        self.names = [i.name for i in past]
        # (kv_heads, head_dim) of each layer's key and value buffers
        self.dims = {i.name: (int(i.shape[1]), int(i.shape[3])) for i in past}
        types = {"tensor(float16)": np.float16, "tensor(float)": np.float32}
        if past[0].type not in types:  # numpy (and so these buffers) has no bfloat16
            raise TfgraphError(f"a fused-attention model with a {past[0].type} cache: tfgraph "
                               "generate allocates float16 or float32 buffers; build it with "
                               "--dtype float16 or float32")
        self.np_dtype = types[past[0].type]
        self.with_positions = any(i.name == "position_ids" for i in session.get_inputs())
        self.logits_name = session.get_outputs()[0].name
        self.presents = [present_name(n) for n in self.names]
        self.device = session_device(session)
        self.new_tokens = 256  # positions reserved past the prompt until prepare says
        self.capacity = 0  # positions each buffer holds (share=True)
        self.counts = np.zeros(0, np.int64)  # (B,) n_b: tokens in each row's cache
        self.cache: dict[str, Any] = {}  # past name -> OrtValue (or a host array)

    # sizing
    def prepare(self, batch: int, width: int, new_tokens: int) -> None:
        """Expect prompts up to ``width`` tokens and ``new_tokens`` more: the buffers' size."""
        self.new_tokens = max(1, int(new_tokens))

    def _buffers(self, rows: int, capacity: int, keep: dict[str, np.ndarray] | None = None
                 ) -> None:
        """Allocate (rows, kv, capacity, hd) buffers on the device, ``keep``'s values copied
        into their first positions."""
        import onnxruntime as ort

        from tfgraph.limits import check_memory

        # the host copy and the device buffer of every layer (a model's sizes are its own:
        # refused here rather than by a MemoryError part-way through the allocations)
        per_row = sum(kv * hd for kv, hd in self.dims.values()) * capacity
        check_memory(f"the fused-attention KV cache of {rows} rows x {capacity} positions",
                     2 * rows * per_row * np.dtype(self.np_dtype).itemsize)
        self.capacity = capacity
        cache = {}
        for name in self.names:
            kv_heads, head_dim = self.dims[name]
            host = np.zeros((rows, kv_heads, capacity, head_dim), self.np_dtype)
            if keep is not None:
                old = keep[name]
                host[:, :, :old.shape[2]] = old[:, :, :capacity]
            cache[name] = ort.OrtValue.ortvalue_from_numpy(host, self.device, 0)
        self.cache = cache

    def _host_cache(self) -> dict[str, np.ndarray]:
        return {n: (v if isinstance(v, np.ndarray) else v.numpy()) for n, v in self.cache.items()}

    # one run
    def _run(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        session = self.session
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(ids, np.int64))
        binding.bind_cpu_input("attention_mask", np.ascontiguousarray(mask, np.int64))
        if self.with_positions:
            binding.bind_cpu_input("position_ids", np.ascontiguousarray(positions, np.int64))
        for name in self.names:
            value = self.cache[name]
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
            else:
                binding.bind_ortvalue_input(name, value)
        binding.bind_output(self.logits_name, "cpu")  # what the sampler reads
        for past, present in zip(self.names, self.presents):
            if self.share:  # the same buffer: the kernel writes this step's keys into it
                binding.bind_ortvalue_output(present, self.cache[past])
            else:
                binding.bind_output(present, self.device)
        out = run_bound(session, binding)
        if not self.share:
            self.cache = dict(zip(self.names, out[1:]))
        return np.asarray(out[0].numpy(), np.float32)

    def _mask(self, width: int | None = None) -> np.ndarray:
        """Row b: ones for its n_b tokens, then zeros, ``width`` wide (default: the longest
        row's count)."""
        width = int(self.counts.max()) if width is None else width
        return (np.arange(width)[None, :] < self.counts[:, None]).astype(np.int64)

    # the Stepper calls
    def prefill(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        rows, width = ids.shape
        lengths = lengths.astype(np.int64)
        right = np.zeros_like(ids, dtype=np.int64)
        for r in range(rows):  # each prompt moved to the front of its row
            right[r, :lengths[r]] = ids[r, width - lengths[r]:]
        self.counts = lengths.copy()
        positions = np.broadcast_to(np.arange(width, dtype=np.int64), (rows, width))
        if self.share:
            capacity = width + self.new_tokens
            if self.max_len is not None:
                capacity = min(capacity, max(self.max_len, width + 1))
            self._buffers(rows, capacity)
        else:
            self.cache = {n: np.zeros((rows, self.dims[n][0], 0, self.dims[n][1]),
                                      self.np_dtype) for n in self.names}
        logits = self._run(right, self._mask(), positions)  # (B, W, V)
        last = logits[np.arange(rows), lengths - 1][:, None]  # each row's last prompt token
        return last_logits(last, self.output_probs)

    def step(self, next_ids: np.ndarray) -> np.ndarray:
        self.counts = self.counts + 1
        if self.share and int(self.counts.max()) > self.capacity:  # double, through the host
            self._buffers(len(self.counts), max(2 * self.capacity, int(self.counts.max())),
                          self._host_cache())
        # With shared buffers every step's mask is as wide as the buffers: one token per row,
        # total_sequence_length = the capacity (the kernel's present length either way), so
        # every decode step has the same input shapes (what CUDA graph capture needs).
        logits = self._run(next_ids.astype(np.int64)[:, None],
                           self._mask(self.capacity if self.share else None),
                           (self.counts - 1)[:, None])
        return last_logits(logits, self.output_probs)

    def reorder(self, rows: np.ndarray) -> None:
        self.counts = self.counts[rows]
        host = {n: v[rows] for n, v in self._host_cache().items()}
        if self.share:
            self._buffers(len(rows), self.capacity, host)
        else:  # positions past a row's count are never read (the kernel's present is
            # as wide as the wider of the mask and the past)
            self.cache = host
