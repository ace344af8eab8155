"""Pieces several families' ``config_from_spec`` share: the inverse readings of
:mod:`tfgraph.hf.config` and :mod:`tfgraph.hf.common` (activations, rotary settings, Llama-style
sizes, sliding-window layer types).

The rule every writer here follows: write a config field only where the family's transformers
model honours it, and write it explicitly whenever the config class's default would change the
computation (Mistral's ``sliding_window`` defaults to 4096, GPT-NeoX's rotary share to 0.25).
When a spec asks for something a family cannot hold, the writer still writes the family's own
value (e.g. its fixed activation); re-importing then differs from the spec in exactly that field,
and :func:`tfgraph.hf.export_config.hf_config` rejects the family naming it. No writer has to
decide on its own whether it is exact.
"""

from __future__ import annotations

from typing import Any

from tfgraph.spec.schema import GATED_ACTIVATIONS, Spec

# tfgraph activation -> Hugging Face name (the inverse of tfgraph.hf.config._PLAIN / _GATED)
_PLAIN = {"relu": "relu", "relu2": "relu2", "gelu": "gelu", "gelu_tanh": "gelu_new",
          "silu": "silu"}
_GATED = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_pytorch_tanh"}

# embedding.rope_scaling field -> Hugging Face rope_parameters key (transformers'
# modeling_rope_utils), the inverse of tfgraph.hf.config._SCALINGS
_SCALING_KEYS = {"original_max_len": "original_max_position_embeddings"}


def plain_activation(spec: Spec, fallback: str = "gelu") -> str:
    """The Hugging Face name of an ungated ``ffn.activation`` (``fallback`` for a gated one,
    which the round trip then reports as the difference)."""
    return _PLAIN.get(spec.ffn.activation, fallback)


def gated_activation(spec: Spec, fallback: str = "silu") -> str:
    """The Hugging Face name of the inner activation of a gated ``ffn.activation``."""
    return _GATED.get(spec.ffn.activation, fallback)


def is_gated(spec: Spec) -> bool:
    return spec.ffn.activation in GATED_ACTIVATIONS


def rope_parameters(spec: Spec, *, partial: bool = False, scaling: bool = True
                    ) -> dict[str, Any]:
    """transformers 5's ``rope_parameters``: theta, the scaling (when the family's rotary
    implementation takes one: ``scaling``) and the rotated share of each head (``partial``:
    the family rotates only the first channels, GPT-NeoX, Phi, Phi-3)."""
    emb = spec.embedding
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": float(emb.rope_theta)}
    if scaling and emb.rope_scaling is not None:
        params["rope_type"] = emb.rope_scaling.type
        for key, value in emb.rope_scaling.model_dump(exclude={"type"}).items():
            if value is not None:
                params[_SCALING_KEYS.get(key, key)] = value
    if partial:
        params["partial_rotary_factor"] = float(emb.rotary_fraction)
    return params


def layer_types(spec: Spec, stack: str = "decoder") -> list[str]:
    """transformers' per-layer ``layer_types`` of ``stack`` (sliding or full attention)."""
    return ["sliding_attention" if spec.layer_is_local(i) else "full_attention"
            for i in range(spec.layer_count(stack))]


def decoder_sizes(spec: Spec, *, head_dim: bool = True) -> dict[str, Any]:
    """The inverse of :func:`tfgraph.hf.common.put_decoder_sizes`: LlamaConfig's size fields
    (``head_dim`` only for families whose attention reads it), the output tying and the
    attention weights' dropout."""
    att = spec.attention
    out: dict[str, Any] = {
        "hidden_size": spec.d_model,
        "num_hidden_layers": spec.layer_count(spec.stacks[-1]),
        "vocab_size": spec.output_vocab,
        "num_attention_heads": att.heads,
        "num_key_value_heads": att.kv_heads,
    }
    if head_dim:
        out["head_dim"] = att.head_dim
    if spec.max_len is not None:
        out["max_position_embeddings"] = spec.max_len
    out["tie_word_embeddings"] = spec.embedding.tie_output
    out["attention_dropout"] = att.dropout  # written: Seed-OSS's default is 0.1
    return out

