"""Parity of the embedding and head features with Hugging Face models built from configs:
OPT (learned positions with an offset of 2), BERT (segment embeddings, an embedding
LayerNorm, the masked-LM head transform), BART (offset positions and an embedding LayerNorm in
both stacks of an encoder-decoder) and Marian (sinusoids in the split layout).

Each reference gets random weights (parity_support.randomize), copied by name into tfgraph;
the parameter counts must agree and the logits must be within 1e-4 through to_torch and
through ONNX (opsets 23 and 17) in onnxruntime. parity_support.check_against feeds only
input_ids; these models also take token_type_ids or two sequences, so ``_check`` below feeds
every graph input by name.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.spec.schema import Spec

from parity_support import check, randomize, tiny

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

BATCH, SEQ, TGT = 2, 13, 9


def _ids(vocab: int, length: int, seed: int) -> Tensor:
    return torch.randint(0, vocab, (BATCH, length), generator=torch.Generator().manual_seed(seed))


def _check(spec: Spec, weights: dict[str, Tensor], params: int, feeds: dict[str, Tensor],
           expected: Tensor) -> None:
    """tfgraph with ``weights``: ``params`` parameters, and ``expected`` from ``feeds`` (every
    graph input by name) through to_torch and through ONNX at opsets 23 and 17."""
    from tfgraph.exporters.onnx.model import to_onnx

    graph = tfgraph.compile(spec)
    assert graph.report()["params"] == params
    ours = to_torch(graph, weights=weights).eval()
    with torch.no_grad():
        check(ours(*(feeds[name] for name in graph.inputs)), expected)
    plain = {k: v.detach() for k, v in weights.items()}
    for opset in (23, 17):
        model = to_onnx(graph, weights=plain, opset=opset)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        out = session.run(None, {k: v.numpy() for k, v in feeds.items()})[0]
        check(torch.from_numpy(out), expected)


def _linear(src: str, dst: str, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """weight and bias of ``src`` as ``dst`` (a linear or a LayerNorm)."""
    return {f"{dst}.{kind}": sd[f"{src}.{kind}"] for kind in ("weight", "bias")}


def _fairseq_layer(src: str, dst: str, sd: dict[str, Tensor], cross: bool
                   ) -> dict[str, Tensor]:
    """One OPT / BART / Marian layer (fairseq's names) as tfgraph's."""
    pairs = {f"self_attn.{r}": f"self_attn.{r}_proj" for r in "qkv"}
    pairs.update({"self_attn.o": "self_attn.out_proj", "self_attn_norm": "self_attn_layer_norm",
                  "ffn.up": "fc1", "ffn.down": "fc2", "ffn_norm": "final_layer_norm"})
    if cross:
        pairs.update({f"cross_attn.{r}": f"encoder_attn.{r}_proj" for r in "qkv"})
        pairs.update({"cross_attn.o": "encoder_attn.out_proj",
                      "cross_attn_norm": "encoder_attn_layer_norm"})
    out: dict[str, Tensor] = {}
    for ours, theirs in pairs.items():
        out.update(_linear(f"{src}.{theirs}", f"{dst}.{ours}", sd))
    return out


# ---- OPT: learned positions read from row p + 2 ----------------------------------------------


def test_opt_matches_hugging_face() -> None:
    spec = tiny("tiny-opt.yaml")
    assert spec.embedding.position_offset == 2
    config = transformers.OPTConfig(
        vocab_size=spec.vocab, hidden_size=spec.d_model, word_embed_proj_dim=spec.d_model,
        num_hidden_layers=spec.layers, ffn_dim=spec.ffn.hidden,
        num_attention_heads=spec.attention.heads, max_position_embeddings=spec.max_len,
        do_layer_norm_before=True, activation_function="relu", dropout=0.0,
        pad_token_id=1, bos_token_id=2, eos_token_id=2)
    ref = transformers.OPTForCausalLM._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=1)
    sd = ref.state_dict()
    weights = {"embed.tokens.weight": sd["model.decoder.embed_tokens.weight"],
               "decoder.positions.weight": sd["model.decoder.embed_positions.weight"],
               **_linear("model.decoder.final_layer_norm", "decoder.norm", sd)}
    assert weights["decoder.positions.weight"].shape[0] == spec.max_len + 2
    for i in range(spec.layers):
        weights.update(_fairseq_layer(f"model.decoder.layers.{i}", f"decoder.layers.{i}", sd,
                                      cross=False))
    ids = _ids(spec.vocab_size("source"), SEQ, 0)
    with torch.no_grad():
        expected = ref(ids).logits
        # The offset matters: reading rows 0.. instead of 2.. changes the logits.
        shifted = dict(weights, **{"decoder.positions.weight":
                                   torch.roll(weights["decoder.positions.weight"], 2, 0)})
        graph = tfgraph.compile(spec)
        assert (to_torch(graph, weights=shifted).eval()(ids) - expected).abs().max() > 1e-2
    _check(spec, weights, sum(p.numel() for p in ref.parameters()), {"input_ids": ids},
           expected)


# ---- BERT: segments, embedding LayerNorm, MLM head transform ---------------------------------


def _bert(spec: Spec) -> tuple[torch.nn.Module, dict[str, Tensor]]:
    config = transformers.BertConfig(
        vocab_size=spec.vocab, hidden_size=spec.d_model, num_hidden_layers=spec.layers,
        num_attention_heads=spec.attention.heads, intermediate_size=spec.ffn.hidden,
        max_position_embeddings=spec.max_len, type_vocab_size=spec.embedding.token_types,
        layer_norm_eps=spec.norm.eps, hidden_act="gelu")
    ref = transformers.BertForMaskedLM._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=2)
    sd = ref.state_dict()
    emb = "bert.embeddings"
    weights = {"embed.tokens.weight": sd[f"{emb}.word_embeddings.weight"],
               "embed.token_types.weight": sd[f"{emb}.token_type_embeddings.weight"],
               "encoder.positions.weight": sd[f"{emb}.position_embeddings.weight"],
               **_linear(f"{emb}.LayerNorm", "encoder.embed_norm", sd),
               **_linear("cls.predictions.transform.dense", "head.transform", sd),
               **_linear("cls.predictions.transform.LayerNorm", "head.transform_norm", sd),
               "head.bias": sd["cls.predictions.bias"]}
    # The decoder is the word table, its bias cls.predictions.bias (one tensor each).
    assert sd["cls.predictions.decoder.weight"].data_ptr() == \
        sd[f"{emb}.word_embeddings.weight"].data_ptr()
    for i in range(spec.layers):
        src, dst = f"bert.encoder.layer.{i}", f"encoder.layers.{i}"
        for ours, theirs in {"self_attn.q": "attention.self.query",
                             "self_attn.k": "attention.self.key",
                             "self_attn.v": "attention.self.value",
                             "self_attn.o": "attention.output.dense",
                             "self_attn_norm": "attention.output.LayerNorm",
                             "ffn.up": "intermediate.dense", "ffn.down": "output.dense",
                             "ffn_norm": "output.LayerNorm"}.items():
            weights.update(_linear(f"{src}.{theirs}", f"{dst}.{ours}", sd))
    return ref, weights


def test_bert_matches_hugging_face_with_segments() -> None:
    spec = tiny("tiny-bert.yaml")
    ref, weights = _bert(spec)
    ids = _ids(spec.vocab_size("source"), SEQ, 0)
    types = _ids(spec.embedding.token_types, SEQ, 1)
    assert types.any() and not types.all()  # both segments present
    with torch.no_grad():
        expected = ref(input_ids=ids, token_type_ids=types).logits
    _check(spec, weights, sum(p.numel() for p in ref.parameters()),
           {"input_ids": ids, "token_type_ids": types}, expected)


def test_bert_token_type_ids_default_to_segment_zero() -> None:
    """Without token_type_ids every token is in segment 0, in to_torch and in the generated
    model.py alike, as in Hugging Face's BertModel."""
    spec = tiny("tiny-bert.yaml")
    ref, weights = _bert(spec)
    ids = _ids(spec.vocab_size("source"), SEQ, 3)
    graph = tfgraph.compile(spec)
    ours = to_torch(graph, weights=weights).eval()
    with torch.no_grad():
        expected = ref(input_ids=ids).logits
        check(ours(ids), expected)
        check(ours(ids, torch.zeros_like(ids)), expected)
        assert (ours(ids, torch.ones_like(ids)) - expected).abs().max() > 1e-2


def test_generated_model_py_defaults_token_type_ids(tmp_path: object) -> None:
    import importlib.util
    from pathlib import Path

    from tfgraph.exporters.torch.folder import write_torch_folder

    spec = tiny("tiny-bert.yaml")
    graph = tfgraph.compile(spec)
    folder = Path(str(tmp_path)) / "bert"
    write_torch_folder(graph, folder, None, seed=0)
    loaded = importlib.util.spec_from_file_location("generated_bert", folder / "model.py")
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    net = module.load(str(folder))
    ids = _ids(spec.vocab_size("source"), SEQ, 4)
    types = _ids(2, SEQ, 5)
    ours = to_torch(graph, seed=0).eval()
    with torch.no_grad():
        assert torch.equal(net(ids), ours(ids))
        assert torch.equal(net(ids, types), ours(ids, types))


# ---- encoder-decoder: BART and Marian --------------------------------------------------------


def _seq2seq_weights(spec: Spec, sd: dict[str, Tensor], positions: bool, embed_norm: bool
                     ) -> dict[str, Tensor]:
    """A BART / Marian state dict (shared table ``model.shared``) as tfgraph's names."""
    weights = {"embed.tokens.weight": sd["model.shared.weight"]}
    for stack in spec.stacks:
        if positions:
            weights[f"{stack}.positions.weight"] = sd[f"model.{stack}.embed_positions.weight"]
        if embed_norm:
            weights.update(_linear(f"model.{stack}.layernorm_embedding", f"{stack}.embed_norm",
                                   sd))
        for i in range(spec.layer_count(stack)):
            weights.update(_fairseq_layer(f"model.{stack}.layers.{i}", f"{stack}.layers.{i}",
                                          sd, cross=stack == "decoder"))
    return weights


def _seq2seq_config(cls: Callable[..., object], spec: Spec, **extra: object) -> object:
    return cls(vocab_size=spec.vocab, d_model=spec.d_model,
               encoder_layers=spec.layer_count("encoder"),
               decoder_layers=spec.layer_count("decoder"),
               encoder_attention_heads=spec.attention.heads,
               decoder_attention_heads=spec.attention.heads,
               encoder_ffn_dim=spec.ffn.hidden, decoder_ffn_dim=spec.ffn.hidden,
               dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
               pad_token_id=0, bos_token_id=0, eos_token_id=1, decoder_start_token_id=0,
               **extra)


def _seq2seq_feeds(spec: Spec) -> dict[str, Tensor]:
    return {"src_ids": _ids(spec.vocab_size("source"), SEQ, 0),
            "tgt_ids": _ids(spec.vocab_size("target"), TGT, 1)}


def test_bart_matches_hugging_face() -> None:
    spec = tiny("tiny-bart.yaml")
    config = _seq2seq_config(transformers.BartConfig, spec, activation_function="gelu",
                             max_position_embeddings=spec.max_len, scale_embedding=False)
    ref = transformers.BartForConditionalGeneration._from_config(
        config, attn_implementation="eager").eval()
    randomize(ref, seed=3)
    # final_logits_bias is a registered buffer of zeros, not a parameter (transformers 5):
    # randomize leaves it, and tfgraph's head has no bias (output_bias false).
    assert "final_logits_bias" not in dict(ref.named_parameters())
    assert not ref.final_logits_bias.any()
    weights = _seq2seq_weights(spec, ref.state_dict(), positions=True, embed_norm=True)
    feeds = _seq2seq_feeds(spec)
    with torch.no_grad():
        expected = ref(input_ids=feeds["src_ids"], decoder_input_ids=feeds["tgt_ids"]).logits
    _check(spec, weights, sum(p.numel() for p in ref.parameters()), feeds, expected)


def test_marian_matches_hugging_face() -> None:
    spec = tiny("tiny-marian.yaml")
    assert spec.embedding.sinusoid_layout == "split" and spec.embedding.scale
    config = _seq2seq_config(transformers.MarianConfig, spec, activation_function="swish",
                             max_position_embeddings=64, scale_embedding=True,
                             share_encoder_decoder_embeddings=True)
    ref = transformers.MarianMTModel._from_config(config, attn_implementation="eager").eval()
    # Marian's sinusoid tables are frozen nn.Embedding weights, so they are parameters to
    # PyTorch; they are constants in tfgraph (computed per call), so they keep their values
    # here and are left out of the parameter count.
    tables = {n: p.detach().clone() for n, p in ref.named_parameters() if "embed_positions" in n}
    assert len(tables) == 2
    randomize(ref, seed=4)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n in tables:
                p.copy_(tables[n])
    weights = _seq2seq_weights(spec, ref.state_dict(), positions=False, embed_norm=False)
    feeds = _seq2seq_feeds(spec)
    with torch.no_grad():
        expected = ref(input_ids=feeds["src_ids"], decoder_input_ids=feeds["tgt_ids"]).logits
    params = sum(p.numel() for p in ref.parameters()) - sum(t.numel() for t in tables.values())
    _check(spec, weights, params, feeds, expected)
    # The layout matters: the interleaved sinusoids give other logits.
    interleaved = Spec.model_validate({**spec.model_dump(), "embedding": {
        **spec.embedding.model_dump(), "sinusoid_layout": "interleaved"}})
    with torch.no_grad():
        other = to_torch(tfgraph.compile(interleaved), weights=weights).eval()(
            feeds["src_ids"], feeds["tgt_ids"])
    assert (other - expected).abs().max() > 1e-2


def test_split_sinusoids_match_marian_for_odd_widths() -> None:
    """HF's table for odd d: ceil(d/2) sines, then floor(d/2) cosines."""
    from tfgraph.exporters.torch.functional import sinusoidal_positions
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for d in (7, 8):
        table = MarianSinusoidalPositionalEmbedding(20, d)
        table.weight.data = table.create_weight()
        ours = sinusoidal_positions(20, d, torch.device("cpu"), torch.float32, "split")
        assert (ours - table.weight).abs().max() < 1e-5
