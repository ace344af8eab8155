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

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Documented upper bounds (README "Limits"): far above any published model, low enough that a
# typo such as 5120000 for 5120 is caught and symbolic accounting never meets absurd numbers.
MAX_D_MODEL = 1 << 18  # 262,144
MAX_LAYERS = 10_000
MAX_VOCAB = 1 << 24  # 16,777,216
MAX_HEADS = 4_096
MAX_HIDDEN = 1 << 21  # 2,097,152
MAX_LEN = 1 << 24

Arch = Literal["encoder-only", "decoder-only", "encoder-decoder"]
Positions = Literal["sinusoidal", "learned", "rope", "none"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"]
NormPosition = Literal["post", "pre", "branch", "sandwich"]
NormKind = Literal["layernorm", "rmsnorm", "scalenorm"]
Residual = Literal["sequential", "parallel"]
Normalize = Literal["softmax", "hardmax"]
QKNorm = Literal["none", "full"]
Output = Literal["logits", "probs"]
DType = Literal["float32", "float16", "bfloat16"]

GATED_ACTIVATIONS = ("swiglu", "geglu")


# YAML's true/false only: pydantic's lax bool would take 1, "yes" or "off" as well.
Flag = Annotated[bool, Field(strict=True)]


def _size(upper: int) -> Any:
    """A strict positive integer with an upper bound (``true`` or ``"8"`` is not a size)."""
    return Annotated[int, Field(strict=True, ge=1, le=upper)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)


def _finite_float(value: Any) -> Any:
    """Floats may be written as YAML ints (``10000``) but never as booleans or strings."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a number")
    if not math.isfinite(value):
        raise ValueError("must be a finite number (not NaN or infinity)")
    return float(value)


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
    rotary embeddings applied to q and k (GPT-NeoX rotate-half convention), or none."""
    scale: Flag = True
    """Multiply token embeddings by sqrt(d_model) (Vaswani et al. 2017 §3.4)."""
    tie_output: Flag = True
    """The output projection reuses the (target) token table instead of its own weight."""
    share: Flag | None = None
    """Encoder-decoder only: one token table for both stacks (needs one vocabulary).
    Default: true when there is one vocabulary, false otherwise."""
    output_bias: Flag = False
    """Add a bias to the output projection (``head.bias``)."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies theta^(-2i/d) (positions: rope)."""

    _finite = field_validator("rope_theta", mode="before")(_finite_float)

    @field_validator("rope_theta")
    @classmethod
    def _positive_theta(cls, value: float) -> float:
        if value <= 1.0:
            raise ValueError("must be greater than 1 (typical values: 10000, 500000)")
        return value


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
    """full: a norm (of norm.kind) on the whole q and k projections, before rotary positions
    (OLMo 2; Wortsman et al. 2023). Its gains are self_attn.q_norm / k_norm."""
    normalize: Normalize = "softmax"
    """softmax, or hardmax: the one-hot of the arg-max ("hard attention": each query reads only its highest-scoring key)."""


class FeedForward(_Strict):
    """The position-wise feed-forward sublayer."""

    hidden: _size(MAX_HIDDEN) | None = None  # type: ignore[valid-type]
    """Inner width d_ff. Default: 4 * d_model."""
    activation: Activation = "relu"
    """relu; gelu (exact erf); gelu_tanh (GPT-2's tanh approximation); silu; or the gated
    swiglu = down(silu(gate(x)) * up(x)) and geglu = down(gelu(gate(x)) * up(x))."""
    bias: Flag = True
    """Biases on the up, gate and down projections."""


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


class Norm(_Strict):
    """Where and how sublayers are normalised."""

    position: NormPosition = "post"
    """post: norm(x + f(x)) (Vaswani); pre: x + f(norm(x)) (GPT-2); branch: x + norm(f(x))
    (OLMo 2); sandwich: x + norm(f(norm(x))) (Gemma 2)."""
    kind: NormKind = "layernorm"
    """layernorm (gain and bias); rmsnorm (gain, no bias); scalenorm (one scalar g: g*x/||x||_2)."""
    eps: float = 1e-5
    """Added inside the normalising square root."""
    final: Flag | None = None
    """A norm after the last layer of each stack. Default: true for pre and sandwich."""

    _finite = field_validator("eps", mode="before")(_finite_float)

    @field_validator("eps")
    @classmethod
    def _eps_range(cls, value: float) -> float:
        if not 0.0 < value < 1.0:
            raise ValueError("must be between 0 and 1 (typical values: 1e-5, 1e-6)")
        return value


class Head(_Strict):
    """The output head: what maps the last hidden state to the vocabulary."""


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
    """Dropout probability after embeddings and after each sublayer (training only)."""
    output: Output = "logits"
    """logits, or probs (softmax over the vocabulary)."""
    dtype: DType = "float32"
    """Parameter and activation dtype."""

    _finite = field_validator("dropout", mode="before")(_finite_float)

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
        # --- attention geometry
        if att.head_dim is None:
            if self.d_model % att.heads:
                raise ValueError(
                    f"attention.heads: d_model {self.d_model} is not divisible by heads "
                    f"{att.heads}; choose heads dividing d_model or set attention.head_dim"
                )
            att.head_dim = self.d_model // att.heads
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
        if emb.positions == "rope" and att.head_dim % 2:
            raise ValueError(
                f"attention.head_dim: rotary positions rotate pairs, so head_dim must be even "
                f"(got {att.head_dim})"
            )
        # --- embeddings
        if emb.positions == "learned" and self.max_len is None:
            raise ValueError("max_len: required when embedding.positions is learned")
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

    def layer_count(self, stack: str) -> int:
        """Layers in ``stack``."""
        if isinstance(self.layers, StackLayers):
            return int(getattr(self.layers, stack))
        return int(self.layers)

    def vocab_size(self, role: str) -> int:
        """Vocabulary of ``role``: 'source' (encoder input) or 'target' (decoder, output)."""
        if isinstance(self.vocab, Vocabularies):
            return int(getattr(self.vocab, role))
        return int(self.vocab)

    @property
    def output_vocab(self) -> int:
        """Size of the output distribution: the target vocabulary (or the only one)."""
        return self.vocab_size("target" if self.arch == "encoder-decoder" else "source")
