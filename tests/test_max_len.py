"""Learned positions stop at ``max_len``: a longer input is an error naming ``max_len`` in both
back ends, never a silent broadcast of the table's rows (README.md, "Spec reference": ``max_len`` is the longest
sequence; a one-row table would otherwise be added to every position).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

import tfgraph
from tfgraph.exporters import to_onnx, to_torch
from tfgraph.spec.schema import Spec


def _spec(max_len: int, arch: str = "decoder-only") -> Spec:
    return Spec.model_validate({
        "name": "learned", "arch": arch, "d_model": 16, "layers": 1, "vocab": 13,
        "max_len": max_len, "embedding": {"positions": "learned"}, "attention": {"heads": 2},
        "dropout": 0.0,
    })


def _ids(*shape: int) -> torch.Tensor:
    return torch.arange(int(np.prod(shape))).reshape(shape) % 13


def _session(spec: Spec, opset: int = 23) -> Any:
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the failures below are expected: keep the log quiet
    model = to_onnx(tfgraph.compile(spec), seed=0, opset=opset)
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


# ---- PyTorch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("max_len, length", [(1, 1), (4, 4), (4, 3)])
def test_torch_lengths_up_to_max_len_run(max_len: int, length: int) -> None:
    module = to_torch(tfgraph.compile(_spec(max_len)))
    with torch.no_grad():
        assert module(_ids(2, length)).shape == (2, length, 13)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("max_len, length", [(1, 2), (1, 3), (4, 5), (4, 6)])
def test_torch_longer_than_max_len_is_an_error_naming_max_len(max_len: int, length: int,
                                                              grad: bool) -> None:
    """Catches: ``table[:L]`` returning fewer rows (a (1, d) slice broadcasts over every
    position with max_len 1; a shape error that does not say why for max_len 4), in the
    inference path (no_grad, in-place adds) and the training path alike."""
    module = to_torch(tfgraph.compile(_spec(max_len)))
    if grad:
        module.train()
    with torch.set_grad_enabled(grad), pytest.raises(Exception, match="max_len") as err:
        module(_ids(2, length))
    assert f"max_len {max_len}" in str(err.value) and str(length) in str(err.value)


@pytest.mark.parametrize("src, tgt", [(6, 3), (3, 6)])
def test_torch_encoder_decoder_checks_each_stack(src: int, tgt: int) -> None:
    """Both stacks have their own table: either sequence past max_len fails."""
    module = to_torch(tfgraph.compile(_spec(4, "encoder-decoder")))
    with torch.no_grad():
        assert module(_ids(1, 4), _ids(1, 4)).shape == (1, 4, 13)
        with pytest.raises(Exception, match="max_len 4"):
            module(_ids(1, src), _ids(1, tgt))


def test_torch_max_len_1_one_token_is_the_first_row() -> None:
    """The one row is used at position 0 (not skipped, not broadcast past the input)."""
    graph = tfgraph.compile(_spec(1))
    module = to_torch(graph, seed=3)
    zero = {n: torch.zeros_like(t) if n == "decoder.positions.weight" else t
            for n, t in module.state_dict().items()}
    without = to_torch(graph, weights=zero)
    with torch.no_grad():
        assert not torch.equal(module(_ids(1, 1)), without(_ids(1, 1)))


# ---- ONNX (onnxruntime) ----------------------------------------------------------------------


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("max_len, length", [(1, 1), (4, 4), (4, 2)])
def test_onnx_lengths_up_to_max_len_run_and_match_torch(opset: int, max_len: int,
                                                        length: int) -> None:
    spec = _spec(max_len)
    ids = _ids(2, length)
    out = _session(spec, opset).run(None, {"input_ids": ids.numpy()})[0]
    with torch.no_grad():
        ref = to_torch(tfgraph.compile(spec), seed=0)(ids).numpy()
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("max_len, length", [(1, 2), (1, 3), (4, 5), (4, 6)])
def test_onnx_longer_than_max_len_is_an_error_naming_max_len(opset: int, max_len: int,
                                                             length: int) -> None:
    """Catches: Slice(table, 0, L) silently returning min(L, max_len) rows, which Add would
    broadcast (max_len 1: the same row added at every position, and a result with no error).
    onnxruntime's message names the failing node, whose name carries max_len."""
    session = _session(_spec(max_len), opset)
    with pytest.raises(Exception, match=f"max_len {max_len}"):
        session.run(None, {"input_ids": _ids(2, length).numpy()})


@pytest.mark.parametrize("src, tgt", [(6, 3), (3, 6)])
def test_onnx_encoder_decoder_checks_each_stack(src: int, tgt: int) -> None:
    session = _session(_spec(4, "encoder-decoder"))
    ok = session.run(None, {"src_ids": _ids(1, 4).numpy(), "tgt_ids": _ids(1, 4).numpy()})[0]
    assert ok.shape == (1, 4, 13)
    with pytest.raises(Exception, match="max_len 4"):
        session.run(None, {"src_ids": _ids(1, src).numpy(), "tgt_ids": _ids(1, tgt).numpy()})
