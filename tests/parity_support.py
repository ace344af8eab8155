"""Helpers shared by the parity tests against Hugging Face families: random weights, the
logits check, and a tiny spec from ``specs/`` compared with a reference through both back ends
(to_torch and ONNX in onnxruntime)."""

from __future__ import annotations

import itertools
import json
import weakref

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.spec.schema import Spec

ATOL = 1e-4


def randomize(model: nn.Module, seed: int) -> None:
    """Norm gains 1 + N(0, 0.1); every other parameter N(0, 0.1) (biases non-zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.1
            is_gain = p.dim() == 1 and name.endswith("weight")
            p.copy_(noise + 1.0 if is_gain else noise)


def check(ours: Tensor, ref: Tensor) -> None:
    err = (ours - ref).abs().max().item()
    assert err <= ATOL, f"max abs error {err:.3e} > {ATOL}"


def tiny(name: str) -> Spec:
    from tfgraph.spec.loader import load_spec

    return load_spec(Path(__file__).resolve().parent.parent / "specs" / name)


def check_against(spec: Spec, ref: nn.Module, weights: dict[str, Tensor]
                   ) -> tuple[Tensor, Tensor]:
    """tfgraph with ``weights`` (mapped from ``ref``) against ``ref``: the same parameter
    count, and logits within ATOL through to_torch and through ONNX in onnxruntime.
    Returns the ids and the reference logits."""
    ort = pytest.importorskip("onnxruntime")
    from tfgraph.exporters.onnx.model import to_onnx

    graph = tfgraph.compile(spec)
    assert graph.report()["params"] == sum(p.numel() for p in ref.parameters())
    ours = to_torch(graph, weights=weights).eval()
    ids = torch.randint(0, spec.vocab_size("source"), (2, 19),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(ids).logits
        check(ours(ids), expected)
    model = to_onnx(graph, weights={k: v.detach() for k, v in weights.items()})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    check(torch.from_numpy(session.run(None, {"input_ids": ids.numpy()})[0]), expected)
    return ids, expected


def llama_family_config(spec: Spec) -> dict[str, Any]:
    """Config arguments Llama-family classes (Qwen2, OLMo 2, ...) share, from ``spec``."""
    att = spec.attention
    return dict(hidden_size=spec.d_model, intermediate_size=spec.ffn.hidden,
                num_hidden_layers=spec.layers, num_attention_heads=att.heads,
                num_key_value_heads=att.kv_heads, vocab_size=spec.vocab,
                rms_norm_eps=spec.norm.eps, max_position_embeddings=spec.max_len or 2048,
                rope_theta=spec.embedding.rope_theta,
                bos_token_id=0, eos_token_id=0, pad_token_id=None)


def llama_family_weights(spec: Spec, sd: dict[str, Tensor], norms: dict[str, str]
                          ) -> dict[str, Tensor]:
    """Llama-family names (``model.layers.i.self_attn.q_proj``, ``mlp.gate_proj``, ...) to
    tfgraph's; every bias present in ``sd`` comes along. ``norms`` maps tfgraph's per-layer
    norm names to the family's (they differ: input_layernorm, post_feedforward_layernorm)."""
    weights = {"embed.tokens.weight": sd["model.embed_tokens.weight"],
               "decoder.norm.weight": sd["model.norm.weight"]}
    if "lm_head.weight" in sd and not spec.embedding.tie_output:
        weights["head.weight"] = sd["lm_head.weight"]
    for i in range(spec.layers):
        src, dst = f"model.layers.{i}", f"decoder.layers.{i}"
        pairs = {f"self_attn.{r}": f"self_attn.{r}_proj" for r in "qkvo"}
        pairs.update({f"ffn.{r}": f"mlp.{r}_proj" for r in ("gate", "up", "down")})
        pairs.update({ours: theirs for ours, theirs in norms.items()})
        for ours, theirs in pairs.items():
            for kind in ("weight", "bias"):
                if f"{src}.{theirs}.{kind}" in sd:
                    weights[f"{dst}.{ours}.{kind}"] = sd[f"{src}.{theirs}.{kind}"]
    return weights


def split_neox_qkv(w: Tensor, heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """GPT-NeoX's fused query_key_value rows are per head [q, k, v] (each head_dim rows)."""
    per_head = w.reshape(heads, 3, -1, *w.shape[1:])  # (h, 3, hd[, d])
    q, k, v = (per_head[:, j].reshape(-1, *w.shape[1:]) for j in range(3))
    return q, k, v


def neox_weights(spec: Spec, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """GPT-NeoX names (``gpt_neox.layers.i.attention.query_key_value``, ...) to tfgraph's."""
    heads = spec.attention.heads
    weights = {"embed.tokens.weight": sd["gpt_neox.embed_in.weight"],
               "head.weight": sd["embed_out.weight" if "embed_out.weight" in sd
                                 else "lm_head.weight"]}
    for kind in ("weight", "bias"):
        weights[f"decoder.norm.{kind}"] = sd[f"gpt_neox.final_layer_norm.{kind}"]
    for i in range(spec.layers):
        src, dst = f"gpt_neox.layers.{i}", f"decoder.layers.{i}"
        for kind in ("weight", "bias"):
            q, k, v = split_neox_qkv(sd[f"{src}.attention.query_key_value.{kind}"], heads)
            weights.update({f"{dst}.self_attn.q.{kind}": q, f"{dst}.self_attn.k.{kind}": k,
                            f"{dst}.self_attn.v.{kind}": v})
            weights[f"{dst}.self_attn.o.{kind}"] = sd[f"{src}.attention.dense.{kind}"]
            weights[f"{dst}.ffn.up.{kind}"] = sd[f"{src}.mlp.dense_h_to_4h.{kind}"]
            weights[f"{dst}.ffn.down.{kind}"] = sd[f"{src}.mlp.dense_4h_to_h.{kind}"]
            weights[f"{dst}.self_attn_norm.{kind}"] = sd[f"{src}.input_layernorm.{kind}"]
            weights[f"{dst}.ffn_norm.{kind}"] = sd[f"{src}.post_attention_layernorm.{kind}"]
    return weights


@contextmanager
def saved_storages(module: nn.Module) -> Iterator[dict[int, int]]:
    """The distinct non-parameter storages autograd saved inside the block and still alive
    when it ends (data_ptr -> bytes). A storage saved by a node the graph then drops (a branch no
    gradient needs) leaves when it dies, so its address, taken again by a later storage,
    cannot hide that one."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}
    serials: dict[int, int] = {}  # the live storage at each address (an address is reused)
    count = itertools.count()
    watching: list[weakref.finalize] = []

    def gone(key: int, serial: int) -> None:
        if serials.get(key) == serial:
            del serials[key], seen[key]

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in params and key not in seen:
            seen[key] = storage.nbytes()
            serials[key] = serial = next(count)
            watching.append(weakref.finalize(storage, gone, key, serial))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen
    for watch in watching:  # what was alive when the block ended stays counted
        watch.detach()


def greedy_with_cache(model: nn.Module, ids: Tensor, mask: Tensor, new: int) -> Tensor:
    """``new`` greedy tokens (B, new) from a tfgraph module through its KV cache, the mask
    growing by one column a step (the caller's padded batch, as transformers' generate)."""
    with torch.no_grad():
        logits, past = model(ids, attention_mask=mask, use_cache=True)
        tokens = []
        for _ in range(new):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(nxt)
            mask = torch.cat([mask, torch.ones_like(nxt)], 1)
            logits, past = model(nxt, attention_mask=mask, past_key_values=past, use_cache=True)
    return torch.cat(tokens, 1)


DROP: Any = object()
"""A config.json edit that removes the key (``edit_config_json``)."""


def edit_config_json(folder: Path, edits: dict[str, Any]) -> dict[str, Any]:
    """Apply ``edits`` to ``folder``/config.json (``DROP`` removes a key); the new content."""
    data = json.loads((folder / "config.json").read_text())
    for key, value in edits.items():
        if value is DROP:
            data.pop(key, None)
        else:
            data[key] = value
    (folder / "config.json").write_text(json.dumps(data))
    return data

