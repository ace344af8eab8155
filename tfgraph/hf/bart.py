"""BART (Lewis et al. 2020) and Marian (Junczys-Dowmunt et al. 2018; the OPUS-MT models):
post-norm LayerNorm encoder-decoders with one token table shared by both stacks and the tied
head.

BART: learned positions read from row p + 2 (``embedding.position_offset``), a LayerNorm on the
embeddings of each stack (``layernorm_embedding``: ``embedding.norm``), GELU. Marian: fixed
sinusoids with the sines in the first half of the channels and the cosines in the second
(``embedding.sinusoid_layout: split``), token embeddings scaled by sqrt(d_model), SiLU.

mBART (Liu et al. 2020) is BART with pre-norm layers and a final LayerNorm after each stack
(``model.{encoder,decoder}.layer_norm``); Pegasus (Zhang et al. 2020) is Marian's sinusoids
with the same pre-norm layers and final norms, and no embedding norm.

All store a ``final_logits_bias`` buffer (zeros unless fine-tuned with one: refused then) and
Marian stores its sinusoid tables as frozen parameters; neither is a tfgraph parameter, so the
name map checks them on import and rebuilds them on export.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tfgraph.hf.common import linear_rows, norm_rows
from tfgraph.hf.config import HFConfig, SpecDraft, activation, put_attention_dropout
from tfgraph.hf.export_common import plain_activation
from tfgraph.hf.names import Rule, Tensor, all_zero, from_numpy_like, zeros_like_lib
from tfgraph.spec.schema import Spec

OFFSET = 2  # BartLearnedPositionalEmbedding.offset


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    marian = cfg.model_type == "marian"
    sinusoids = cfg.model_type in ("marian", "pegasus")
    pre_norm = cfg.model_type in ("mbart", "pegasus")
    for first, second in (("encoder_attention_heads", "decoder_attention_heads"),
                          ("encoder_ffn_dim", "decoder_ffn_dim")):
        if cfg.int(first) != cfg.int(second):
            cfg.refuse(second, f"differs from {first} ({cfg.int(first)}); tfgraph's stacks "
                       "share attention and feed-forward sizes")
    draft.put("arch", "encoder-decoder")
    draft.put("d_model", cfg.int("d_model"), "d_model")
    enc, dec = cfg.int("encoder_layers"), cfg.int("decoder_layers")
    draft.put("layers", enc if enc == dec else {"encoder": enc, "decoder": dec}, "decoder_layers")
    vocab = cfg.int("vocab_size")
    target = cfg.int("decoder_vocab_size", vocab) if marian else vocab
    shared = cfg.bool("share_encoder_decoder_embeddings", True) if marian else True
    if shared and target != vocab:
        cfg.refuse("decoder_vocab_size", "differs from vocab_size with shared embeddings")
    draft.put("vocab", vocab if shared else {"source": vocab, "target": target}, "vocab_size")
    draft.put("max_len", cfg.int("max_position_embeddings"), "max_position_embeddings")
    if sinusoids:
        draft.put("embedding.positions", "sinusoidal")
        draft.put("embedding.sinusoid_layout", "split", "model_type")
    else:
        draft.put("embedding.positions", "learned")
        draft.put("embedding.position_offset", OFFSET, "model_type")
        draft.put("embedding.norm", True, "model_type")
    draft.put("embedding.scale", cfg.bool("scale_embedding", False), "scale_embedding")
    tie = cfg.bool("tie_word_embeddings", True)
    if not tie and not marian:
        # BART, mBART, Pegasus (transformers 5): tie_word_embeddings also ties the encoder's
        # and decoder's embed_tokens to model.shared (BartModel._tied_weights_keys); false
        # leaves four separate tables, one (model.shared) read by no forward pass, which a
        # tfgraph spec (one shared table, or a source and a target one) has no place for
        cfg.refuse("tie_word_embeddings", f"an untied {cfg.model_type} keeps four token "
                   "tables (model.shared, both stacks' embed_tokens, lm_head); tfgraph's "
                   "encoder-decoder has at most a source, a target and an output one")
    draft.put("embedding.tie_output", tie, "tie_word_embeddings")
    draft.put("embedding.share", shared, "share_encoder_decoder_embeddings")
    draft.put("attention.heads", cfg.int("encoder_attention_heads"), "encoder_attention_heads")
    draft.put("ffn.hidden", cfg.int("encoder_ffn_dim"), "encoder_ffn_dim")
    act = activation(cfg, "activation_function", gated=False, default="gelu")
    draft.put("ffn.activation", act, "activation_function")
    draft.put("norm.position", "pre" if pre_norm else "post", "model_type")
    draft.put("norm.final", pre_norm, "model_type")
    draft.put("dropout", cfg.float("dropout", 0.1), "dropout")
    # dropout on the attention weights, self- and cross-attention alike (modeling_bart,
    # modeling_marian, modeling_mbart, modeling_pegasus: the attention interface's dropout)
    put_attention_dropout(draft, cfg, "attention_dropout", 0.0)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads (BART's positions, offset and
    embedding norm and Marian's sinusoids are fixed by the model type). Marian pads with the
    last id of its vocabulary (58100 of 58101), MarianConfig's default kept in range here."""
    enc, dec = spec.layer_count("encoder"), spec.layer_count("decoder")
    heads, hidden = spec.attention.heads, spec.ffn.hidden
    out: dict[str, Any] = {
        "d_model": spec.d_model, "encoder_layers": enc, "decoder_layers": dec,
        "encoder_attention_heads": heads, "decoder_attention_heads": heads,
        "encoder_ffn_dim": hidden, "decoder_ffn_dim": hidden,
        "vocab_size": spec.vocab_size("source"), "max_position_embeddings": spec.max_len,
        "scale_embedding": spec.embedding.scale,
        "tie_word_embeddings": spec.embedding.tie_output,
        "activation_function": plain_activation(spec),
        "dropout": spec.dropout, "attention_dropout": spec.attention.dropout,
        "activation_dropout": 0.0,
    }
    if model_type in ("mbart", "pegasus") and spec.norm.position != "pre":
        return None  # their layers are pre-norm
    if model_type == "marian":
        target = spec.vocab_size("target")
        out["decoder_vocab_size"] = target
        out["share_encoder_decoder_embeddings"] = bool(spec.embedding.share)
        last = min(spec.vocab_size("source"), target) - 1  # a row of both tables
        out["pad_token_id"] = out["decoder_start_token_id"] = last
    return out


def marian_sinusoids(rows: int, d: int) -> np.ndarray:
    """MarianSinusoidalPositionalEmbedding's table: sines in the first ceil(d/2) channels,
    cosines after them, PE[p, j] from p / 10000^(2 (j // 2) / d)."""
    j = np.arange(d)
    angle = np.arange(rows)[:, None] / np.power(10000.0, 2 * (j // 2) / d)[None, :]
    half = math.ceil(d / 2)
    out = np.empty((rows, d), dtype=np.float64)
    out[:, :half] = np.sin(angle[:, 0::2])
    out[:, half:] = np.cos(angle[:, 1::2])
    return out.astype(np.float32)


def _sinusoid_rule(name: str, rows: int, d: int, saved: bool) -> Rule:
    table = marian_sinusoids(rows, d)

    def check(tensor: Tensor) -> str | None:
        values = np.asarray(tensor.detach().float().cpu().numpy() if hasattr(tensor, "detach")
                            else tensor, dtype=np.float32)
        if values.shape != table.shape or not np.allclose(values, table, atol=1e-5):
            return "is not the sinusoid table tfgraph computes (sinusoid_layout split)"
        return None

    make: Callable[[Tensor], Tensor] = lambda example: from_numpy_like(example, table)
    # Marian's save_pretrained leaves the tables out (_keys_to_ignore_on_save): memory only;
    # Pegasus's writes them.
    return Rule(name, (), "generated", check=check, make=make,
                layout="both" if saved else "memory")


def _layer_rows(spec: Spec, stack: str) -> list[Rule]:
    src, dst = f"model.{stack}.layers.{{i}}", f"{stack}.layers.{{i}}"
    rows: list[Rule] = []
    subs = [("self_attn", "self_attn")] + ([("encoder_attn", "cross_attn")]
                                           if stack == "decoder" else [])
    for theirs, ours in subs:
        for r, proj in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
            rows += linear_rows(f"{src}.{theirs}.{proj}", f"{dst}.{ours}.{r}", True)
        rows += norm_rows(f"{src}.{theirs}_layer_norm", f"{dst}.{ours}_norm", spec)
    rows += linear_rows(f"{src}.fc1", f"{dst}.ffn.up", True)
    rows += linear_rows(f"{src}.fc2", f"{dst}.ffn.down", True)
    rows += norm_rows(f"{src}.final_layer_norm", f"{dst}.ffn_norm", spec)
    return rows


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    emb, rows = spec.embedding, []
    target = spec.vocab_size("target")
    if emb.share:
        rows.append(Rule("model.shared.weight", ("embed.tokens.weight",)))
        for stack in ("encoder", "decoder"):
            rows.append(Rule(f"model.{stack}.embed_tokens.weight", ("embed.tokens.weight",),
                             "alias"))
        table = "embed.tokens.weight"
    else:
        rows.append(Rule("model.encoder.embed_tokens.weight", ("embed.source_tokens.weight",)))
        rows.append(Rule("model.decoder.embed_tokens.weight", ("embed.target_tokens.weight",)))
        table = "embed.target_tokens.weight"
    if emb.tie_output:
        rows.append(Rule("lm_head.weight", (table,), "alias"))
    else:
        rows.append(Rule("lm_head.weight", ("head.weight",)))
    rows.append(Rule("final_logits_bias", (), "generated", check=all_zero,
                     make=lambda example: zeros_like_lib(example, (1, target))))
    assert spec.max_len is not None
    for stack in ("encoder", "decoder"):
        name = f"model.{stack}.embed_positions.weight"
        if emb.positions == "learned":
            rows.append(Rule(name, (f"{stack}.positions.weight",)))
        else:
            rows.append(_sinusoid_rule(name, spec.max_len, spec.d_model,
                                       saved=cfg.model_type == "pegasus"))
        if emb.norm:
            rows += norm_rows(f"model.{stack}.layernorm_embedding", f"{stack}.embed_norm", spec)
        if spec.norm.final:  # mBART, Pegasus: a LayerNorm after the last layer
            rows += norm_rows(f"model.{stack}.layer_norm", f"{stack}.norm", spec)
        rows += _layer_rows(spec, stack)
    return rows
