"""flops.matmul equals torch's FlopCounterMode on reference models built in the test from configs
with random weights, and GPT-style formulas reduce exactly to Narayanan et al. (2021).

FlopCounterMode counts 0 for CPU scaled_dot_product_attention kernels (a known FlopCounterMode gap), so the
references run with explicit-matmul attention: Hugging Face's "eager" implementation, and
torch.nn.Transformer under the MATH SDPA backend.
"""

from __future__ import annotations

import pytest
import sympy

import tfgraph
from tfgraph.passes.formulas import D, L, V, spec_formulas
from tfgraph.graph.ir import B, S
from tfgraph.spec.schema import Spec

from conftest import ROOT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn()
    return counter.get_total_flops()


def test_gpt2_matmul_flops_equal_flop_counter():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(attn_implementation="eager")).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 128))
    reference = counted(lambda: model(ids))
    rep = tfgraph.compile(ROOT / "specs" / "gpt2.yaml").report(batch=1, seq=128)
    assert rep["flops"]["matmul"] == reference


def test_torch_transformer_base_train_mode_matmul_flops_equal_flop_counter():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = torch.nn.Transformer(512, 8, 6, 6, 2048, batch_first=True).train()
    table = torch.nn.Embedding(37000, 512)
    src = torch.randint(0, 37000, (2, 32))
    tgt = torch.randint(0, 37000, (2, 32))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(32)

    def forward() -> torch.Tensor:
        out = model(table(src), table(tgt), tgt_mask=mask, tgt_is_causal=True)  # (B, T, d)
        return out @ table.weight.T  # the tied output head, (B, T, V)

    with sdpa_kernel(SDPBackend.MATH):
        reference = counted(forward)
    spec = tfgraph.load_spec(ROOT / "specs" / "base.yaml")
    rep = tfgraph.compile(spec).report(batch=2, seq=32, tgt_seq=32)
    assert rep["flops"]["matmul"] == reference


def test_llama_gqa_swiglu_matmul_flops_equal_flop_counter():
    """GQA (k/v heads repeated for the products), SwiGLU and rope, at tiny-llama.yaml sizes."""
    spec = tfgraph.load_spec(ROOT / "specs" / "tiny-llama.yaml")
    att = spec.attention
    config = transformers.LlamaConfig(
        hidden_size=spec.d_model, intermediate_size=spec.ffn.hidden,
        num_hidden_layers=spec.layers, num_attention_heads=att.heads,
        num_key_value_heads=att.kv_heads, vocab_size=spec.vocab, tie_word_embeddings=False,
        max_position_embeddings=spec.max_len, rope_theta=spec.embedding.rope_theta,
        attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, spec.vocab, (3, 17))
    reference = counted(lambda: model(ids))
    assert tfgraph.compile(spec).report(batch=3, seq=17)["flops"]["matmul"] == reference


NARAYANAN = L * (24 * B * S * D**2 + 4 * B * S**2 * D) + 2 * B * S * D * V


def gpt_style(**over) -> Spec:
    data = {"name": "g", "arch": "decoder-only", "d_model": 96, "layers": 5, "vocab": 301,
            "max_len": 64, "embedding": {"positions": "learned", "scale": False},
            "attention": {"heads": 6}, "ffn": {"activation": "gelu"},
            "norm": {"position": "pre"}}
    data.update(over)
    return Spec.model_validate(data)


@pytest.mark.parametrize("spec", [
    tfgraph.load_spec(ROOT / "specs" / "gpt2.yaml"),
    tfgraph.load_spec(ROOT / "specs" / "tiny-decoder.yaml"),
    tfgraph.load_spec(ROOT / "specs" / "named-tensor.yaml"),  # branch norm, probs, no bias
    gpt_style(),
    gpt_style(norm={"position": "post"}, embedding={"positions": "rope", "tie_output": False}),
    gpt_style(norm={"position": "sandwich", "kind": "rmsnorm"}, dropout=0.0),
], ids=["gpt2", "tiny-decoder", "named-tensor", "pre", "post-rope-untied", "sandwich"])
def test_gpt_style_matmul_formula_is_narayanan_2021(spec):
    ours = spec_formulas(tfgraph.compile(spec)).figures["flops.matmul"]
    assert sympy.simplify(ours - NARAYANAN) == 0


def test_narayanan_check_fails_when_the_layout_differs():
    """The reduction is not vacuous: a SwiGLU or 2·d feed-forward is not Narayanan's layout."""
    for spec in (gpt_style(ffn={"activation": "swiglu"}), gpt_style(ffn={"hidden": 192})):
        ours = spec_formulas(tfgraph.compile(spec)).figures["flops.matmul"]
        assert sympy.simplify(ours - NARAYANAN) != 0


def test_causal_effective_matmul_counts_only_unmasked_scores():
    g = tfgraph.compile(ROOT / "specs" / "tiny-decoder.yaml")
    one = g.report(batch=2, seq=1)["flops"]
    assert one["causal_effective_matmul"] == one["matmul"]  # a single position masks nothing
    spec = g.spec
    rep = g.report(batch=2, seq=9)["flops"]
    masked_scores = 2 * spec.attention.heads * (9 * 8 // 2)  # B * h * S(S-1)/2 per layer
    per_layer = 2 * 2 * masked_scores * spec.attention.head_dim  # QK^T and A.V, 2 per MAC
    assert rep["matmul"] - rep["causal_effective_matmul"] == spec.layers * per_layer
