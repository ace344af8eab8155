"""Pieces several families' converters and name maps share: decoder-only Llama-style layers,
sliding-window layer patterns, and the rows of a Llama-style name table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfgraph.hf.config import (HFConfig, SpecDraft, put_attention_dropout, put_rope,
                               rope_parameters)
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import MAX_LAYERS, Spec

_WINDOW_KINDS = {"sliding_attention": "local", "full_attention": "global"}


def layer_kinds(layers: int, kind: Callable[[int], str]) -> list[str] | None:
    """``layer_types`` of a config that has none, by its config class's rule for layer i
    (``kind``); None past the spec language's MAX_LAYERS (or below 1), which the spec then
    refuses naming the config's layer count, rather than first building a list of 10**12
    entries."""
    if not 1 <= layers <= MAX_LAYERS:
        return None
    return [kind(i) for i in range(layers)]


def put_windows(draft: SpecDraft, layer_types: list[Any] | None, window: int | None,
                layers: int, window_field: str = "sliding_window",
                types_field: str = "layer_types") -> None:
    """Sliding-window attention from per-layer ``layer_types`` (transformers >= 4.53) and the
    window width: nothing when every layer attends fully, ``attention.window`` when every layer
    slides, else also ``attention.window_pattern`` (the shortest period that repeats over the
    layers, e.g. Gemma 2's [local, global], Gemma 3's five local then one global; Qwen2's
    full-then-sliding layers are one period as long as the model)."""
    cfg = draft.config
    if not 1 <= layers <= MAX_LAYERS:  # the spec refuses it, naming the config's layer
        return  # count (and 10**12 layers would be a list of 10**12 here first)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)):
        cfg.refuse(window_field, "must be an integer")  # (int() would take "8" or 8.5)
    if layer_types is None:
        layer_types = ["sliding_attention" if window else "full_attention"] * layers
    if not isinstance(layer_types, list) or len(layer_types) != layers or any(
            not isinstance(t, str) or t not in _WINDOW_KINDS for t in layer_types):
        cfg.refuse(types_field, f"must list {layers} layers of "
                   f"{' or '.join(_WINDOW_KINDS)}", layer_types)
    if all(t == "full_attention" for t in layer_types):
        return
    if not window:
        cfg.refuse(window_field, "sliding-window layers need a window width", window)
    draft.put("attention.window", int(window), window_field)
    if all(t == "sliding_attention" for t in layer_types):
        return
    for period in range(1, layers + 1):
        if all(layer_types[i] == layer_types[i % period] for i in range(layers)):
            break
    draft.put("attention.window_pattern", [_WINDOW_KINDS[t] for t in layer_types[:period]],
              types_field, layer_types)


def put_sizes(draft: SpecDraft, cfg: HFConfig, arch: str, tied: bool,
              names: tuple[str, str, str, str] = ("hidden_size", "num_hidden_layers",
                                                  "vocab_size", "max_position_embeddings")
              ) -> int:
    """arch, d_model, layers, vocab and max_len from the config fields ``names`` (width,
    layers, vocabulary, positions: GPT-2 calls them n_embd, n_layer, vocab_size, n_positions),
    an unscaled token table tied to the head unless tie_word_embeddings says otherwise
    (``tied``: the family's default). Returns d_model."""
    width, layers, vocab, positions = names
    d = cfg.int(width)
    draft.put("arch", arch)
    draft.put("d_model", d, width)
    draft.put("layers", cfg.int(layers), layers)
    draft.put("vocab", cfg.int(vocab), vocab)
    draft.put("max_len", cfg.int(positions), positions)
    draft.put("embedding.scale", False)
    draft.put("embedding.tie_output", cfg.bool("tie_word_embeddings", tied),
              "tie_word_embeddings")
    return d


def put_rms_rope(draft: SpecDraft, cfg: HFConfig, position: str, partial: bool = False
                 ) -> None:
    """The RMSNorm (``rms_norm_eps``) at ``position`` with a final norm, and the rotary
    settings (rope_parameters) of Llama-style families (``partial``: see ``put_rope``)."""
    draft.put("norm.position", position)
    draft.put("norm.kind", "rmsnorm")
    draft.put("norm.eps", cfg.float("rms_norm_eps"), "rms_norm_eps")
    draft.put("norm.final", True)
    where, params = rope_parameters(cfg)
    put_rope(draft, params, where, partial=partial)


# modeling files that derive a None head_dim (``getattr(config, "head_dim", None) or
# hidden_size // heads``); the others' ``getattr(config, "head_dim", hidden_size // heads)``
# gets the None itself and fails, unless the config class derived it first (Llama's)
_NONE_HEAD_DIM_DERIVED = frozenset({"mistral", "mixtral", "starcoder2"})


def put_decoder_sizes(draft: SpecDraft, cfg: HFConfig, head_dim_field: str | None = "head_dim"
                      ) -> None:
    """arch, d_model, layers, vocab, max_len, heads, kv_heads, head_dim of a Llama-style
    decoder (field names of LlamaConfig and its descendants) and its attention_dropout, on
    the attention weights in every family that calls this (each modeling file's
    ``dropout=0.0 if not self.training else self.attention_dropout`` to the attention
    interface). ``head_dim_field`` None: the model takes hidden_size / heads whatever the
    config says (StableLM). A key transformers leaves None where the model needs a number
    (num_key_value_heads, which it divides by; head_dim, see above) is refused."""
    draft.put("arch", "decoder-only")
    d = cfg.int("hidden_size")
    heads = cfg.int("num_attention_heads")
    draft.put("d_model", d, "hidden_size")
    draft.put("layers", cfg.int("num_hidden_layers"), "num_hidden_layers")
    draft.put("vocab", cfg.int("vocab_size"), "vocab_size")
    # absent: the config class's (Qwen2's 32768), which transformers' rotary scalings read
    positions = cfg.get("max_position_embeddings", None)
    if positions is not None:
        draft.put("max_len", cfg.int("max_position_embeddings", positions),
                  "max_position_embeddings")
    draft.put("attention.heads", heads, "num_attention_heads")
    if cfg.keeps_none("num_key_value_heads"):
        cfg.refuse("num_key_value_heads", f"transformers' {cfg.model_type} config leaves it "
                   "None, which its model divides by: required")
    draft.put("attention.kv_heads", cfg.int("num_key_value_heads", heads), "num_key_value_heads")
    if head_dim_field is None:
        head_dim = d // heads
    elif cfg.keeps_none(head_dim_field) and cfg.model_type not in _NONE_HEAD_DIM_DERIVED:
        cfg.refuse(head_dim_field, f"transformers' {cfg.model_type} model reads it as None "
                   "(its config class derives nothing) and fails: required")
    else:
        head_dim = cfg.int(head_dim_field, d // heads)
    if head_dim != d // heads or d % heads:
        draft.put("attention.head_dim", head_dim, head_dim_field)
    draft.put("embedding.scale", False)
    draft.put("embedding.tie_output", cfg.bool("tie_word_embeddings", False),
              "tie_word_embeddings")
    draft.put("dropout", 0.0)
    # SeedOssConfig's attention_dropout defaults to 0.1, every other family's to 0.0
    put_attention_dropout(draft, cfg, "attention_dropout",
                          0.1 if cfg.model_type == "seed_oss" else 0.0)


def layers_of(spec: Spec, stack: str = "decoder") -> int:
    return spec.layer_count(stack)


def linear_rows(hf: str, ours: str, bias: bool) -> list[Rule]:
    """A Linear's weight (and bias): ``hf`` and ``ours`` are module paths."""
    rows = [Rule(f"{hf}.weight", (f"{ours}.weight",))]
    if bias:
        rows.append(Rule(f"{hf}.bias", (f"{ours}.bias",)))
    return rows


def norm_rows(hf: str, ours: str, spec: Spec) -> list[Rule]:
    """A norm's gain (and bias for a LayerNorm that has one); none without parameters."""
    if not spec.norm.affine:
        return []
    return linear_rows(hf, ours, spec.norm.kind == "layernorm" and spec.norm.bias)


def head_rows(spec: Spec, hf: str, table: str = "embed.tokens.weight") -> list[Rule]:
    """The output projection: its own weight, or (tied) another name of the token table."""
    if spec.embedding.tie_output:
        return [Rule(f"{hf}.weight", (table,), "alias")]
    rows = [Rule(f"{hf}.weight", ("head.weight",))]
    if spec.embedding.output_bias:
        rows.append(Rule(f"{hf}.bias", ("head.bias",)))
    return rows


def llama_outer_rows(spec: Spec) -> list[Rule]:
    """The rows around a Llama-style decoder's layers: ``model.embed_tokens``, the final
    ``model.norm`` and ``lm_head`` (tied or its own)."""
    rows = [Rule("model.embed_tokens.weight", ("embed.tokens.weight",))]
    rows += norm_rows("model.norm", "decoder.norm", spec)
    return rows + head_rows(spec, "lm_head")


def llama_layer_rows(spec: Spec, prefix: str, norms: dict[str, str], *, gated: bool = True
                     ) -> list[Rule]:
    """``{prefix}.{i}.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj`` and the given
    per-layer norms (Hugging Face name -> tfgraph name under the layer)."""
    att, dst = spec.attention, "decoder.layers.{i}"
    rows: list[Rule] = []
    for r in "qkv":
        rows += linear_rows(f"{prefix}.{{i}}.self_attn.{r}_proj", f"{dst}.self_attn.{r}",
                            bool(att.qkv_bias))
    rows += linear_rows(f"{prefix}.{{i}}.self_attn.o_proj", f"{dst}.self_attn.o",
                        bool(att.out_bias))
    for r in ("gate", "up", "down") if gated else ("up", "down"):
        rows += linear_rows(f"{prefix}.{{i}}.mlp.{r}_proj", f"{dst}.ffn.{r}", spec.ffn.bias)
    for theirs, ours in norms.items():
        rows += norm_rows(f"{prefix}.{{i}}.{theirs}", f"{dst}.{ours}", spec)
    return rows
