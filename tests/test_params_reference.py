"""Parameter counts equal the reference implementations, built from configs in the test (no
pasted numbers): Hugging Face GPT-2 small and medium, a Llama at TinyLlama-1.1B sizes, and
torch.nn.Transformer(512, 8, 6, 6, 2048) with one shared 37000-token table. References are
instantiated on the meta device (shapes without storage), which is all counting needs."""

from __future__ import annotations

from collections import Counter

import pytest

import tfgraph
from tfgraph.spec.schema import Spec

from conftest import ROOT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def spec_from(file: str, **over) -> Spec:
    data = tfgraph.load_spec(ROOT / "specs" / file).model_dump()
    for key, value in over.items():
        if isinstance(value, dict):
            data[key].update(value)
        else:
            data[key] = value
    return Spec.model_validate(data)


def gpt2(config):
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("size", ["small", "medium"])
def test_gpt2_params_equal_hugging_face(size):
    if size == "small":
        config = transformers.GPT2Config()
        spec = tfgraph.load_spec(ROOT / "specs" / "gpt2.yaml")
    else:  # gpt2-medium: d 1024, 24 layers, 16 heads, n_inner defaults to 4 * d
        config = transformers.GPT2Config(n_embd=1024, n_layer=24, n_head=16)
        spec = spec_from("gpt2.yaml", name="gpt2-medium", d_model=1024, layers=24,
                         attention={"heads": 16, "kv_heads": None, "head_dim": None},
                         ffn={"hidden": None})
    ref = gpt2(config)
    rep = tfgraph.compile(spec).report(batch=1, seq=8)
    assert rep["params"] == numel(ref)  # lm_head is tied: parameters() lists the table once
    by = rep["params_by_component"]
    body = ref.transformer
    assert by["embed"] == body.wte.weight.numel()
    assert by["decoder.embed"] == body.wpe.weight.numel()
    assert by["decoder.norm"] == numel(body.ln_f)
    for i, block in enumerate(body.h):
        assert by[f"decoder.layers.{i}"] == numel(block)


def test_tinyllama_params_equal_hugging_face_name_by_name():
    config = transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    with torch.device("meta"):
        ref = transformers.LlamaForCausalLM(config)
    graph = tfgraph.compile(ROOT / "specs" / "llama.yaml")
    assert graph.report(batch=1, seq=8)["params"] == numel(ref)

    # Llama's Linear layers use torch's [out, in] layout too, so names map one to one.
    rename = [("model.embed_tokens.", "embed.tokens."), ("model.norm.", "decoder.norm."),
              ("lm_head.", "head."), ("model.layers.", "decoder.layers."),
              (".mlp.gate_proj.", ".ffn.gate."), (".mlp.up_proj.", ".ffn.up."),
              (".mlp.down_proj.", ".ffn.down."), (".input_layernorm.", ".self_attn_norm."),
              (".post_attention_layernorm.", ".ffn_norm.")]
    rename += [(f".self_attn.{p}_proj.", f".self_attn.{p}.") for p in "qkvo"]
    theirs = {}
    for name, p in ref.named_parameters():
        for old, new in rename:
            name = name.replace(old, new)
        theirs[name] = tuple(p.shape)
    ours = {p.name: p.attrs["shape"] for p in graph.params()}
    assert ours == theirs


def test_torch_transformer_base_params_equal_ours():
    with torch.device("meta"):
        ref = torch.nn.Transformer(512, 8, 6, 6, 2048, batch_first=True)
        table = torch.nn.Embedding(37000, 512)  # one table: both stacks and the tied output
    spec = spec_from("base.yaml", norm={"final": True})
    rep = tfgraph.compile(spec).report(batch=1, seq=8)
    assert rep["params"] == numel(ref) + numel(table)
    by = rep["params_by_component"]
    assert by["embed"] == numel(table)
    assert by["encoder.norm"] == numel(ref.encoder.norm)
    assert by["decoder.norm"] == numel(ref.decoder.norm)
    for stack in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(ref, stack).layers):
            assert by[f"{stack}.layers.{i}"] == numel(layer)


def test_torch_transformer_layer_shapes_match_ours():
    """Shapes, not only counts: torch packs q, k, v into in_proj_weight [3d, d]."""
    with torch.device("meta"):
        layer = torch.nn.TransformerDecoderLayer(512, 8, 2048)
    theirs = Counter(tuple(p.shape) for n, p in layer.named_parameters()
                     if "in_proj" not in n)
    for n, p in layer.named_parameters():
        if "in_proj" in n:  # split into q, k, v
            theirs.update([(p.shape[0] // 3, *p.shape[1:])] * 3)
    graph = tfgraph.compile(spec_from("base.yaml"))
    ours = Counter(p.attrs["shape"] for p in graph.params()
                   if p.name.startswith("decoder.layers.0."))
    assert ours == theirs
