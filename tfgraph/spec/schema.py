"""The spec language: a Transformer variant as validated pydantic models (README.md, "Spec reference").

Every field has one docstring; choices are ``Literal``; derived defaults (head_dim, kv_heads,
ffn.hidden, norm.final, embedding.share) are resolved in one place, ``Spec._derive``, so a
validated ``Spec`` is complete and dumping it to YAML and loading it back gives the same spec.
Defaults follow the original Transformer (Vaswani et al. 2017): post-norm, ReLU, sinusoidal
positions, scaled and tied embeddings.

Cross-field rules raise ``ValueError("field.path: what to change")``: pydantic reports them at
the model's location, so the message starts with the field it is about and the YAML loader uses
that prefix to point at the right line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import (BaseModel, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)

from tfgraph.graph.bounds import (  # noqa: F401  (README "Limits"; re-exported)
    MAX_D_MODEL, MAX_EXPERTS, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_LEN, MAX_VOCAB)
from tfgraph.spec.derived import check_derived
from tfgraph.spec.numbers import (EPS, THETA, Positive, Within, finite_float,
                                  optional_finite_float)
from tfgraph.spec.rope import RopeScaling, RotaryLayout, derive_rotary, rotary_dim

Arch = Literal["encoder-only", "decoder-only", "encoder-decoder"]
Positions = Literal["sinusoidal", "learned", "rope", "relative", "alibi", "none"]
"""The position kinds (``embedding.positions``); each has its record in ``POSITION_KINDS``."""


@dataclass(frozen=True)
class PositionKind:
    """What a kind of positions means for sequence lengths (``tfgraph.graph.lengths``):
    ``learned``, a table with no row past ``max_len`` (a hard limit); otherwise
    ``extrapolates``, how the model runs past ``max_len``, ending the warning line."""

    learned: bool = False
    extrapolates: str = ""
    position_ids: bool = True
    """A KV-cache graph takes ``position_ids`` for them (not T5's buckets nor ALiBi's bias,
    which read distances or the attention mask's key positions alone; nor no positions)."""


POSITION_KINDS: dict[str, PositionKind] = {
    "sinusoidal": PositionKind(extrapolates="its sinusoidal positions extrapolate beyond the "
                                            "length it was built for"),
    "learned": PositionKind(learned=True),
    "rope": PositionKind(extrapolates="its rotary positions extrapolate beyond the length it "
                                      "was built for"),
    "relative": PositionKind(extrapolates="its relative-position buckets extrapolate beyond "
                                          "the length it was built for", position_ids=False),
    "alibi": PositionKind(extrapolates="its ALiBi biases extrapolate beyond the length it was "
                                       "built for", position_ids=False),
    "none": PositionKind(extrapolates="it has no position encoding but runs beyond the length "
                                      "it was built for", position_ids=False),
}
"""One record per position kind: a new kind is its ``Positions`` name and its entry here
(checked when this module is imported)."""
if set(POSITION_KINDS) != set(get_args(Positions)):
    raise ImportError(f"tfgraph.spec.schema: Positions {get_args(Positions)} and POSITION_KINDS "
                      f"{tuple(POSITION_KINDS)} disagree")
Activation = Literal["relu", "relu2", "gelu", "gelu_tanh", "silu", "swiglu", "geglu",
                     "geglu_tanh"]
NormPosition = Literal["post", "pre", "branch", "sandwich"]
NormKind = Literal["layernorm", "rmsnorm", "scalenorm"]
Residual = Literal["sequential", "parallel"]
Normalize = Literal["softmax", "hardmax"]
QKNorm = Literal["none", "head", "full"]
WindowKind = Literal["local", "global"]
Router = Literal["softmax_topk", "softmax_topk_renorm", "topk_softmax", "sparsemixer",
                 "sigmoid_topk", "sigmoid_topk_renorm"]
Output = Literal["logits", "probs"]
DType = Literal["float32", "float16", "bfloat16"]

GATED_ACTIVATIONS = ("swiglu", "geglu", "geglu_tanh")
# The activation on the gate of each gated feed-forward.
GATED_INNER = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}
SinusoidLayout = Literal["interleaved", "split"]


# YAML's true/false only: pydantic's lax bool would take 1, "yes" or "off" as well.
Flag = Annotated[bool, Field(strict=True)]


def _size(upper: int) -> Any:
    """A strict positive integer with an upper bound (``true`` or ``"8"`` is not a size)."""
    return Annotated[int, Field(strict=True, ge=1, le=upper)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)


class StackLayers(_Strict):
    """Layer counts per stack, for encoder-decoder models."""

    encoder: _size(MAX_LAYERS)  # type: ignore[valid-type]
    """Number of encoder layers."""
    decoder: _size(MAX_LAYERS)  # type: ignore[valid-type]
    """Number of decoder layers."""


class Vocabularies(_Strict):
    """Separate source and target vocabularies, for encoder-decoder models."""

    source: _size(MAX_VOCAB)  # type: ignore[valid-type]
    """Size of the source (encoder input) vocabulary."""
    target: _size(MAX_VOCAB)  # type: ignore[valid-type]
    """Size of the target (decoder input and output) vocabulary."""


class Embedding(_Strict):
    """Token and position embeddings and the output projection that may share their table."""

    positions: Positions = "sinusoidal"
    """How positions enter: added sinusoids (Vaswani et al. 2017 §3.5), an added learned table,
    rotary embeddings applied to q and k (GPT-NeoX rotate-half convention), relative: T5's
    learned per-head bias on the self-attention scores by bucketed key - query distance
    (Raffel et al. 2020 §2.1; bidirectional buckets in the encoder, causal in the decoder,
    one table per stack shared by its layers, ``{stack}.relative_bias.weight``), alibi: a fixed
    per-head linear bias slope_h * (key - query position) on the self-attention scores (Press
    et al. 2022; BLOOM, MPT, Falcon-RW: decoder-only, no parameters; alibi_scaled and
    alibi_bfloat16 below), or none."""
    relative_buckets: _size(1 << 16) | None = None  # type: ignore[valid-type]
    """positions relative: distance buckets (T5: 32; half per direction in the encoder).
    Default: 32."""
    relative_max_distance: _size(MAX_LEN) | None = None  # type: ignore[valid-type]
    """positions relative: distances from this on share the last bucket (T5: 128). Must exceed
    the exact buckets: relative_buckets // 2 with causal self-attention (decoder-only,
    encoder-decoder), relative_buckets // 4 in encoder-only models. Default: 128."""
    alibi_scaled: Flag = False
    """positions alibi: the bias is divided by sqrt(head_dim) with the scores, softmax((q.k +
    bias) / sqrt(head_dim)) (Falcon-RW: TII's ``(scores + alibi) * inv_norm_factor``, and
    transformers' FalconModel folding ``alibi / sqrt(head_dim)`` into the SDPA mask); BLOOM and
    MPT add it unscaled."""
    alibi_bfloat16: Flag = False
    """positions alibi: the bias is computed in bfloat16, as Falcon's build_alibi_tensor does:
    the slopes rounded to bfloat16, slope * position rounded again, then cast back. A rounded
    bias no longer changes by a constant per query row when every position shifts, so
    positions count each row's real tokens from 0 (the attention mask's cumsum - 1, as
    transformers does): a KV-cache graph's bias is per row, (B, heads, S, T)."""
    scale: Flag = True
    """Multiply token embeddings by sqrt(d_model) (Vaswani et al. 2017 §3.4)."""
    multiplier: Positive | None = None
    """Multiply token embeddings by this constant (Granite's embedding_multiplier, 12), after
    the sqrt(d_model) of ``scale`` when both are set. Default: none."""
    tie_output: Flag = True
    """The output projection reuses the (target) token table instead of its own weight."""
    share: Flag | None = None
    """Encoder-decoder only: one token table for both stacks (needs one vocabulary).
    Default: true when there is one vocabulary, false otherwise."""
    output_bias: Flag = False
    """Add a bias to the output projection (``head.bias``)."""
    rope_theta: Annotated[float, THETA] = 10000.0
    """Base of the rotary frequencies theta^(-2i/d) (positions: rope)."""
    rotary_fraction: Annotated[float, Within(gt=0.0, le=1.0,
                                             hint="Pythia: 0.25, Phi-2: 0.4")] = 1.0
    """Rotary only: the share of each head's channels that rotate, the first
    int(head_dim * fraction) (even); the rest pass through (Pythia 0.25, Phi-2 0.4, GPT-J
    64 of 256)."""
    rotary_layout: RotaryLayout = "half"
    """Rotary only: half pairs channel i with i + d/2 (GPT-NeoX, Llama); interleaved pairs
    2i with 2i + 1 (GPT-J, the original RoFormer)."""
    rope_scaling: RopeScaling | None = None
    """Rotary only: frequencies rescaled for a longer context (linear, llama3, yarn;
    Llama 3.1, Qwen2.5, DeepSeek-V3). Default: none."""
    position_offset: Annotated[int, Field(strict=True, ge=0, le=MAX_LEN)] = 0
    """Learned positions only: position p reads row p + offset of a table of max_len + offset
    rows (OPT and BART: 2, the rows their padding scheme reserved; the checkpoint keeps them,
    so parameter counts follow it)."""
    position_pad_id: Annotated[int, Field(strict=True, ge=0, lt=MAX_VOCAB)] | None = None
    """Learned positions of an encoder-only model only: the positions are counted from the
    input ids, skipping this token id (the padding id), as fairseq's make_positions and
    Hugging Face RoBERTa's create_position_ids_from_input_ids do: a token that is not padding
    reads row offset + (the number of non-padding tokens before it), a padding token reads row
    offset - 1 (RoBERTa: the padding_idx row, offset = padding_idx + 1), so left padding does
    not shift the positions of the real tokens. Needs position_offset >= 1. Default: none
    (token t reads row offset + t)."""
    pad_no_grad: Flag = False
    """The token lookup passes no gradient to the ``tokens.pad`` row of the token tables (every
    table of an encoder-decoder), as torch's ``nn.Embedding(padding_idx=pad)`` does: the
    Hugging Face families that build their embedding so (Llama, Mistral, Qwen, Gemma, BERT,
    RoBERTa, BART, Marian, Pegasus, OPT, ...; not GPT-2 or T5), where fine-tuning never moves
    that row through the inputs (Marian and Pegasus start every target with it). A tied
    output projection still sends the row its gradient. The forward pass is unchanged.
    Needs ``tokens.pad``, inside every token table. ``tfgraph import`` sets it for those
    families when config.json's pad_token_id lies inside the vocabulary."""
    sinusoid_layout: SinusoidLayout = "interleaved"
    """Sinusoidal positions only: interleaved PE[p, 2i] = sin, PE[p, 2i+1] = cos (Vaswani et
    al. 2017), or split: the sines in the first ceil(d/2) channels, the cosines after them
    (fairseq, Marian)."""
    token_types: Annotated[int, Field(strict=True, ge=0, le=MAX_VOCAB)] = 0
    """Rows of a segment table added to the token embeddings (BERT: 2); 0 for none. The model
    then takes a second input, token_type_ids, all zeros when not given. Encoder-only
    models only."""
    norm: Flag = False
    """A norm (norm.kind, norm.eps) on the summed embeddings, before the first layer (BERT's
    embeddings.LayerNorm, BART's layernorm_embedding, BLOOM's word_embeddings_layernorm);
    its gains are ``{stack}.embed_norm``."""

    local_rope_theta: Annotated[float, THETA] | None = None
    """Rotary base of the local (sliding-window) layers when it differs from rope_theta
    (Gemma 3: 10000 locally, 1000000 globally). Default: rope_theta."""
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    """Dropout probability after the embeddings (training only), where it differs from the
    spec's ``dropout`` after each sublayer: GPT-2's and Phi's embd_pdrop beside resid_pdrop;
    0 for Seed-OSS's residual_dropout and MPT's attn_pdrop, which drop the sublayers' outputs
    only. Default (and when equal to it): ``dropout``."""
    rope_global: Flag = True
    """Rotary only: false leaves the global (full-attention) layers without positions (NoPE):
    only the sliding-window layers of attention.window_pattern rotate q and k (Cohere's
    Command R7B, Cohere2Attention). Without a window every layer is global."""

    _finite_dropout = field_validator("dropout", mode="before")(optional_finite_float)


class LatentAttention(_Strict):
    """Multi-head latent attention (MLA; DeepSeek-V2, arXiv:2405.04434 §2.1; DeepSeek-V3).

    Keys and values come from one low-rank latent c = norm(x W_kv_a)[:kv_rank] (the
    ``kv_a_norm``), expanded per head by ``kv_b`` into head_dim - rope_dim key channels and
    v_head_dim value channels; the queries from x (``q``) or through their own low-rank latent
    (``q_a``, ``q_a_norm``, ``q_b``). Each head's last rope_dim query channels and one rotary
    key of rope_dim channels (the rest of ``kv_a``'s output, shared by every head: the
    decoupled rotary key) carry the rotary positions; the other channels carry none. The KV
    cache holds the latent and the rotary key, kv_rank + rope_dim values per token and layer
    (README, "KV cache")."""

    kv_rank: _size(MAX_D_MODEL)  # type: ignore[valid-type]
    """Width of the key/value latent (DeepSeek-V3 kv_lora_rank: 512)."""
    q_rank: _size(MAX_D_MODEL) | None = None  # type: ignore[valid-type]
    """Width of the query latent (DeepSeek-V3 q_lora_rank: 1536). Default: none, the queries
    are one projection of x (DeepSeek-V2-Lite)."""
    rope_dim: _size(MAX_D_MODEL)  # type: ignore[valid-type]
    """Rotary channels of each query head and of the shared rotary key (qk_rope_head_dim: 64);
    attention.head_dim is qk_nope_head_dim + rope_dim (192)."""
    v_head_dim: _size(MAX_D_MODEL) | None = None  # type: ignore[valid-type]
    """Width of one value head (DeepSeek-V3: 128). Default: head_dim - rope_dim."""
    norm_eps: Annotated[float, EPS] | None = None
    """The eps of q_a_norm and kv_a_norm (transformers' DeepSeek-V2 / V3 build both with the
    RMSNorm default 1e-6 whatever rms_norm_eps says). Default: norm.eps."""


class Attention(_Strict):
    """Multi-head attention: heads, grouped key/value heads, projections, normalisation."""

    heads: _size(MAX_HEADS)  # type: ignore[valid-type]
    """Number of query heads."""
    kv_heads: _size(MAX_HEADS) | None = None  # type: ignore[valid-type]
    """Number of key/value heads; heads % kv_heads == 0 (GQA; 1 is multi-query). Default: heads."""
    head_dim: _size(MAX_D_MODEL) | None = None  # type: ignore[valid-type]
    """Width of one head. Default: d_model / heads (then d_model % heads must be 0)."""
    bias: Flag = True
    """Biases on the q, k, v and o projections (the default of the two fields below)."""
    qkv_bias: Flag | None = None
    """Biases on the q, k and v projections only (Qwen2 and Qwen2.5: true with out_bias
    false). Default: bias."""
    out_bias: Flag | None = None
    """Bias on the output projection o. Default: bias."""
    qk_norm: QKNorm = "none"
    """A norm (of norm.kind) on q and k before rotary positions (Wortsman et al. 2023): head
    normalises each head's head_dim channels with one gain of width head_dim shared by the
    heads (Qwen3, Gemma 3); full normalises the whole projection (OLMo 2). Its gains are
    self_attn.q_norm / k_norm."""
    scale: Positive | None = None
    """Multiplier of the scores q k^T. Default: 1 / sqrt(head_dim) (Vaswani et al. 2017 §3.2.1);
    T5 uses 1, Gemma 2 query_pre_attn_scalar^-0.5."""
    softcap: Positive | None = None
    """Soft-cap the scores as softcap * tanh(scores / softcap) before the mask (Gemma 2: 50)."""
    window: _size(MAX_LEN) | None = None  # type: ignore[valid-type]
    """Sliding-window self-attention. In a decoder (causal) query i reads keys
    i - window < j <= i, so the KV cache of a local layer holds at most window positions
    (Mistral v0.1 4096, Gemma 2 4096). In an encoder (bidirectional) query i reads keys
    |i - j| < window, window - 1 on each side (ModernBERT: local_attention / 2 + 1 = 65).
    Decoder-only or encoder-only."""
    window_pattern: Annotated[list[WindowKind], Field(min_length=1, max_length=MAX_LAYERS)] \
        | None = None
    """Which layers use the window, as a pattern repeated over the layers from the first:
    [local, global] alternates (Gemma 2), five local then one global is Gemma 3. Default: every
    layer local. Needs window."""
    clip_qkv: Positive | None = None
    """Clamp the q, k and v projections (after their biases) to [-clip_qkv, clip_qkv] before
    q/k norms and rotary positions (MPT's attn_config.clip_qkv, OLMo 1's clip_qkv: 8).
    Default: none."""
    latent: LatentAttention | None = None
    """Multi-head latent attention (DeepSeek-V2 and V3) instead of q, k and v projections
    of x; needs rotary positions (embedding.rotary_fraction 1: the rotary part is
    latent.rope_dim), kv_heads = heads, no q/k/v biases, no qk_norm and no window; decoder-only.
    Default: none."""
    normalize: Normalize = "softmax"
    """softmax, or hardmax: the one-hot of the arg-max ("hard attention": each query reads only its highest-scoring key)."""
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """Dropout probability on the attention weights (after the softmax, before they weight
    v), training only: the identity at inference, as the spec's ``dropout``. Megatron-LM's
    GPT runs used 0.1 (its ``--attention-dropout`` default; Korthikanti et al. 2022 count
    its mask and output in the 5as/h term). Default 0: none."""

    _finite_dropout = field_validator("dropout", mode="before")(finite_float)

    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, value: int | None, info: ValidationInfo) -> int | None:
        # Checked here, on the field, not only with the spec's cross-field rules (which run
        # once every field is valid): it needs heads alone, so validate --all-errors shows it
        # beside "d_model is not divisible by heads" in the same run.
        heads = info.data.get("heads")
        if value is not None and isinstance(heads, int) and heads % value:
            raise ValueError(f"heads {heads} is not a multiple of kv_heads {value}; kv_heads "
                             "must divide heads")
        return value


class FeedForward(_Strict):
    """The position-wise feed-forward sublayer."""

    hidden: _size(MAX_HIDDEN) | None = None  # type: ignore[valid-type]
    """Inner width d_ff. Default: 4 * d_model."""
    activation: Activation = "relu"
    """relu; gelu (exact erf); gelu_tanh (GPT-2's tanh approximation); silu; or the gated
    swiglu = down(silu(gate(x)) * up(x)), geglu = down(gelu(gate(x)) * up(x)) and
    geglu_tanh with the tanh GELU (Gemma; T5 v1.1 and Flan-T5's gated "gelu_new")."""
    bias: Flag = True
    """Biases on the up, gate and down projections."""
    experts: _size(MAX_EXPERTS) | None = None  # type: ignore[valid-type]
    """Routed experts E of a mixture-of-experts feed-forward (Shazeer et al. 2017; Mixtral 8,
    Qwen2-MoE 60, OLMoE 64, DeepSeek-V3 256). None: one dense feed-forward."""
    top_k: _size(MAX_EXPERTS) | None = None  # type: ignore[valid-type]
    """Experts each token is routed to, k <= experts (Mixtral 2, DeepSeek-V3 8). Required
    with experts."""
    router: Router | None = None
    """How router logits become the k routing weights: softmax_topk (softmax over all
    experts, keep the k largest; Qwen2-MoE, OLMoE: norm_topk_prob false), softmax_topk_renorm
    (the same, divided by their sum; Mixtral in transformers, Qwen3-MoE), topk_softmax (the
    k largest logits, softmax over them; Mixtral's reference code; equal to
    softmax_topk_renorm in exact arithmetic, fewer FLOPs), sparsemixer (Phi-3.5-MoE, Liu et
    al. 2024, at inference: top_k 2; the largest logit's expert weighted by a softmax over
    the experts within router_eps of it, then the largest of the others weighted by a
    softmax over the others within router_eps of that one; no renormalisation),
    sigmoid_topk (per-expert sigmoid scores; the k experts are chosen by score + a per-expert
    correction bias, ``ffn.router.correction_bias``, and weighted by their score alone: DeepSeek-V3's
    auxiliary-loss-free balancing, arXiv:2412.19437 §2.1.2) and sigmoid_topk_renorm (the same,
    divided by their sum + 1e-20; DeepSeek-V3's norm_topk_prob). Default with experts:
    softmax_topk_renorm."""
    router_eps: Annotated[float, Within(ge=0.0, lt=1.0, hint="Phi-3.5-MoE: 0.01")] \
        | None = None
    """sparsemixer only: expert e stays in a softmax while (m - s_e) / max(|s_e|, m) <= 2 *
    router_eps, m the logit of the expert being chosen, s_e expert e's (Phi-3.5-MoE's
    router_jitter_noise, 0.01). Default with sparsemixer: 0.01."""
    router_groups: _size(MAX_EXPERTS) | None = None  # type: ignore[valid-type]
    """Group-limited routing (DeepSeek n_group): the experts are this many equal groups,
    each token may choose only from the router_top_groups best groups. A group's score is its
    largest expert score under the softmax routers (DeepSeek-V2 group_limited_greedy) and the
    sum of its two largest bias-corrected scores under the sigmoid ones (DeepSeek-V3).
    Default with experts: 1 (no groups)."""
    router_top_groups: _size(MAX_EXPERTS) | None = None  # type: ignore[valid-type]
    """Groups a token may choose its experts from (DeepSeek topk_group: 4 of 8 in V3).
    Default: router_groups."""
    router_scale: Positive | None = None
    """Multiply the routing weights by this (DeepSeek routed_scaling_factor: 2.5 in V3).
    Default with experts: 1."""
    expert_hidden: _size(MAX_HIDDEN) | None = None  # type: ignore[valid-type]
    """Inner width of each routed expert (Qwen2-MoE moe_intermediate_size, DeepSeek-V3 2048).
    Default with experts: hidden."""
    shared_experts: Annotated[int, Field(strict=True, ge=0, le=MAX_EXPERTS)] | None = None
    """Experts every token always goes through, each expert_hidden wide, run as one
    feed-forward of width shared_hidden (DeepSeek-MoE, DeepSeek-V3: 1; Qwen2-MoE: 1).
    Default with experts: 0."""
    shared_hidden: _size(MAX_HIDDEN) | None = None  # type: ignore[valid-type]
    """Width of the shared-expert feed-forward (Qwen2-MoE shared_expert_intermediate_size).
    Default: shared_experts * expert_hidden (DeepSeek)."""
    shared_gate: Flag | None = None
    """Scale the shared experts' output by sigmoid(x w), w a (1, d_model) linear
    (Qwen2-MoE's shared_expert_gate). Default with experts: false."""
    dense_layers: Annotated[int, Field(strict=True, ge=0, le=MAX_LAYERS)] | None = None
    """The first N layers keep a dense feed-forward of width hidden (DeepSeek
    first_k_dense_replace: 3 in V3). One stack only. Default with experts: 0."""



class Block(_Strict):
    """How the sublayers of a layer are combined."""

    residual: Residual = "sequential"
    """sequential: each sublayer reads the previous one's sum (x = x + attn(n1(x)); then
    x = x + ffn(n2(x))); parallel: both read the layer input and their outputs are summed,
    x = x + attn(n1(x)) + ffn(n2(x)) (GPT-J, GPT-NeoX/Pythia; Wang & Komatsuzaki 2021).
    Parallel needs one stack (no cross-attention) and a norm position other than post."""
    shared_norm: Flag = False
    """Parallel only: one pre-norm read by both sublayers, x = x + attn(n(x)) + ffn(n(x))
    (GPT-J, Falcon, Phi-2); its gains are ``{stack}.layers.{i}.norm``. Needs norm.position
    pre."""
    residual_scale: Positive | None = None
    """Multiply each sublayer's output by this before it is added to the residual stream,
    x = x + s * f(x) (Granite's residual_multiplier, 0.22). Default: none (s = 1)."""



class Norm(_Strict):
    """Where and how sublayers are normalised."""

    position: NormPosition = "post"
    """post: norm(x + f(x)) (Vaswani); pre: x + f(norm(x)) (GPT-2); branch: x + norm(f(x))
    (OLMo 2); sandwich: x + norm(f(norm(x))) (Gemma 2)."""
    kind: NormKind = "layernorm"
    """layernorm (gain and bias); rmsnorm (gain, no bias); scalenorm (one scalar g: g*x/||x||_2)."""
    eps: Annotated[float, EPS] = 1e-5
    """Added inside the normalising square root."""
    final: Flag | None = None
    """A norm after the last layer of each stack. Default: true for pre and sandwich."""
    unit_offset: Flag = False
    """Gains are stored as offsets from 1: the norm multiplies by (1 + w) and w starts at 0
    (Gemma, Gemma 2 and 3 RMSNorm; also the qk-norm gains)."""
    bias: Flag = True
    """layernorm only: false drops the bias, gain alone (Cohere, MPT)."""
    affine: Flag = True
    """layernorm only: false leaves every norm without parameters, neither gain nor bias
    ((x - mean) / sqrt(var + eps); OLMo 1's OlmoLayerNorm, PyTorch's elementwise_affine
    false); then bias is false too."""
    skip_first: Flag = False
    """pre only: the first layer's self-attention reads its input without a pre-norm, so
    layer 0 has no self_attn_norm (ModernBERT: the embedding norm comes right before it and
    its layer 0 attn_norm is an identity)."""



class Head(_Strict):
    """The output head: what maps the last hidden state to the vocabulary."""

    transform: Flag = False
    """BERT's masked-LM transform before the vocabulary projection: a d_model -> d_model
    linear with bias (``head.transform``), the feed-forward's activation (BERT's hidden_act
    serves both; a gated one's inner activation), then a norm of norm.kind
    (``head.transform_norm``)."""
    transform_bias: Flag = True
    """transform only: the head.transform linear has a bias (BERT, RoBERTa); ModernBERT's
    head.dense has none (classifier_bias false)."""
    scale: Positive | None = None
    """Multiply the last hidden state by this before the vocabulary projection (T5 with tied
    embeddings: d_model^-0.5). Default: no scaling."""
    softcap: Positive | None = None
    """Soft-cap the logits as softcap * tanh(logits / softcap) (Gemma 2: 30)."""



TokenId = Annotated[int, Field(strict=True, ge=0, lt=MAX_VOCAB)]


class Tokens(_Strict):
    """Special token ids the model was trained with: ``tfgraph generate`` ends a row at ``eos``
    and starts an encoder-decoder's target at ``decoder_start`` (unless the model folder or
    the command line says otherwise), and ``build --to hf`` writes them to config.json and
    generation_config.json. They do not change the computation."""

    bos: TokenId | None = None
    """Beginning of sequence."""
    eos: TokenId | Annotated[list[TokenId], Field(min_length=1, max_length=64)] | None = None
    """End of sequence: one id or several (Llama 3's instruct models end at two)."""
    pad: TokenId | None = None
    """Padding."""
    decoder_start: TokenId | None = None
    """First target token of an encoder-decoder (T5: the pad id; BART: eos)."""

    def eos_ids(self) -> tuple[int, ...]:
        """``eos`` as a tuple (empty when there is none)."""
        if self.eos is None:
            return ()
        return tuple(self.eos) if isinstance(self.eos, list) else (self.eos,)


class Spec(_Strict):
    """A Transformer variant. Validated, with every derived default resolved."""

    name: Annotated[str, Field(strict=True, pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=128)]
    """Identifier used for output file names: lower case letters, digits, '.', '_' and '-'."""
    description: Annotated[str, Field(strict=True, max_length=4096)] = ""
    """Free text, e.g. the paper the numbers come from."""
    arch: Arch
    """encoder-only (BERT), decoder-only (GPT) or encoder-decoder (the original Transformer)."""
    d_model: _size(MAX_D_MODEL)  # type: ignore[valid-type]
    """Width of the residual stream."""
    layers: _size(MAX_LAYERS) | StackLayers  # type: ignore[valid-type]
    """Layers per stack: one int for every stack, or {encoder: N, decoder: M} (encoder-decoder)."""
    vocab: _size(MAX_VOCAB) | Vocabularies  # type: ignore[valid-type]
    """Vocabulary size: one int, or {source: N, target: M} (encoder-decoder)."""
    max_len: _size(MAX_LEN) | None = None  # type: ignore[valid-type]
    """Longest sequence. Required when positions are learned."""
    embedding: Embedding = Field(default_factory=Embedding)
    """Token and position embeddings and output tying."""
    attention: Attention
    """Multi-head attention."""
    ffn: FeedForward = Field(default_factory=FeedForward)
    """Feed-forward sublayer."""
    norm: Norm = Field(default_factory=Norm)
    """Normalisation placement and kind."""
    block: Block = Field(default_factory=Block)
    """How a layer combines its sublayers (sequential or parallel residual)."""
    head: Head = Field(default_factory=Head)
    """The output head (before and around the vocabulary projection)."""
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    """Dropout probability after embeddings and after each sublayer (training only);
    ``embedding.dropout`` sets the one after the embeddings apart."""
    output: Output = "logits"
    """logits, or probs (softmax over the vocabulary)."""
    dtype: DType = "float32"
    """Parameter and activation dtype."""
    tokens: Tokens | None = None
    """Special token ids (bos, eos, pad, decoder_start), for generation and Hugging Face
    folders; ``tfgraph import`` copies them from config.json."""

    _finite = field_validator("dropout", mode="before")(finite_float)

    @model_validator(mode="after")
    def _derive(self) -> Spec:
        """Check every cross-field rule and resolve the derived defaults, in one place."""
        # pydantic keeps sub-model instances passed in as they are: derive on copies, so a
        # shared Attention (or Norm, ...) never carries one spec's derived values into another.
        self.attention = att = self.attention.model_copy()
        self.embedding = emb = self.embedding.model_copy()
        self.ffn = self.ffn.model_copy()
        self.norm = self.norm.model_copy()
        self.head = self.head.model_copy()
        # --- layers and vocab forms against arch
        if isinstance(self.layers, StackLayers) and self.arch != "encoder-decoder":
            stack = "encoder" if self.arch == "encoder-only" else "decoder"
            raise ValueError(
                f"layers: {{encoder, decoder}} is only for encoder-decoder; {self.arch} has one "
                f"stack, write layers: {getattr(self.layers, stack)}"
            )
        if isinstance(self.vocab, Vocabularies) and self.arch != "encoder-decoder":
            raise ValueError(
                f"vocab: {{source, target}} is only for encoder-decoder; {self.arch} has one "
                "vocabulary, write vocab: N"
            )
        if not self.norm.bias and self.norm.kind != "layernorm":
            raise ValueError(f"norm.bias: false is for layernorm; {self.norm.kind} has no bias")
        if not self.norm.affine:
            if self.norm.kind != "layernorm":
                raise ValueError(f"norm.affine: false is for layernorm, not {self.norm.kind}")
            if self.norm.unit_offset:
                raise ValueError("norm.affine: false has no gain for unit_offset to offset; "
                                 "remove one of them")
            if self.norm.bias and "bias" in self.norm.model_fields_set:
                raise ValueError("norm.affine: false has no bias; remove norm.bias: true")
            self.norm.bias = False
        # --- token ids inside the vocabulary they index
        if self.tokens is not None:
            self._check_tokens(self.tokens)
        if emb.pad_no_grad:
            self._check_pad_row()
        # --- attention geometry
        if att.head_dim is None:
            if self.d_model % att.heads:
                raise ValueError(
                    f"attention.heads: d_model {self.d_model} is not divisible by heads "
                    f"{att.heads}; choose heads dividing d_model or set attention.head_dim"
                )
            att.head_dim = self.d_model // att.heads
            check_derived(att, "head_dim", "attention.head_dim", "d_model / attention.heads")
        if att.kv_heads is None:
            att.kv_heads = att.heads
        if att.qkv_bias is None:
            att.qkv_bias = att.bias
        if att.out_bias is None:
            att.out_bias = att.bias
        if att.heads % att.kv_heads:
            raise ValueError(
                f"attention.kv_heads: heads {att.heads} is not a multiple of kv_heads "
                f"{att.kv_heads}; kv_heads must divide heads"
            )
        if emb.positions == "rope" and emb.rotary_fraction == 1.0 and att.head_dim % 2:
            raise ValueError(
                f"attention.head_dim: rotary positions rotate pairs, so head_dim must be even "
                f"(got {att.head_dim})"
            )
        if att.window_pattern is not None and att.window is None:
            raise ValueError("attention.window_pattern: says which layers use the sliding "
                             "window; set attention.window too")
        if att.window is not None and self.arch == "encoder-decoder":
            raise ValueError("attention.window: sliding windows are implemented for the "
                             "self-attention of one-stack models (decoder-only: causal, "
                             "encoder-only: bidirectional)")
        if emb.local_rope_theta is not None and (att.window is None or emb.positions != "rope"):
            raise ValueError("embedding.local_rope_theta: the rotary base of sliding-window "
                             "layers needs positions: rope and attention.window")
        if not emb.rope_global and emb.positions != "rope":
            raise ValueError("embedding.rope_global: false leaves the global layers without "
                             "rotary positions; it needs positions: rope")
        if att.latent is not None:
            _derive_latent(self)
        derive_rotary(emb, att.head_dim if att.latent is None else att.latent.rope_dim,
                      self.max_len)
        # --- embeddings
        if emb.dropout == self.dropout:  # one rate: written once, so such specs dump as before
            emb.dropout = None
        if emb.positions == "relative":  # T5's defaults (Raffel et al. 2020)
            emb.relative_buckets = emb.relative_buckets or 32
            emb.relative_max_distance = emb.relative_max_distance or 128
            if emb.relative_buckets < 4:
                raise ValueError("embedding.relative_buckets: T5's buckets are halved per "
                                 "direction and again into exact and log-spaced ones; use >= 4")
            # T5Attention._relative_position_bucket spaces the buckets past the exact ones by
            # log(distance / exact) / log(max_distance / exact): at max_distance <= exact that
            # divisor is <= 0 and longer distances get negative or undefined buckets (an index
            # error in transformers too). A causal self-attention has buckets // 2 exact ones, a
            # bidirectional one (buckets // 2) // 2 per direction; encoder-decoder has both.
            exact = emb.relative_buckets // 2 if self.arch != "encoder-only" \
                else emb.relative_buckets // 4
            if emb.relative_max_distance <= exact:
                raise ValueError(f"embedding.relative_max_distance: must exceed the "
                                 f"{exact} exact buckets of relative_buckets "
                                 f"{emb.relative_buckets} (T5's log-spaced buckets span exact "
                                 f"to max_distance); got {emb.relative_max_distance}")
        elif emb.relative_buckets is not None or emb.relative_max_distance is not None:
            given = "relative_buckets" if emb.relative_buckets is not None \
                else "relative_max_distance"  # the field written, so the error points at it
            raise ValueError(f"embedding.{given}: relative_buckets and relative_max_distance "
                             "are for positions: relative")
        if (emb.alibi_scaled or emb.alibi_bfloat16) and emb.positions != "alibi":
            given = "alibi_scaled" if emb.alibi_scaled else "alibi_bfloat16"
            raise ValueError(f"embedding.{given}: alibi_scaled and alibi_bfloat16 are for "
                             "positions: alibi")
        if emb.positions == "alibi" and self.arch != "decoder-only":
            raise ValueError("embedding.positions: alibi biases causal self-attention "
                             "(BLOOM, MPT): decoder-only models only")
        if emb.positions == "learned" and self.max_len is None:
            raise ValueError("max_len: required when embedding.positions is learned")
        if emb.position_offset and emb.positions != "learned":
            raise ValueError("embedding.position_offset: offsets rows of a learned position "
                             "table; set positions: learned or remove it")
        if emb.position_pad_id is not None:
            if emb.positions != "learned" or self.arch != "encoder-only":
                raise ValueError("embedding.position_pad_id: positions counted over the "
                                 "non-padding input ids are for the learned positions of an "
                                 "encoder-only model (RoBERTa); remove it")
            if emb.position_offset < 1:
                raise ValueError("embedding.position_pad_id: padding tokens read row "
                                 "position_offset - 1; set position_offset >= 1 (RoBERTa: "
                                 "padding id + 1)")
            if emb.position_pad_id >= self.vocab_size("source"):
                raise ValueError(f"embedding.position_pad_id: {emb.position_pad_id} is not "
                                 f"below the vocabulary ({self.vocab_size('source')})")
        if emb.sinusoid_layout != "interleaved" and emb.positions != "sinusoidal":
            raise ValueError("embedding.sinusoid_layout: only sinusoidal positions have a "
                             "layout; set positions: sinusoidal or remove it")
        if emb.token_types and self.arch != "encoder-only":
            # the segment ids of BERT / RoBERTa (the only families with a segment table) tell
            # apart the sentences of an encoder's input; a decoder-only model's forward and
            # generate take input ids alone, so its token_type_ids could never be fed
            raise ValueError("embedding.token_types: segment embeddings are for encoder-only "
                             f"models (BERT, RoBERTa), not {self.arch}; remove it")
        one_vocab = not isinstance(self.vocab, Vocabularies)
        if self.arch != "encoder-decoder":
            if emb.share:
                raise ValueError(
                    "embedding.share: only encoder-decoder models have two stacks to share a "
                    "table between; remove it"
                )
            emb.share = False
        elif emb.share is None:
            emb.share = one_vocab
        elif emb.share and not one_vocab:
            raise ValueError(
                "embedding.share: sharing one table needs one vocabulary; write vocab: N or "
                "set share: false"
            )
        # --- feed-forward and norms
        if self.ffn.hidden is None:
            self.ffn.hidden = 4 * self.d_model
            check_derived(self.ffn, "hidden", "ffn.hidden", "4 * d_model")
        _derive_experts(self)
        if self.norm.final is None:
            self.norm.final = self.norm.position in ("pre", "sandwich")
        if self.block.residual == "parallel":
            if self.arch == "encoder-decoder":
                raise ValueError("block.residual: parallel sums self-attention and "
                                 "feed-forward; an encoder-decoder's cross-attention has no "
                                 "parallel form; use sequential")
            if self.norm.position == "post":
                raise ValueError("block.residual: parallel adds both branches to the layer "
                                 "input; norm.position post normalises that sum instead; use "
                                 "pre, branch or sandwich")
        if self.norm.skip_first and (self.norm.position != "pre"
                                     or self.block.residual != "sequential"):
            raise ValueError("norm.skip_first: leaves out the first layer's self-attention "
                             "pre-norm; needs norm.position: pre and block.residual: "
                             "sequential")
        if not self.head.transform_bias and not self.head.transform:
            raise ValueError("head.transform_bias: is about the head.transform linear; set "
                             "head.transform or remove it")
        if self.block.shared_norm and (self.block.residual != "parallel"
                                       or self.norm.position != "pre"):
            raise ValueError("block.shared_norm: one norm shared by both sublayers needs "
                             "block.residual: parallel and norm.position: pre")
        return self

    # ---- derived views used by lowering and reports -------------------------------------

    @property
    def stacks(self) -> tuple[str, ...]:
        """The stacks this architecture has, in execution order."""
        return {
            "encoder-only": ("encoder",),
            "decoder-only": ("decoder",),
            "encoder-decoder": ("encoder", "decoder"),
        }[self.arch]

    @property
    def embedding_dropout(self) -> float:
        """Dropout p after the embeddings: ``embedding.dropout``, else ``dropout``. Read here,
        not derived in place, so a copy with another ``dropout`` (model_copy(update=...))
        keeps following it."""
        p = self.embedding.dropout
        return self.dropout if p is None else p

    def layer_count(self, stack: str) -> int:
        """Layers in ``stack``."""
        if isinstance(self.layers, StackLayers):
            return int(getattr(self.layers, stack))
        return int(self.layers)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """pydantic's dump, ``tokens`` left out when there are none and its unset ids left
        out (a spec without token ids dumps as it did before the field existed), and
        ``attention.dropout`` left out at 0, ``embedding.dropout`` when unset or equal to
        ``dropout`` and ``embedding.pad_no_grad`` when false (likewise: specs without them
        dump unchanged)."""
        data = super().model_dump(**kwargs)
        att = data.get("attention")
        if isinstance(att, dict) and att.get("dropout") == 0:
            att.pop("dropout")
        emb = data.get("embedding")
        if isinstance(emb, dict) and emb.get("dropout") in (None, data.get("dropout")):
            emb.pop("dropout", None)  # unset, or (a copy made unvalidated) equal to dropout
        if isinstance(emb, dict) and emb.get("pad_no_grad") is False:
            emb.pop("pad_no_grad")  # off: dumps as before the field existed
        tokens = data.get("tokens")
        if tokens is None:
            data.pop("tokens", None)
        else:
            data["tokens"] = {k: v for k, v in tokens.items() if v is not None}
        return data

    def _check_tokens(self, tokens: Tokens) -> None:
        """Each id indexes its vocabulary: bos and pad the source's (the input), eos and
        decoder_start the target's (what is generated); decoder_start only for encoder-decoders."""
        if tokens.decoder_start is not None and self.arch != "encoder-decoder":
            raise ValueError(f"tokens.decoder_start: only for encoder-decoder, not {self.arch}")
        checks = [("bos", tokens.bos, "source"), ("pad", tokens.pad, "source"),
                  ("decoder_start", tokens.decoder_start, "target")]
        checks += [("eos", t, "target") for t in tokens.eos_ids()]
        for name, value, role in checks:
            vocab = self.vocab_size(role if self.arch == "encoder-decoder" else "source")
            if value is not None and value >= vocab:
                raise ValueError(f"tokens.{name}: {value} is not below the vocabulary "
                                 f"({vocab})")

    def _check_pad_row(self) -> None:
        """embedding.pad_no_grad names a row, tokens.pad, of every token table."""
        pad = self.tokens.pad if self.tokens is not None else None
        if pad is None:
            raise ValueError("embedding.pad_no_grad: needs tokens.pad, the row that gets no "
                             "gradient; set tokens.pad or remove it")
        roles = ("source", "target") if self.arch == "encoder-decoder" else ("source",)
        for role in roles:
            if pad >= self.vocab_size(role):
                raise ValueError(f"embedding.pad_no_grad: tokens.pad {pad} is not below the "
                                 f"{role} vocabulary ({self.vocab_size(role)})")

    def vocab_size(self, role: str) -> int:
        """Vocabulary of ``role``: 'source' (encoder input) or 'target' (decoder, output)."""
        if isinstance(self.vocab, Vocabularies):
            return int(getattr(self.vocab, role))
        return int(self.vocab)

    def layer_is_local(self, index: int) -> bool:
        """Layer ``index`` attends through the sliding window (attention.window_pattern)."""
        att = self.attention
        if att.window is None:
            return False
        pattern = att.window_pattern or ["local"]
        return pattern[index % len(pattern)] == "local"

    @property
    def rotary_dim(self) -> int:
        """Channels of each head that rotary positions rotate (embedding.rotary_fraction;
        latent attention: latent.rope_dim)."""
        assert self.attention.head_dim is not None
        if self.attention.latent is not None:
            return self.attention.latent.rope_dim
        return rotary_dim(self.attention.head_dim, self.embedding.rotary_fraction)

    @property
    def output_vocab(self) -> int:
        """Size of the output distribution: the target vocabulary (or the only one)."""
        return self.vocab_size("target" if self.arch == "encoder-decoder" else "source")


MOE_FIELDS = ("top_k", "router", "router_eps", "expert_hidden", "shared_experts",
              "shared_hidden", "shared_gate", "dense_layers", "router_groups",
              "router_top_groups", "router_scale")


def _derive_experts(spec: Spec) -> None:
    """Rules and defaults of the mixture-of-experts fields of ``spec.ffn`` (in place)."""
    ffn = spec.ffn
    if ffn.experts is None:
        for name in MOE_FIELDS:
            if getattr(ffn, name) is not None:
                raise ValueError(f"ffn.{name}: only for a mixture of experts; set ffn.experts "
                                 "or remove it")
        return
    if ffn.top_k is None:
        raise ValueError("ffn.top_k: required with ffn.experts (experts per token, e.g. 2)")
    if ffn.top_k > ffn.experts:
        raise ValueError(f"ffn.top_k: {ffn.top_k} is more than the {ffn.experts} experts; "
                         "choose top_k <= experts")
    if ffn.bias:
        raise ValueError("ffn.bias: routed experts have no biases (Mixtral, Qwen-MoE, OLMoE, "
                         "DeepSeek); set bias: false")
    if ffn.router is None:
        ffn.router = "softmax_topk_renorm"
    if ffn.router == "sparsemixer":
        if ffn.top_k != 2:
            raise ValueError(f"ffn.top_k: the sparsemixer router picks 2 experts, not "
                             f"{ffn.top_k}; set top_k: 2")
        if ffn.router_eps is None:
            ffn.router_eps = 0.01
    elif ffn.router_eps is not None:
        raise ValueError("ffn.router_eps: only for router: sparsemixer; remove it")
    if ffn.expert_hidden is None:
        ffn.expert_hidden = ffn.hidden
        check_derived(ffn, "expert_hidden", "ffn.expert_hidden", "ffn.hidden")
    if ffn.shared_experts is None:
        ffn.shared_experts = 0
    if ffn.shared_experts == 0 and (ffn.shared_hidden is not None or ffn.shared_gate):
        name = "shared_hidden" if ffn.shared_hidden is not None else "shared_gate"
        raise ValueError(f"ffn.{name}: there are no shared experts; set ffn.shared_experts "
                         "or remove it")
    if ffn.shared_experts and ffn.shared_hidden is None:
        ffn.shared_hidden = ffn.shared_experts * int(ffn.expert_hidden or 0)
        check_derived(ffn, "shared_hidden", "ffn.shared_hidden",
                      "ffn.shared_experts * ffn.expert_hidden")
    if ffn.shared_gate is None:
        ffn.shared_gate = False
    if ffn.dense_layers is None:
        ffn.dense_layers = 0
    _derive_groups(ffn)
    if ffn.dense_layers:
        if len(spec.stacks) > 1:
            raise ValueError("ffn.dense_layers: dense first layers need one stack; "
                             f"{spec.arch} has two, remove it")
        if ffn.dense_layers >= spec.layer_count(spec.stacks[0]):
            raise ValueError(f"ffn.dense_layers: {ffn.dense_layers} leaves no layer with "
                             f"experts out of {spec.layer_count(spec.stacks[0])}; choose fewer")


def _derive_groups(ffn: FeedForward) -> None:
    """Rules and defaults of group-limited routing and the routing scale (DeepSeek)."""
    if ffn.router_scale is None:
        ffn.router_scale = 1.0
    if ffn.router_groups is None:
        if ffn.router_top_groups is not None:
            raise ValueError("ffn.router_top_groups: needs ffn.router_groups")
        ffn.router_groups = 1
    experts, groups = int(ffn.experts or 0), ffn.router_groups
    if experts % groups:
        raise ValueError(f"ffn.router_groups: {experts} experts do not split into {groups} "
                         "equal groups")
    if ffn.router_top_groups is None:
        ffn.router_top_groups = groups
    if ffn.router_top_groups > groups:
        raise ValueError(f"ffn.router_top_groups: {ffn.router_top_groups} is more than the "
                         f"{groups} groups")
    if ffn.top_k and ffn.top_k > ffn.router_top_groups * (experts // groups):
        raise ValueError(f"ffn.top_k: {ffn.top_k} experts do not fit in "
                         f"{ffn.router_top_groups} groups of {experts // groups}")
    sigmoid = str(ffn.router).startswith("sigmoid")
    if groups > 1 and sigmoid and experts // groups < 2:
        raise ValueError("ffn.router_groups: a sigmoid router scores a group by its two best "
                         "experts; use groups of at least 2")
    if groups > 1 and ffn.router in ("topk_softmax", "sparsemixer"):
        raise ValueError("ffn.router_groups: group-limited routing is for the softmax_topk "
                         "and sigmoid routers")
    if ffn.router == "sparsemixer" and ffn.router_scale != 1.0:
        raise ValueError("ffn.router_scale: the sparsemixer router's weights are not scaled")


def _derive_latent(spec: Spec) -> None:
    """Rules and defaults of multi-head latent attention (attention.latent)."""
    att, emb = spec.attention, spec.embedding
    assert att.latent is not None and att.head_dim is not None
    att.latent = lat = att.latent.model_copy()
    if spec.arch != "decoder-only":
        raise ValueError("attention.latent: multi-head latent attention is implemented for "
                         "decoder-only models")
    if emb.positions != "rope" or emb.rotary_fraction != 1.0:
        raise ValueError("attention.latent: needs embedding.positions rope with "
                         "rotary_fraction 1 (latent.rope_dim says which channels rotate)")
    if lat.rope_dim % 2 or lat.rope_dim >= att.head_dim:
        raise ValueError(f"attention.latent.rope_dim: {lat.rope_dim} must be even and below "
                         f"head_dim {att.head_dim} (head_dim = qk_nope_head_dim + rope_dim)")
    if att.kv_heads != att.heads:
        raise ValueError("attention.kv_heads: latent attention expands its keys and values "
                         "per query head; set kv_heads = heads")
    if att.qkv_bias:
        raise ValueError("attention.qkv_bias: latent attention's projections have no biases "
                         "here; set attention.bias (or qkv_bias) false")
    if att.qk_norm != "none" or att.window is not None:
        name = "qk_norm" if att.qk_norm != "none" else "window"
        raise ValueError(f"attention.{name}: not combined with latent attention")
    if spec.block.residual != "sequential":
        raise ValueError("block.residual: latent attention is implemented with sequential "
                         "residuals")
    if lat.v_head_dim is None:
        lat.v_head_dim = att.head_dim - lat.rope_dim
        check_derived(lat, "v_head_dim", "attention.latent.v_head_dim",
                      "attention.head_dim - attention.latent.rope_dim")
