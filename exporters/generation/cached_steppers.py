"""The KV-cache model run once, on onnxruntime or torch, for tfgraph.generation.cached.

onnxruntime: the cache is a dict of numpy arrays fed back by name (``present.{i}.*`` become
``past_key_values.{i}.*``). torch: the cache stays a tuple of tensors on the module's device
between steps (no copies through numpy); only the logits come back as numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfgraph.exporters.onnx.runtime import run_all
from tfgraph.generation.cached import Cached, CachedSeq2Seq


def onnx_cached(session: Any, vocab: int, max_len: int | None,
                output_probs: bool = False) -> Cached:
    """A cached stepper over an onnxruntime session of a KV-cache model."""
    past_inputs = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    names = [i.name for i in past_inputs]
    kv_heads, head_dim = int(past_inputs[0].shape[1]), int(past_inputs[0].shape[3])
    np_dtype = np.float16 if past_inputs[0].type == "tensor(float16)" else np.float32
    with_positions = any(i.name == "position_ids" for i in session.get_inputs())

    def empty(batch: int) -> dict[str, np.ndarray]:
        return {n: np.zeros((batch, kv_heads, 0, head_dim), np_dtype) for n in names}

    def run(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
            past: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        feeds = {"input_ids": ids, "attention_mask": mask, **past}
        if with_positions:
            feeds["position_ids"] = positions
        out = run_all(session, feeds)
        return np.asarray(out[0], np.float32), dict(zip(names, out[1:]))

    def select(past: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        return {n: v[rows] for n, v in past.items()}

    return Cached(run, empty, select, vocab, max_len, output_probs)


def torch_cached(module: Any, vocab: int, max_len: int | None, device: str,
                 output_probs: bool = False) -> Cached:
    """A cached stepper over the torch module of a KV-cache graph (DecoderModel)."""
    import torch

    module = module.to(device)

    def empty(batch: int) -> tuple[tuple[Any, Any], ...]:
        none = torch.zeros((batch, module.kv_heads, 0, module.head_dim), dtype=module.dtype,
                           device=device)
        return tuple((none, none) for _ in range(module.cache_layers))

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


def onnx_seq2seq(encoder: Any, decoder: Any, vocab: int, max_len: int | None,
                 decoder_start: int, output_probs: bool = False) -> CachedSeq2Seq:
    """A cached stepper over onnxruntime sessions of an encoder-decoder's two KV-cache
    graphs (``graph.info.kind == "cached"``, ``part`` "encoder" and "decoder")."""
    own = [i for i in decoder.get_inputs() if ".decoder." in i.name]
    names = [i.name for i in own]
    kv_heads, head_dim = int(own[0].shape[1]), int(own[0].shape[3])
    np_dtype = np.float16 if own[0].type == "tensor(float16)" else np.float32
    cross_names = [o.name.replace("present", "past_key_values")
                   for o in encoder.get_outputs()[1:]]
    encoder_inputs = {i.name for i in encoder.get_inputs()}
    decoder_inputs = {i.name for i in decoder.get_inputs()}

    def encode(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray
               ) -> dict[str, np.ndarray]:
        feeds = {"src_ids": ids, "attention_mask": mask}
        if "position_ids" in encoder_inputs:
            feeds["position_ids"] = positions
        out = run_all(encoder, feeds)
        return dict(zip(cross_names, out[1:]))

    def decode(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
               source_mask: np.ndarray, cross: dict[str, np.ndarray],
               past: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        feeds = {"input_ids": ids, "attention_mask": mask,
                 "encoder_attention_mask": source_mask, **cross, **past}
        if "position_ids" in decoder_inputs:
            feeds["position_ids"] = positions
        out = run_all(decoder, feeds)
        return np.asarray(out[0], np.float32), dict(zip(names, out[1:]))

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
