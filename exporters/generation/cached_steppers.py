"""The KV-cache model run once, on onnxruntime or torch, for tfgraph.generation.cached.

onnxruntime: the cache is a dict of numpy arrays fed back by name (``present.{i}.*`` become
``past_key_values.{i}.*``). torch: the cache stays a tuple of tensors on the module's device
between steps (no copies through numpy); only the logits come back as numpy.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.exporters.generation.row_gather import RowGather
from tfgraph.exporters.onnx import bfloat16
from tfgraph.exporters.onnx.runtime import run_all, run_bound
from tfgraph.generation.cached import Cached, CachedSeq2Seq
from tfgraph.generation.floats import load_for


def onnx_cached(session: Any, vocab: int, max_len: int | None,
                output_probs: bool = False, bind: bool = True) -> Cached:
    """A cached stepper over an onnxruntime session of a KV-cache model.

    ``bind`` (default): onnxruntime I/O binding; the present keys/values stay OrtValues on
    the session's device (the GPU under the CUDA provider) and are bound as the next step's
    past, so the cache never goes through numpy between steps; only the ids, mask and
    positions go in and the logits come back to the host. ``bind=False``: plain
    ``session.run`` with numpy arrays (the path before; kept for comparison).

    A bfloat16 cache (numpy has none): bound, the empty cache is bfloat16 OrtValues on the
    device, rows are selected there (exporters/generation/row_gather.py) and bfloat16 logits
    widened to float32 on the host; unbound, the host holds the cache as float32 (exact:
    exporters/onnx/bfloat16.py)."""
    past_inputs = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    names = [i.name for i in past_inputs]
    # (kv_heads, width) of each past input: a latent-attention cache's keys and values differ
    dims = {i.name: (int(i.shape[1]), int(i.shape[3])) for i in past_inputs}
    np_dtype = _host_dtype(past_inputs[0].type)
    load_for(_host_dtype(session.get_outputs()[0].type))  # the logits' (tfgraph.generation.
    # floats: before any clock)
    positions_in = with_positions(session)
    if bind:
        return _bound_cached(session, names, dims, np_dtype, positions_in,
                             vocab, max_len, output_probs, past_inputs[0].type == bfloat16.TYPE)

    def empty(batch: int) -> dict[str, np.ndarray]:
        return {n: np.zeros((batch, dims[n][0], 0, dims[n][1]), np_dtype) for n in names}

    def run(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
            past: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        feeds = {"input_ids": ids, "attention_mask": mask, **past}
        if positions_in:
            feeds["position_ids"] = positions
        out = run_all(session, feeds)
        return out[0], dict(zip(names, out[1:]))  # last_logits converts the last position

    def select(past: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        return {n: v[rows] for n, v in past.items()}

    return Cached(run, empty, select, vocab, max_len, output_probs)


def _host_dtype(onnx_type: str) -> Any:
    """The numpy dtype tfgraph holds a tensor of ``onnx_type`` in on the host: float16 as
    itself, float32 and bfloat16 as float32 (exporters/onnx/bfloat16.py)."""
    return np.float16 if onnx_type == "tensor(float16)" else np.float32


def with_positions(session: Any) -> bool:
    """Whether a KV-cache model takes position_ids."""
    return any(i.name == "position_ids" for i in session.get_inputs())


def session_device(session: Any) -> str:
    """Where a session's tensors live for I/O binding: "cuda" under the CUDA provider."""
    return "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"


def _bound_cached(session: Any, names: list[str], dims: dict[str, tuple[int, int]],
                  np_dtype: Any, with_positions: bool, vocab: int, max_len: int | None,
                  output_probs: bool, bf16: bool = False) -> Cached:
    """onnx_cached's I/O-bound path: past/present as device OrtValues; ``dims`` the
    (kv_heads, width) of each past input; ``bf16``: the cache is bfloat16."""
    device = session_device(session)
    outputs = [o.name for o in session.get_outputs()]
    presents = outputs[1:]
    bf16_logits = session.get_outputs()[0].type == bfloat16.TYPE
    gather = RowGather(session, device, bfloat16.ONNX_TYPE) if bf16 else None

    def empty(batch: int) -> dict[str, Any]:
        if bf16:  # no positions yet, so nothing to write: bfloat16 OrtValues on the device
            return {n: bfloat16.empty((batch, dims[n][0], 0, dims[n][1]), device)
                    for n in names}
        # host arrays, copied in by the binding
        return {n: np.zeros((batch, dims[n][0], 0, dims[n][1]), np_dtype) for n in names}

    def run(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
            past: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(ids))
        binding.bind_cpu_input("attention_mask", np.ascontiguousarray(mask))
        if with_positions:
            binding.bind_cpu_input("position_ids", np.ascontiguousarray(positions))
        for name, value in past.items():
            if isinstance(value, np.ndarray):  # the empty cache, or rows reordered
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
            else:  # the last step's present, where onnxruntime left it
                binding.bind_ortvalue_input(name, value)
        binding.bind_output(outputs[0], "cpu")  # the logits: what the sampler reads
        for name in presents:
            binding.bind_output(name, device)  # onnxruntime allocates them there
        out = run_bound(session, binding)
        # the model's dtype: last_logits converts the last position (bfloat16, which numpy
        # lacks: float32 here)
        logits = bfloat16.to_host(out[0]) if bf16_logits else out[0].numpy()
        return logits, dict(zip(names, out[1:]))

    def select(past: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
        if gather is not None:  # bfloat16: on the device (numpy has no bfloat16)
            return {n: gather(v, rows) for n, v in past.items()}
        # rows leave or beams move: through the host (steps alone keep the cache on device)
        return {n: (v if isinstance(v, np.ndarray) else v.numpy())[rows]
                for n, v in past.items()}

    return Cached(run, empty, select, vocab, max_len, output_probs)


def torch_cached(module: Any, vocab: int, max_len: int | None, device: str,
                 output_probs: bool = False) -> Cached:
    """A cached stepper over the torch module of a KV-cache graph (DecoderModel)."""
    import torch

    module = module.to(device)

    def empty(batch: int) -> tuple[tuple[Any, Any], ...]:
        key, value = (torch.zeros((batch, module.kv_heads, 0, width), dtype=module.dtype,
                                  device=device)
                      for width in (module.head_dim, module.value_dim))
        return tuple((key, value) for _ in range(module.cache_layers))

    def run(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
            past: Any) -> tuple[np.ndarray, Any]:
        with torch.no_grad():
            logits, present = module(torch.from_numpy(ids).to(device),
                                     torch.from_numpy(mask).to(device),
                                     torch.from_numpy(np.ascontiguousarray(positions)).to(device),
                                     past, use_cache=True)
        return logits[:, -1:].float().cpu().numpy(), present

    def select(past: Any, rows: np.ndarray) -> Any:
        index = torch.from_numpy(rows).to(device)
        return tuple((k.index_select(0, index), v.index_select(0, index)) for k, v in past)

    return Cached(run, empty, select, vocab, max_len, output_probs)


class TorchStatic:
    """A cached stepper (tfgraph.generation.backend.Stepper) over a decoder's static cache
    attached to the module (``DecoderModel.setup_cache``, gpt-fast style): prefill and every
    step write in place into preallocated buffers of ``batch`` rows and ``length`` positions,
    so the decoding step has one shape from the first step to the last and ``torch.compile``
    (``compile=True``: ``mode="reduce-overhead"`` on CUDA, CUDA graphs; inductor's default
    elsewhere) compiles it once. Rows that leave the batch (``reorder``) are moved to the
    first rows of the buffers and the step keeps running on all of them (the rest are
    ignored), so no shape changes; more rows than the buffers hold reallocate them.

    ``prepare(batch, width, new_tokens, shortest)`` sizes the cache and, compiled, runs the
    compilation once (a throw-away step whose cache writes the real steps overwrite);
    ``compile_s`` is the time that took, kept out of the decoding loop's prefill and decode
    timings (as is any compilation later: buffers reallocated for more rows or positions
    than prepared for).

    Slots are not positions: prompts are left-padded to the longest (``width``) and every
    step writes one slot for all rows, so a short prompt's tokens sit at slots ahead of its
    positions. A learned table's ``max_len`` caps each row's positions (the loop stops a row
    of P tokens after max_len - P + 1 new ones), not the slots: the buffers hold ``width``
    plus the most new tokens any row can take."""

    encoder_decoder = False

    def __init__(self, module: Any, vocab: int, max_len: int | None, device: str,
                 output_probs: bool = False, compile: bool = False,
                 mode: str | None = None) -> None:
        import torch

        self.torch = torch
        self.module = module.to(device)
        self.vocab, self.max_len, self.output_probs = vocab, max_len, output_probs
        self.device = device
        self.compiled = compile
        self.mode = mode if mode is not None else (
            "reduce-overhead" if compile and str(device).startswith("cuda") else None)
        self.step_fn: Any = self.module
        if compile:
            self.step_fn = torch.compile(self.module, mode=self.mode, dynamic=False)
        self.compile_s = 0.0
        self.new_tokens = 256  # positions reserved past the prompt until prepare says
        self.batch = 0  # rows the buffers hold
        self.length = 0  # positions the buffers hold
        self.rows = 0  # rows in use
        self.width = 0  # positions written so far (the mask's width)
        self.mask = np.zeros((0, 0), np.int64)
        self.next_position = np.zeros(0, np.int64)
        self.cache: Any = None
        self._warm: set[tuple[int, int]] = set()

    # sizing and compilation
    def prepare(self, batch: int, width: int, new_tokens: int, shortest: int = 1) -> None:
        """Expect up to ``batch`` rows, prompts of ``shortest`` to ``width`` tokens and
        ``new_tokens`` tokens past them: allocate the buffers and, compiled, compile the step
        now, so that the decoding loop's clock does not count it (``compile_s`` does)."""
        self.new_tokens = max(1, int(new_tokens))
        self._reserve_rows = max(1, int(batch))
        self._shortest = max(1, int(shortest))
        self._allocate(self._reserve_rows, self._length(width, self._shortest))
        self._warm_up()

    _reserve_rows = 1
    _shortest = 1

    def _length(self, width: int, shortest: int) -> int:
        """Slots for prompts left-padded to ``width``, the shortest of ``shortest`` tokens:
        ``width`` plus the most new tokens a row takes (a learned table's max_len stops a row
        of P tokens after max_len - P + 1), the last of which no step writes, so one slot
        to spare."""
        new = self.new_tokens
        if self.max_len is not None:
            new = min(new, max(1, self.max_len - shortest + 1))
        return width + new

    def _allocate(self, batch: int, length: int) -> None:
        self.cache = self.module.setup_cache(batch, length)
        self.batch, self.length = batch, length

    def _warm_up(self) -> None:
        """Compile the step for the buffers' shapes once, timed into ``compile_s`` (not when
        no step will run: one new token comes from the prefill)."""
        if not self.compiled or self.new_tokens <= 1 or (self.batch, self.length) in self._warm:
            return
        torch = self.torch
        start = time.perf_counter()
        ids = torch.zeros((self.batch, 1), dtype=torch.long, device=self.device)
        mask = torch.zeros((self.batch, self.length), dtype=torch.long, device=self.device)
        where = torch.tensor([self.length - 1], device=self.device)
        with torch.no_grad():
            for _ in range(3):  # CUDA graphs: a warm-up call, a recording, a replay
                self.step_fn(ids, mask, torch.zeros_like(ids), cache_position=where)
        if str(self.device).startswith("cuda"):
            torch.cuda.synchronize()
        self._warm.add((self.batch, self.length))
        self.compile_s += time.perf_counter() - start

    def _warmed(self) -> Any:
        """Where the compiled step runs for buffers ``_warm_up`` compiled it for: dynamo
        evaluates only the guards that tell its compiled versions apart (the tensors' shapes,
        strides and dtypes, and what failed when it recompiled), not the thousands that
        tracing the module's program installed (its lists, dicts and attributes), whose check
        took longer than the step (about 5 ms of host time for a 22-layer step on a 2-core
        CPU). The module does not change between steps and every step has the warm-up's
        shapes (torch.compiler.set_stance's ``skip_guard_eval_unsafe``, torch >= 2.6; every
        guard before)."""
        set_stance = getattr(self.torch.compiler, "set_stance", None)
        if not self.compiled or set_stance is None:
            return contextlib.nullcontext()
        try:
            return set_stance(skip_guard_eval_unsafe=True)
        except TypeError:  # a set_stance without the flag
            return contextlib.nullcontext()

    def _tensor(self, a: np.ndarray) -> Any:
        # a fresh C-ordered copy: a view's strides (0 on a new axis) would fail the compiled
        # step's stride guards and compile it again
        return self.torch.from_numpy(np.array(a, order="C", copy=True)).to(self.device)

    def _pad(self, a: np.ndarray) -> np.ndarray:
        """Rows of ``a`` padded with zeros to the buffers' batch."""
        if a.shape[0] == self.batch:
            return a
        out = np.zeros((self.batch, *a.shape[1:]), a.dtype)
        out[:a.shape[0]] = a
        return out

    def _full_mask(self) -> np.ndarray:
        mask = np.zeros((self.batch, self.length), np.int64)
        mask[:self.rows, :self.width] = self.mask
        return mask

    def _last(self, logits: Any) -> np.ndarray:
        from tfgraph.generation.cached import last_logits

        return last_logits(logits[:self.rows, -1:].float().cpu().numpy(), self.output_probs)

    def close(self) -> None:
        """Detach the buffers from the module (a caller's module must not keep holding them
        once generation ends)."""
        if self.cache is not None:
            self.module.release_cache()
            self.cache = None
            self._warm.clear()

    # the Stepper calls
    def prefill(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        torch = self.torch
        rows, width = ids.shape
        length = self._length(width, min(self._shortest, int(lengths.min())))
        batch = max(rows, self._reserve_rows)
        if self.cache is None or self.batch < batch or self.length < length:
            self._allocate(batch, length)
        self._warm_up()
        self.rows, self.width = rows, width
        self.mask = (np.arange(width)[None, :] >= width - lengths[:, None]).astype(np.int64)
        positions = np.clip(np.cumsum(self.mask, axis=1) - 1, 0, None)
        with torch.no_grad():  # eager: prompt shapes vary from call to call
            logits = self.module(self._tensor(self._pad(ids.astype(np.int64))),
                                 self._tensor(self._full_mask()),
                                 self._tensor(self._pad(positions)),
                                 cache_position=torch.arange(width, device=self.device))
        self.next_position = lengths.astype(np.int64)
        return self._last(logits)

    def _grow(self) -> None:
        """Double the positions the buffers hold (copying what is written)."""
        old = [(k.clone(), v.clone()) for k, v in self.cache]
        self._allocate(self.batch, max(self.length * 2, self.width + 1))
        for (k, v), (ok, ov) in zip(self.cache, old):
            k[:, :, :ok.shape[2]].copy_(ok)
            v[:, :, :ov.shape[2]].copy_(ov)
        self._warm_up()

    def step(self, next_ids: np.ndarray) -> np.ndarray:
        torch = self.torch
        if self.width >= self.length:
            self._grow()
        t = self.width
        self.mask = np.concatenate([self.mask, np.ones((self.rows, 1), np.int64)], axis=1)
        self.width += 1
        with torch.no_grad(), self._warmed():
            logits = self.step_fn(self._tensor(self._pad(next_ids.astype(np.int64)[:, None])),
                                  self._tensor(self._full_mask()),
                                  self._tensor(self._pad(self.next_position[:, None])),
                                  cache_position=torch.tensor([t], device=self.device))
        self.next_position = self.next_position + 1
        return self._last(logits)

    @property
    def decodes_ahead(self) -> bool:
        """Whether ``greedy_steps`` stands for steps and the loop's greedy choice: not for a
        model ending in a softmax (the loop picks from the logs of its probabilities)."""
        return not self.output_probs

    def greedy_steps(self, next_ids: np.ndarray, count: int) -> np.ndarray:
        """``count`` greedy steps that read nothing back until the last (gpt-fast's loop):
        feed ``next_ids`` (rows,), then each step's argmax, taken on the module's device;
        returns the (rows, count) int64 tokens chosen. The tokens of ``count`` calls of
        ``step`` and the loop's argmax (the same logits, converted exactly; ties to the first
        id), without a device-to-host copy of the logits and a synchronisation per step: on
        CUDA the host queues the next CUDA-graph replay while the GPU runs the last. The
        buffers grow first if the steps would outrun them. TfgraphError if any step's logits
        held NaN (found at the end)."""
        from tfgraph.generation.loop import NAN_LOGITS

        torch = self.torch
        while self.width + count > self.length:
            self._grow()
        rows, start = self.rows, self.width
        # the step's inputs, on the device and updated in place from step to step
        ids = self._tensor(self._pad(next_ids.astype(np.int64)[:, None]))
        mask = self._tensor(self._full_mask())
        positions = self._tensor(self._pad(self.next_position[:, None]))
        where = torch.tensor([start], device=self.device)
        nan = torch.zeros((), dtype=torch.bool, device=self.device)
        chosen = []
        with torch.no_grad(), self._warmed():
            for slot in range(start, start + count):
                mask[:rows, slot] = 1
                last = self.step_fn(ids, mask, positions, cache_position=where)[:, -1]
                nan |= last[:rows].isnan().any()
                ids = last.argmax(dim=-1, keepdim=True)  # (batch, 1), a fresh tensor
                del last  # a CUDA graph's output: the next replay overwrites it
                chosen.append(ids)
                positions[:rows] += 1
                where += 1
            tokens = torch.cat(chosen, dim=1)[:rows].cpu().numpy()  # the one read back
        self.mask = np.concatenate([self.mask, np.ones((rows, count), np.int64)], axis=1)
        self.width += count
        self.next_position = self.next_position + count
        if bool(nan):
            raise TfgraphError(NAN_LOGITS)
        return tokens

    def reorder(self, rows: np.ndarray) -> None:
        self.mask = self.mask[rows]
        self.next_position = self.next_position[rows]
        n = int(rows.shape[0])
        index = self.torch.from_numpy(np.ascontiguousarray(rows)).to(self.device)
        if n > self.batch:  # more rows than the buffers hold: new buffers
            old = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.cache]
            self._allocate(n, self.length)
            for (k, v), (ok, ov) in zip(self.cache, old):
                k.copy_(ok)
                v.copy_(ov)
            self._warm_up()
        elif n:
            self.cache.select_rows(index)
        self.rows = n


def onnx_seq2seq(encoder: Any, decoder: Any, vocab: int, max_len: int | None,
                 decoder_start: int, output_probs: bool = False) -> CachedSeq2Seq:
    """A cached stepper over onnxruntime sessions of an encoder-decoder's two KV-cache
    graphs (``graph.info.kind == "cached"``, ``part`` "encoder" and "decoder")."""
    own = [i for i in decoder.get_inputs() if ".decoder." in i.name]
    names = [i.name for i in own]
    kv_heads, head_dim = int(own[0].shape[1]), int(own[0].shape[3])
    np_dtype = _host_dtype(own[0].type)  # bfloat16: float32 on the host (run_all narrows)
    load_for(_host_dtype(decoder.get_outputs()[0].type))
    # encoder_model.onnx returns last_hidden_state (unused here: the keys/values are computed)
    # then every decoder layer's present.{i}.encoder.key|value, the decoder's cross inputs
    encoder_outputs = [o.name for o in encoder.get_outputs()]
    cross_at = [k for k, name in enumerate(encoder_outputs) if name.startswith("present.")]
    cross_names = [encoder_outputs[k].replace("present", "past_key_values", 1)
                   for k in cross_at]
    encoder_inputs = {i.name for i in encoder.get_inputs()}
    decoder_inputs = {i.name for i in decoder.get_inputs()}

    def encode(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray
               ) -> dict[str, np.ndarray]:
        feeds = {"src_ids": ids, "attention_mask": mask}
        if "position_ids" in encoder_inputs:
            feeds["position_ids"] = positions
        out = run_all(encoder, feeds)
        return {name: out[k] for name, k in zip(cross_names, cross_at)}

    def decode(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
               source_mask: np.ndarray, cross: dict[str, np.ndarray],
               past: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        feeds = {"input_ids": ids, "attention_mask": mask,
                 "encoder_attention_mask": source_mask, **cross, **past}
        if "position_ids" in decoder_inputs:
            feeds["position_ids"] = positions
        out = run_all(decoder, feeds)
        return out[0], dict(zip(names, out[1:]))  # last_logits converts the last position

    def empty(batch: int) -> dict[str, np.ndarray]:
        return {n: np.zeros((batch, kv_heads, 0, head_dim), np_dtype) for n in names}

    def select(state: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        return {n: v[rows] for n, v in state.items()}

    return CachedSeq2Seq(encode, decode, empty, select, vocab, max_len, decoder_start,
                         output_probs)


def torch_seq2seq(encoder: Any, decoder: Any, vocab: int, max_len: int | None, device: str,
                  decoder_start: int, output_probs: bool = False) -> CachedSeq2Seq:
    """A cached stepper over the torch modules of an encoder-decoder's two KV-cache graphs
    (EncoderDecoderModel: encode, decode); caches stay tensors on ``device``."""
    import torch

    encoder, decoder = encoder.to(device), decoder.to(device)

    def tensor(a: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    def encode(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> Any:
        with torch.no_grad():
            return encoder(tensor(ids), tensor(mask), tensor(positions))[1]

    def decode(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
               source_mask: np.ndarray, cross: Any, past: Any) -> tuple[np.ndarray, Any]:
        with torch.no_grad():
            logits, present = decoder(tensor(ids), cross, tensor(source_mask), tensor(mask),
                                      tensor(positions), past, use_cache=True)
        return logits[:, -1:].float().cpu().numpy(), present

    def empty(batch: int) -> Any:
        none = torch.zeros((batch, decoder.kv_heads, 0, decoder.head_dim), dtype=decoder.dtype,
                           device=device)
        return tuple((none, none) for _ in range(decoder.cache_layers))

    def select(state: Any, rows: np.ndarray) -> Any:
        index = torch.from_numpy(rows).to(device)
        return tuple((k.index_select(0, index), v.index_select(0, index)) for k, v in state)

    return CachedSeq2Seq(encode, decode, empty, select, vocab, max_len, decoder_start,
                         output_probs)
