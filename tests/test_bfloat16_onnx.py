"""bfloat16 models through onnxruntime's generation and run paths (numpy has no bfloat16:
exporters/onnx/bfloat16.py, exporters/generation/row_gather.py).

onnxruntime's CPU provider has no bfloat16 MatMul, so a bfloat16 build of a spec runs on a GPU
only. Here a small KV-cache model whose cache and logits are bfloat16 but whose ops the CPU
provider runs in bfloat16 (Cast, Concat, Gather) drives tfgraph's onnxruntime steppers: each
step's next token is the sum of the row's tokens so far (prompt and generated; the cache holds
them, the mask leaves the padding out) modulo the vocabulary, so a cache handed back wrong, a
row selected wrong or logits read wrong changes the tokens. The same model with a float32
cache and logits runs through the float32 paths as a second reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from tfgraph.exporters.generation.cached_steppers import onnx_cached
from tfgraph.exporters.onnx import bfloat16
from tfgraph.exporters.onnx.runtime import run_all
from tfgraph.generation.loop import generate
from tfgraph.generation.sampling import Sampler

ort = pytest.importorskip("onnxruntime")

VOCAB, KV_HEADS, WIDTH, LAYERS = 32, 2, 4, 2
LOW, HIGH = -2.0, 3.5  # the logits: HIGH at the next token, LOW elsewhere (exact in bfloat16)


def shared_constants() -> list[Any]:
    """The initializers both summing models read: unsqueeze axes, one, the cache's head
    shape, the vocabulary and the logits' two values."""
    return [helper.make_tensor("axes13", TensorProto.INT64, [2], [1, 3]),
            helper.make_tensor("one", TensorProto.INT64, [1], [1]),
            helper.make_tensor("heads", TensorProto.INT64, [4], [1, KV_HEADS, 1, WIDTH]),
            helper.make_tensor("vocab", TensorProto.INT64, [], [VOCAB]),
            helper.make_tensor("onoff", TensorProto.FLOAT, [2], [LOW, HIGH])]


def summing_model(elem: int) -> Any:
    """The KV-cache model of the module docstring with a cache and logits of ONNX type
    ``elem`` (BFLOAT16 or FLOAT)."""
    vi, node = helper.make_tensor_value_info, helper.make_node
    consts = shared_constants()
    nodes = [node("Cast", ["input_ids"], ["idsf"], to=TensorProto.FLOAT),
             node("Unsqueeze", ["idsf", "axes13"], ["ids4"]),  # (b, 1, s, 1)
             node("Expand", ["ids4", "heads"], ["newf"]),  # (b, kv, s, width)
             node("Cast", ["newf"], ["new"], to=elem),
             node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT)]
    inputs = [vi("input_ids", TensorProto.INT64, ["b", "s"]),
              vi("attention_mask", TensorProto.INT64, ["b", "t"]),
              vi("position_ids", TensorProto.INT64, ["b", "s"])]
    outputs, scores = [], []
    for layer in range(LAYERS):
        for part in ("key", "value"):
            past, present = f"past_key_values.{layer}.{part}", f"present.{layer}.{part}"
            inputs.append(vi(past, elem, ["b", KV_HEADS, "p", WIDTH]))
            outputs.append(vi(present, elem, ["b", KV_HEADS, "t", WIDTH]))
            nodes += [node("Concat", [past, "new"], [present], axis=2),
                      node("Cast", [present], [f"{present}.f"], to=TensorProto.FLOAT),
                      node("ReduceMean", [f"{present}.f", "axes13"], [f"{present}.m"],
                           keepdims=0),  # (b, t): each position's token
                      node("Mul", [f"{present}.m", "maskf"], [f"{present}.x"]),
                      node("ReduceSum", [f"{present}.x", "one"], [f"{present}.s"])]  # (b, 1)
            scores.append(f"{present}.s")
    # every part holds the same tokens: their mean is the sum of the row's tokens
    nodes += [node("Sum", scores, ["total"]),
              node("Div", ["total", "parts"], ["summed"]),
              node("Cast", ["summed"], ["summedi"], to=TensorProto.INT64),
              node("Mod", ["summedi", "vocab"], ["next"]),
              node("OneHot", ["next", "vocab", "onoff"], ["hot"], axis=-1),  # (b, 1, V)
              node("Cast", ["hot"], ["logits"], to=elem)]
    consts.append(helper.make_tensor("parts", TensorProto.FLOAT, [], [2.0 * LAYERS]))
    graph = helper.make_graph(nodes, "summing", inputs,
                              [vi("logits", elem, ["b", 1, VOCAB]), *outputs], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def session(elem: int) -> Any:
    return ort.InferenceSession(summing_model(elem).SerializeToString(),
                                providers=["CPUExecutionProvider"])


def expected(prompt: list[int], new: int, eos: set[int]) -> list[int]:
    """The tokens the summing model generates, computed here."""
    seen, out = list(prompt), []
    while len(out) < new:
        token = sum(seen) % VOCAB
        out.append(token)
        seen.append(token)
        if token in eos:
            break
    return out


PROMPTS = [[3, 9, 1, 20, 7], [30], [5, 5, 2], [17, 1]]


@pytest.mark.parametrize("bind", [True, False])
def test_a_bfloat16_cache_generates_the_summing_models_tokens(bind: bool) -> None:
    eos = {0, 4, 8, 12}  # rows leave the batch at different steps: their cache rows go
    stepper = onnx_cached(session(TensorProto.BFLOAT16), VOCAB, None, bind=bind)
    result = generate(stepper, PROMPTS, 12, Sampler(None, None, None, None), 1, eos)
    want = [expected(p, 12, eos) for p in PROMPTS]
    assert result.tokens == want
    assert len({len(t) for t in want}) > 1  # rows really left at different steps
    if bind:  # the cache stayed bfloat16 OrtValues (never a numpy array)
        assert all(v.data_type() == bfloat16.TYPE for v in stepper.past.values())


def test_bfloat16_beams_equal_the_float32_models() -> None:
    sampler = Sampler(None, None, None, None)
    tokens = {}
    for elem in (TensorProto.BFLOAT16, TensorProto.FLOAT):
        stepper = onnx_cached(session(elem), VOCAB, None)
        tokens[elem] = generate(stepper, PROMPTS, 6, sampler, 3, {0, 4}).tokens
    assert tokens[TensorProto.BFLOAT16] == tokens[TensorProto.FLOAT]
    assert tokens[TensorProto.FLOAT][0][:1] == expected(PROMPTS[0], 1, set())


def test_bfloat16_outputs_of_run_all_are_float32_and_feed_back() -> None:
    """``run_all`` (``tfgraph run``, --no-cache, the unbound stepper, encoder-decoders):
    bfloat16 outputs come back as float32 and a float32 cache is fed to bfloat16 inputs."""
    s = session(TensorProto.BFLOAT16)
    empty = np.zeros((2, KV_HEADS, 0, WIDTH), np.float32)
    feeds = {"input_ids": np.array([[1, 2], [0, 6]]), "attention_mask": np.array([[1, 1], [0, 1]]),
             "position_ids": np.array([[0, 1], [0, 0]]),
             **{i.name: empty for i in s.get_inputs() if i.name.startswith("past")}}
    out = run_all(s, feeds)
    assert out[0].dtype == np.float32 and out[0].shape == (2, 1, VOCAB)
    assert out[0][0, 0, 3] == HIGH and out[0][1, 0, 6] == HIGH
    assert out[0][0, 0, 0] == LOW
    assert out[1].dtype == np.float32
    assert out[1][:, 0, :, 0].tolist() == [[1, 2], [0, 6]]


def test_widening_and_narrowing_agree_with_torchs_bfloat16() -> None:
    values = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 1e3
    values = torch.cat([values, torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-40])])
    bits = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    # narrowing float32 rounds to nearest even, as torch's conversion does
    assert np.array_equal(bfloat16.narrow(values.numpy()), bits)
    widened = bfloat16.widen(bits)
    assert np.array_equal(widened, values.to(torch.bfloat16).float().numpy())
    assert np.array_equal(bfloat16.narrow(widened), bits)  # exact both ways
    assert np.isnan(bfloat16.widen(bfloat16.narrow(np.array([np.nan], np.float32))))[0]


def test_tfgraph_run_prints_a_bfloat16_models_logits(tmp_path: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``tfgraph run MODEL.onnx`` of a bfloat16 model (logits a bfloat16 table's rows, which
    the CPU provider gathers): the run needs the CUDA provider, whose refusal on the CPU
    (create_session) is lifted here for the one model the CPU can run; what follows is the
    command's own path, which read the logits through numpy ("No corresponding Numpy type")."""
    from click.testing import CliRunner

    from tfgraph.cli import main
    from tfgraph.exporters.onnx import runtime as rt

    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(1))
    bits = table.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    weight = helper.make_tensor("table", TensorProto.BFLOAT16, [VOCAB, VOCAB],
                                bits.tobytes(), raw=True)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["logits"], axis=0)], "rows",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.BFLOAT16,
                                       ["batch", "seq", VOCAB])], [weight])
    path = tmp_path / "rows.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                                       ir_version=10).SerializeToString())
    create = rt.create_session
    monkeypatch.setattr(rt, "create_session", lambda *a, **k: create(*a, **{**k,
                                                                         "dtype": "float32"}))
    result = CliRunner().invoke(main, ["run", str(path), "--provider", "cpu", "--seq", "6",
                                       "--repeat", "2"])
    assert result.exit_code == 0, result.output
    assert f"-> logits bfloat16[1, 6, {VOCAB}]" in result.output
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = rt.random_ids(rt.interface(rt.load_model(path), str(path)), 1, 6)
    logits = rt.run(session, ids)  # what the command ran
    assert logits.dtype == np.float32
    assert np.array_equal(logits[0], table.to(torch.bfloat16).float().numpy()[ids["input_ids"][0]])


def _tokens_as_cache(ids: str, out: str, elem: int, nodes: list[Any]) -> None:
    """Nodes making ``out``, (b, KV_HEADS, s, WIDTH) of type ``elem``, every entry of
    position j the token ``ids[:, j]``."""
    node = helper.make_node
    nodes += [node("Cast", [ids], [f"{out}.f"], to=TensorProto.FLOAT),
              node("Unsqueeze", [f"{out}.f", "axes13"], [f"{out}.4"]),
              node("Expand", [f"{out}.4", "heads"], [f"{out}.e"]),
              node("Cast", [f"{out}.e"], [out], to=elem)]


def _masked_sum(cache: str, mask: str, nodes: list[Any]) -> str:
    """Nodes summing the tokens a cache of :func:`_tokens_as_cache` holds where ``mask``."""
    node = helper.make_node
    nodes += [node("Cast", [cache], [f"{cache}.f"], to=TensorProto.FLOAT),
              node("ReduceMean", [f"{cache}.f", "axes13"], [f"{cache}.m"], keepdims=0),
              node("Cast", [mask], [f"{mask}.{cache}.f"], to=TensorProto.FLOAT),
              node("Mul", [f"{cache}.m", f"{mask}.{cache}.f"], [f"{cache}.x"]),
              node("ReduceSum", [f"{cache}.x", "one"], [f"{cache}.s"])]
    return f"{cache}.s"


def summing_seq2seq(elem: int) -> tuple[Any, Any]:
    """An encoder-decoder pair in onnx_seq2seq's interface: the encoder's cross keys and
    values hold the source tokens, the decoder's cache the target's; the next token is the
    sum of the real source tokens and the target's so far, modulo the vocabulary."""
    vi, node = helper.make_tensor_value_info, helper.make_node
    consts = shared_constants()
    def cache(length: str) -> list[Any]:
        return ["b", KV_HEADS, length, WIDTH]

    encoder_nodes: list[Any] = [node("Cast", ["src_ids"], ["last_hidden_state"],
                                     to=TensorProto.FLOAT)]
    _tokens_as_cache("src_ids", "present.0.encoder.key", elem, encoder_nodes)
    encoder_nodes.append(node("Identity", ["present.0.encoder.key"],
                              ["present.0.encoder.value"]))
    encoder = helper.make_graph(
        encoder_nodes, "encoder", [vi("src_ids", TensorProto.INT64, ["b", "s"]),
                                   vi("attention_mask", TensorProto.INT64, ["b", "s"])],
        [vi("last_hidden_state", TensorProto.FLOAT, ["b", "s"]),
         vi("present.0.encoder.key", elem, cache("s")),
         vi("present.0.encoder.value", elem, cache("s"))],
        [consts[0], consts[2]])  # axes13, heads
    nodes: list[Any] = []
    _tokens_as_cache("input_ids", "new", elem, nodes)
    nodes += [node("Concat", [f"past_key_values.0.decoder.{p}", "new"],
                   [f"present.0.decoder.{p}"], axis=2) for p in ("key", "value")]
    target = _masked_sum("present.0.decoder.key", "attention_mask", nodes)
    source = _masked_sum("past_key_values.0.encoder.value", "encoder_attention_mask", nodes)
    nodes += [node("Add", [target, source], ["total"]),
              node("Cast", ["total"], ["totali"], to=TensorProto.INT64),
              node("Mod", ["totali", "vocab"], ["next"]),
              node("OneHot", ["next", "vocab", "onoff"], ["hot"], axis=-1),
              node("Cast", ["hot"], ["logits"], to=elem)]
    decoder = helper.make_graph(
        nodes, "decoder",
        [vi("input_ids", TensorProto.INT64, ["b", "s"]),
         vi("attention_mask", TensorProto.INT64, ["b", "t"]),
         vi("encoder_attention_mask", TensorProto.INT64, ["b", "e"]),
         *[vi(f"past_key_values.0.{side}.{p}", elem, cache(length))
           for side, length in (("decoder", "p"), ("encoder", "e")) for p in ("key", "value")]],
        [vi("logits", elem, ["b", 1, VOCAB]),
         *[vi(f"present.0.decoder.{p}", elem, cache("t")) for p in ("key", "value")]], consts)
    return tuple(ort.InferenceSession(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)],
                          ir_version=10).SerializeToString(), providers=["CPUExecutionProvider"])
        for g in (encoder, decoder))


def test_a_bfloat16_encoder_decoder_generates_the_summing_models_tokens() -> None:
    from tfgraph.exporters.generation.cached_steppers import onnx_seq2seq

    eos = {0, 4, 8}
    got = {}
    for elem in (TensorProto.BFLOAT16, TensorProto.FLOAT):
        encoder, decoder = summing_seq2seq(elem)
        stepper = onnx_seq2seq(encoder, decoder, VOCAB, None, decoder_start=1)
        got[elem] = generate(stepper, PROMPTS, 10, Sampler(None, None, None, None), 1,
                             eos).tokens
    want = []
    for prompt in PROMPTS:  # the target starts with the decoder start token, 1
        seen, out = sum(prompt) + 1, []
        while len(out) < 10 and (not out or out[-1] not in eos):
            out.append(seen % VOCAB)
            seen += out[-1]
        want.append(out)
    assert got[TensorProto.BFLOAT16] == got[TensorProto.FLOAT] == want
    assert len({len(t) for t in want}) > 1  # rows left the batch at different steps
