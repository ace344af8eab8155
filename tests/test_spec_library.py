"""The files in specs/: cited, valid, true to their sources; the tiny ones cover every knob."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from tfgraph import Spec, load_spec
from tfgraph.spec.schema import GATED_ACTIVATIONS, StackLayers, Vocabularies

ROOT = Path(__file__).resolve().parent.parent
SPEC_FILES = sorted((ROOT / "specs").glob("*.yaml"))
TINY_FILES = [p for p in SPEC_FILES if p.stem == "tiny" or p.stem.startswith("tiny-")]


def spec(name: str) -> Spec:
    return load_spec(ROOT / "specs" / f"{name}.yaml")


def test_library_has_the_documented_specs() -> None:
    names = {p.stem for p in SPEC_FILES}
    assert {"base", "big", "gpt2", "bert-base", "llama", "named-tensor", "tiny"} <= names
    assert len(TINY_FILES) >= 6


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_spec_starts_with_a_comment_citing_its_source(path: Path) -> None:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# ")
    header = " ".join(line for line in lines if line.startswith("#"))
    assert len(header) > 120  # a real citation, not a placeholder
    load_spec(path)


def test_spec_names_are_unique() -> None:
    names = [load_spec(p).name for p in SPEC_FILES]
    assert len(names) == len(set(names))


def test_vaswani_table_3() -> None:
    base, big = spec("base"), spec("big")
    for s in (base, big):
        assert s.arch == "encoder-decoder" and s.layers == 6 and s.vocab == 37000
        assert s.embedding.positions == "sinusoidal" and s.embedding.scale
        assert s.embedding.tie_output and s.embedding.share
        assert s.norm.position == "post" and s.norm.final is False
        assert s.ffn.activation == "relu" and s.attention.head_dim == 64
    assert (base.d_model, base.attention.heads, base.ffn.hidden) == (512, 8, 2048)
    assert base.dropout == 0.1
    assert (big.d_model, big.attention.heads, big.ffn.hidden, big.dropout) == (1024, 16, 4096, 0.3)


def test_named_tensor_seed() -> None:
    s = spec("named-tensor")
    assert s.norm.position == "branch" and s.output == "probs"
    assert s.ffn.activation == "relu" and s.embedding.positions == "sinusoidal"


# ---- against the reference implementations' configurations (no download needed) -------


def test_gpt2_matches_hugging_face_config() -> None:
    transformers = pytest.importorskip("transformers")
    c, s = transformers.GPT2Config(), spec("gpt2")
    assert (s.d_model, s.layers, s.attention.heads) == (c.n_embd, c.n_layer, c.n_head)
    assert (s.vocab, s.max_len, s.ffn.hidden) == (c.vocab_size, c.n_positions, 4 * c.n_embd)
    assert s.norm.eps == c.layer_norm_epsilon and c.activation_function == "gelu_new"
    assert s.ffn.activation == "gelu_tanh" and s.norm.position == "pre" and s.norm.final
    assert s.embedding.positions == "learned" and not s.embedding.scale
    assert s.embedding.tie_output and c.tie_word_embeddings


def test_bert_matches_hugging_face_config() -> None:
    transformers = pytest.importorskip("transformers")
    c, s = transformers.BertConfig(), spec("bert-base")
    assert (s.d_model, s.layers, s.attention.heads) == (
        c.hidden_size,
        c.num_hidden_layers,
        c.num_attention_heads,
    )
    assert (s.vocab, s.max_len, s.ffn.hidden) == (
        c.vocab_size,
        c.max_position_embeddings,
        c.intermediate_size,
    )
    assert s.norm.eps == c.layer_norm_eps and s.ffn.activation == c.hidden_act == "gelu"
    assert s.arch == "encoder-only" and s.norm.position == "post"
    assert s.embedding.token_types == c.type_vocab_size and s.embedding.norm
    assert s.head.transform  # with the feed-forward's activation, hidden_act


def test_bert_base_is_exactly_bert_for_masked_lm() -> None:
    """Every parameter of BertForMaskedLM(BertConfig()) is in the spec, no more (the header
    cites the count)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import tfgraph

    with torch.device("meta"):
        ref = transformers.BertForMaskedLM(transformers.BertConfig())
    count = sum(p.numel() for p in ref.parameters())
    assert tfgraph.compile(spec("bert-base")).report()["params"] == count
    assert f"{count:,}" in (ROOT / "specs" / "bert-base.yaml").read_text()


TINYLLAMA = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    vocab_size=32000,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def test_llama_matches_tinyllama_config() -> None:
    s = spec("llama")
    assert (s.d_model, s.ffn.hidden, s.layers) == (2048, 5632, 22)
    assert (s.attention.heads, s.attention.kv_heads, s.vocab, s.max_len) == (32, 4, 32000, 2048)
    assert s.embedding.rope_theta == TINYLLAMA["rope_theta"] and s.norm.eps == 1e-5
    assert s.ffn.activation == "swiglu" and s.norm.kind == "rmsnorm" and s.norm.position == "pre"
    assert not (s.attention.bias or s.ffn.bias or s.embedding.tie_output or s.embedding.scale)
    assert s.dropout == 0.0


def test_parameter_counts_cited_in_comments_match_reference_models() -> None:
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):  # shapes only: no memory, no weights
        gpt2 = GPT2LMHeadModel(GPT2Config())
        llama = LlamaForCausalLM(LlamaConfig(**TINYLLAMA))
    for model, name, cited in ((gpt2, "gpt2", "124,439,808"), (llama, "llama", "1,100,048,384")):
        count = sum(p.numel() for p in model.parameters())
        assert f"{count:,}" == cited
        assert cited in (ROOT / "specs" / f"{name}.yaml").read_text()


# ---- the tiny specs cover every knob ----------------------------------------------------


def _fields(model: type[BaseModel], prefix: str = "") -> dict[str, typing.Any]:
    """Every leaf field of the spec language as 'dotted.path' -> annotation."""
    out: dict[str, typing.Any] = {}
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(_fields(ann, f"{prefix}{name}."))
        else:
            out[prefix + name] = ann
    return out


def _get(obj: typing.Any, dotted: str) -> typing.Any:
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _literal_options(annotation: typing.Any) -> tuple[typing.Any, ...]:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return args
    return tuple(o for a in args for o in _literal_options(a))


def _is_bool(annotation: typing.Any) -> bool:
    return annotation is bool or bool in typing.get_args(annotation)


TINY = [(p, load_spec(p), yaml.safe_load(p.read_text())) for p in TINY_FILES]


@pytest.mark.parametrize("field", sorted(_fields(Spec)))
def test_tiny_specs_cover_every_value_of_every_knob(field: str) -> None:
    annotation = _fields(Spec)[field]
    values = [_get(s, field) for _, s, _ in TINY]
    # a list knob (attention.window_pattern) covers each value any tiny spec's list holds
    seen = {v for value in values if not isinstance(value, BaseModel)
            for v in (value if isinstance(value, list) else [value])}
    if options := _literal_options(annotation):
        assert set(options) <= seen, f"{field}: no tiny spec uses {set(options) - seen}"
    elif _is_bool(annotation):
        assert {True, False} <= seen, f"{field}: tiny specs use only {seen}"
    # Optional knobs with derived defaults: some tiny spec writes them, some leaves them out.
    if type(None) in typing.get_args(annotation):
        written = [_written(raw, field) for _, _, raw in TINY]
        assert any(written) and not all(written), f"{field}: written in all tiny specs or none"


def _written(raw: dict, dotted: str) -> bool:
    node: typing.Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_tiny_specs_cover_the_structural_variants() -> None:
    specs = [s for _, s, _ in TINY]
    assert any(isinstance(s.layers, StackLayers) for s in specs)
    assert any(isinstance(s.vocab, Vocabularies) for s in specs)
    ratios = {(s.attention.heads, s.attention.kv_heads) for s in specs}
    assert any(kv == 1 for _, kv in ratios), "multi-query"
    assert any(1 < kv < h for h, kv in ratios), "grouped-query"
    assert any(kv == h for h, kv in ratios), "multi-head"
    assert any(s.attention.head_dim * s.attention.heads != s.d_model for s in specs)
    assert {a for a in GATED_ACTIVATIONS} <= {s.ffn.activation for s in specs}
    assert any(s.embedding.rope_theta != 10000.0 for s in specs)
    assert any(s.norm.eps != 1e-5 for s in specs)
    assert len({s.dropout for s in specs}) > 1
    # "final" against the default of its placement, both ways round.
    assert any(s.norm.final and s.norm.position in ("post", "branch") for s in specs)


@pytest.mark.parametrize("path", TINY_FILES, ids=[p.name for p in TINY_FILES])
def test_tiny_specs_are_tiny(path: Path) -> None:
    s = load_spec(path)
    assert 32 <= s.d_model <= 64
    assert all(s.layer_count(stack) <= 2 for stack in s.stacks)
    assert all(s.vocab_size(role) <= 300 for role in ("source", "target"))
