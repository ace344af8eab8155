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

Decode steps with shared buffers run through fixed inputs and outputs: the ids, mask and
positions of one step and its logits are OrtValues allocated on the session's device with the
buffers, bound once, and refilled in place every step (``OrtValue.update_inplace``); only the
logits are copied to the host. With CUDA graphs the mask is as wide as the buffers, so every
decode step has the same shapes and the same device addresses, which is what onnxruntime's
CUDA graph capture needs; without them it is as wide as the longest row, rebound each step
(the kernel's time follows the mask's width, not the buffers'). ``cuda_graph=True``: the
session was made with the CUDA provider's ``enable_cuda_graph``): the prefill runs uncaptured
(run option ``gpu_graph_id`` -1), the decode steps under one graph id per set of buffers: the
first run with a new id runs the step uncaptured for onnxruntime's allocations, captures it and
replays it, all in that one call; later runs replay it. That first run is timed into
``compile_s`` (which the decoding loop's clock leaves out), in ``prepare`` and for buffers
allocated again while decoding alike, and the step is then run again, a replay. Rows reordered within the same count
(beam search) are written back into the same buffers, so the graph stays; buffers allocated
again (a row outgrowing them, rows leaving) get a new id and the old graph is released. The
CPU provider runs the same path, uncaptured. onnxruntime's CUDA GroupQueryAttention has
float16 and bfloat16 kernels only: a float32 model's attention would run on the CPU, between
copies that graph capture refuses (tfgraph.commands.steppers refuses it first).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.exporters.generation.buffer_set import BufferSet, CacheLayout, allocate, what
from tfgraph.exporters.generation.cache_interface import present_name
from tfgraph.exporters.onnx.runtime import run_bound
from tfgraph.generation.cached import last_logits
from tfgraph.generation.floats import load_for

CAPTURE_STEPS = 1
"""Decode steps run before decoding with CUDA graphs: onnxruntime's CUDA provider, in the first
run of a graph id, runs the step uncaptured (its allocations), captures it and replays it
(onnxruntime 1.31 InferenceSession::Run: "another run for necessary memory allocation or
graph capture")."""


class FusedOnnx:
    """A :class:`~tfgraph.generation.backend.Stepper` over an onnxruntime session of a fused
    KV-cache model (see the module docstring)."""

    encoder_decoder = False

    def __init__(self, session: Any, vocab: int, max_len: int | None,
                 output_probs: bool = False, share: bool = True,
                 cuda_graph: bool = False) -> None:
        from tfgraph.exporters.generation.cached_steppers import session_device

        self.session, self.vocab, self.max_len = session, vocab, max_len
        self.output_probs, self.share = output_probs, share
        if cuda_graph and not share:
            raise TfgraphError("CUDA graphs need the shared cache buffers (fixed addresses)")
        self.cuda_graph = cuda_graph
        # (tfgraph.commands.steppers checks the model's inputs and outputs first:
        # exporters/generation/cache_interface.py)
        past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
        types = {"tensor(float16)": np.float16, "tensor(float)": np.float32}
        if past[0].type not in types:  # numpy (and so these buffers) has no bfloat16
            raise TfgraphError(f"a fused-attention model with a {past[0].type} cache: tfgraph "
                               "generate allocates float16 or float32 buffers; build it with "
                               "--dtype float16 or float32")
        out = session.get_outputs()[0]
        self.layout = CacheLayout(
            names=[i.name for i in past], presents=[present_name(i.name) for i in past],
            dims={i.name: (int(i.shape[1]), int(i.shape[3])) for i in past},
            dtype=types[past[0].type], logits=out.name,
            logits_dtype=types.get(out.type, np.float32), vocab=vocab,
            with_positions=any(i.name == "position_ids" for i in session.get_inputs()),
            device=session_device(session))
        self.names, self.presents = self.layout.names, self.layout.presents
        load_for(self.layout.logits_dtype)  # (tfgraph.generation.floats: before any clock)
        self.new_tokens = 256  # positions reserved past the prompt until prepare says
        self.counts = np.zeros(0, np.int64)  # (B,) n_b: tokens in each row's cache
        self.cache: dict[str, Any] = {}  # past name -> OrtValue (or, unshared, a host array)
        self.active: BufferSet | None = None  # what decode steps run on (share=True)
        self.prepared: BufferSet | None = None  # the set prepare captured, kept for reuse
        self.next_graph_id = 1
        self.compile_s = 0.0  # seconds spent capturing decode steps (prepare's and later)
        self.run_options: dict[int, Any] = {}  # graph id -> its RunOptions

    # the current set's fields, as the tests and callers read them
    @property
    def rows(self) -> int:
        return self.active.rows if self.active is not None else 0

    @property
    def capacity(self) -> int:
        """Positions each buffer holds (share=True)."""
        return self.active.capacity if self.active is not None else 0

    @property
    def graph_id(self) -> int:
        return self.active.graph_id if self.active is not None else 0

    @property
    def fixed(self) -> dict[str, Any]:
        return self.active.fixed if self.active is not None else {}

    @property
    def fixed_binding(self) -> Any:
        return self.active.binding if self.active is not None else None

    @property
    def compiled(self) -> bool:
        """Whether decode steps are captured (``compile_s``: how long every capture took)."""
        return self.cuda_graph

    # sizing
    def prepare(self, batch: int, width: int, new_tokens: int, shortest: int = 1) -> None:
        """Expect prompts up to ``width`` tokens and ``new_tokens`` more: the buffers' size
        (``shortest``, the shortest prompt, changes nothing here: each row's tokens start at
        its buffer's first position, so positions and buffer slots are the same).
        With CUDA graphs, the buffers for ``batch`` rows are allocated here and the decode
        step captured on them (one step on zeros, timed as ``compile_s``), so the decoding
        that follows replays it: a prefill of that many rows keeps them, and a prefill of
        fewer (beam search prefills each prompt once) moves into them when its rows are
        reordered to ``batch``."""
        self.new_tokens = max(1, int(new_tokens))
        if self.cuda_graph and self.new_tokens > 1:  # one new token: no decode step runs
            self.capture(batch, width)

    def capture(self, batch: int, width: int) -> None:
        """Allocate the buffers for ``batch`` rows and prompts up to ``width`` tokens, keep
        them as the prepared set and run :data:`CAPTURE_STEPS` decode step on zeros through
        them: with CUDA graphs, the capture (without, the same run, uncaptured)."""
        start, before = time.perf_counter(), self.compile_s
        self._buffers(batch, self._capacity(width))
        self.prepared = self.active
        self.counts = np.zeros(batch, np.int64)
        for _ in range(CAPTURE_STEPS):
            self.step(np.zeros(batch, np.int64))
        self.compile_s = before + time.perf_counter() - start  # the step's capture within

    def _capacity(self, width: int) -> int:
        """Positions per buffer for prompts ``width`` wide: room for the new tokens, within
        the model's own limit."""
        capacity = width + self.new_tokens
        if self.max_len is not None:
            capacity = min(capacity, max(self.max_len, width + 1))
        return capacity

    def _buffers(self, rows: int, capacity: int, keep: dict[str, np.ndarray] | None = None
                 ) -> None:
        """Make (rows, capacity) buffers the active set, ``keep``'s values in their first
        positions: the prepared set when it has that shape (its addresses, and graph, stay),
        else a new one on the device (a new graph id). The set left behind is dropped unless
        it is the prepared one, and the prepared one once the buffers outgrow it."""
        from tfgraph.limits import check_memory

        prepared = self.prepared
        if prepared is not None and (prepared.rows, prepared.capacity) == (rows, capacity):
            target = prepared
            if keep is not None:
                target.fill(keep, self.layout)
        else:
            # the host copy and the device buffers (a model's sizes are its own: refused
            # here rather than by a MemoryError part-way through the allocations)
            check_memory(what(rows, capacity), 2 * rows * self.layout.bytes_per_row(capacity))
            target = allocate(self.session, self.layout, rows, capacity, self.next_graph_id,
                              keep)
            self.next_graph_id += 1
        old, self.active, self.cache = self.active, target, target.cache
        if old is not None and old is not target and old is not prepared:
            self._drop(old)
        if prepared is not None and prepared.capacity != capacity:  # grown past it
            self._drop(prepared)
            self.prepared = None

    def _drop(self, old: BufferSet) -> None:
        """Let a set go, and its captured graph (which holds its addresses)."""
        if self.cuda_graph and old.ran:
            self.session.release_captured_graph(old.graph_id)
        self.run_options.pop(old.graph_id, None)

    def _run_options(self, graph_id: int) -> Any:
        """Run options naming the CUDA graph of this run (-1: none), or None without graphs
        (made once per graph id: every decode step reuses them)."""
        if not self.cuda_graph:
            return None
        options = self.run_options.get(graph_id)
        if options is None:
            import onnxruntime as ort

            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(graph_id))
            self.run_options[graph_id] = options
        return options

    def _shape(self) -> tuple[int, int] | None:
        """(rows, capacity) of the current device buffers (None: none yet)."""
        if not self.share or self.active is None:
            return None
        return self.rows, self.capacity

    def _host_cache(self) -> dict[str, np.ndarray]:
        return {n: (v if isinstance(v, np.ndarray) else v.numpy()) for n, v in self.cache.items()}

    # one run
    def _run(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        session = self.session
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(ids, np.int64))
        binding.bind_cpu_input("attention_mask", np.ascontiguousarray(mask, np.int64))
        if self.layout.with_positions:
            binding.bind_cpu_input("position_ids", np.ascontiguousarray(positions, np.int64))
        for name in self.names:
            value = self.cache[name]
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
            else:
                binding.bind_ortvalue_input(name, value)
        binding.bind_output(self.layout.logits, "cpu")  # what the sampler reads
        for past, present in zip(self.names, self.presents):
            if self.share:  # the same buffer: the kernel writes this step's keys into it
                binding.bind_ortvalue_output(present, self.cache[past])
            else:
                binding.bind_output(present, self.layout.device)
        out = run_bound(session, binding, self._run_options(-1))  # never captured
        if not self.share:
            self.cache = dict(zip(self.names, out[1:]))
        return np.asarray(out[0].numpy())  # the model's dtype: last_logits converts

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
            capacity = self._capacity(width)
            if (rows, capacity) != self._shape():  # else the buffers (and a captured graph)
                self._buffers(rows, capacity)  # stay: the prefill writes from position 0
        else:
            dims, dtype = self.layout.dims, self.layout.dtype
            self.cache = {n: np.zeros((rows, dims[n][0], 0, dims[n][1]), dtype)
                          for n in self.names}
        logits = self._run(right, self._mask(), positions)  # (B, W, V)
        last = logits[np.arange(rows), lengths - 1][:, None]  # each row's last prompt token
        return last_logits(last, self.output_probs)

    def step(self, next_ids: np.ndarray) -> np.ndarray:
        self.counts = self.counts + 1
        if self.share and int(self.counts.max()) > self.capacity:  # double, through the host
            self._buffers(len(self.counts), max(2 * self.capacity, int(self.counts.max())),
                          self._host_cache())
        ids, positions = next_ids.astype(np.int64)[:, None], (self.counts - 1)[:, None]
        if not self.share:
            return last_logits(self._run(ids, self._mask(), positions), self.output_probs)
        active = self.active
        assert active is not None  # allocated by the prefill (or prepare)
        fixed = active.fixed
        fixed["input_ids"].update_inplace(np.ascontiguousarray(ids))
        if self.cuda_graph:
            # A captured step keeps its shapes: the mask is as wide as the buffers
            # (total_sequence_length = the capacity), through the same fixed device value.
            fixed["attention_mask"].update_inplace(self._mask(active.capacity))
        else:
            # Uncaptured, the mask is as wide as the longest row: onnxruntime's CPU kernel
            # spends time in proportion to total_sequence_length, so a mask as wide as the
            # buffers would make every step as slow as the last one the buffers allow.
            active.binding.bind_cpu_input("attention_mask", self._mask())
        if self.layout.with_positions:
            fixed["position_ids"].update_inplace(np.ascontiguousarray(positions))
        options = self._run_options(active.graph_id)
        if self.cuda_graph and not active.ran:
            # The first step on a set: onnxruntime runs it uncaptured, captures and replays
            # it, in this call. Timed into compile_s, which the decoding loop's clock leaves
            # out (as a recompilation of the torch static cache), for buffers allocated
            # again mid-decoding too (rows leaving, growth); the step then runs again, as
            # every later one does, a replay: it writes this step's keys and values at the
            # same positions again and gives the same logits.
            start = time.perf_counter()
            run_bound(self.session, active.binding, options, outputs=False)
            active.ran = True
            self.compile_s += time.perf_counter() - start
        run_bound(self.session, active.binding, options, outputs=False)  # all bound: logits
        active.ran = True  # in fixed, the cache in the buffers
        # (on the CPU the OrtValue's numpy() is a view the next step overwrites: last_logits
        # returns a new array)
        return last_logits(fixed[self.layout.logits].numpy(), self.output_probs)

    def reorder(self, rows: np.ndarray) -> None:
        self.counts = self.counts[rows]
        host = {n: v[rows] for n, v in self._host_cache().items()}
        if self.share and self.active is not None and len(rows) == self.active.rows:
            self.active.fill(host, self.layout)  # beam search: rows permuted through the
            # host into the same buffers (and graph)
        elif self.share:
            self._buffers(len(rows), self.capacity, host)
        else:  # positions past a row's count are never read (the kernel's present is
            # as wide as the wider of the mask and the past)
            self.cache = host
