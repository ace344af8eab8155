"""Weights that cannot fit in memory are refused before anything is allocated (one line,
exit 2 from the CLI; TfgraphError from the Python API) by every path that materialises them:
to_torch, to_onnx, ``run`` (build + session), ``generate`` (torch and onnx back ends, an ONNX
file run through torch), ``--weights`` files. The huge specs here need about a terabyte:
nothing is ever allocated for them (the refusal comes from the parameters' shapes), and the
estimates must not refuse models that fit (the 1.1B TinyLlama benchmark on a 23 GB machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_support import refused
from cli_support import tfgraph as cli

ROOT = Path(__file__).resolve().parent.parent
TINY_LLAMA = ROOT / "specs" / "tiny-llama.yaml"


def huge_spec(tmp_path: Path) -> Path:
    """tiny-llama with d_model 262,144 and a million tokens: its token table alone is
    1.05 TB in float32 (the whole model about 3 TB)."""
    text = TINY_LLAMA.read_text()
    assert "d_model: 64\n" in text and "vocab: 256\n" in text
    path = tmp_path / "huge.yaml"
    path.write_text(text.replace("d_model: 64\n", "d_model: 262144\n")
                    .replace("vocab: 256\n", "vocab: 1000000\n"))
    return path


@pytest.mark.parametrize("args, words", [
    (("generate", "--prompt-ids", "1", "--max-new-tokens", "1", "--backend", "torch"),
     ("the torch module",)),
    (("generate", "--prompt-ids", "1", "--max-new-tokens", "1", "--backend", "onnx"),
     ("the onnxruntime session",)),
    (("run", "--seq", "4"), ("the onnxruntime session",)),
    (("run", "--seq", "4", "--check"), ("the onnxruntime session and the --check torch",)),
])
def test_cli_refuses_weights_past_memory_at_once(tmp_path: Path, args: tuple[str, ...],
                                                 words: tuple[str, ...]) -> None:
    """A terabyte of weights: one line naming the estimate, exit 2, no temporary ONNX file
    started (``run`` wrote 1.6 GB of one in 17 s; ``generate`` ended in a MemoryError)."""
    command, *rest = args
    result = cli(command, str(huge_spec(tmp_path)), *rest, timeout=120)
    line = refused(result, *words, "for the weights", "GB available")
    assert "needs about" in line, line


@pytest.mark.parametrize("args, words", [
    (("run", "--seq", "4", "--repeat", "1"), "the onnxruntime session: needs about"),
    (("run", "--seq", "4", "--repeat", "1", "--check"),
     "the onnxruntime session and the --check torch reference: needs about"),
    (("generate", "--prompt-ids", "1", "--max-new-tokens", "1", "--backend", "onnx"),
     "the onnxruntime session: needs about"),
])
def test_weights_past_memory_are_refused_though_inputs_fit(
        monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], words: str) -> None:
    """The weights alone past the memory available, while the inputs, activations, KV cache
    and logits (the checks there were) fit: ``run`` built the model and opened a session
    anyway (a 36 GB model on a 23 GB machine passed the disk check and was being written);
    refused now, and run with room for the estimate."""
    from click.testing import CliRunner

    import tfgraph
    from tfgraph import io
    from tfgraph.cli import main
    from tfgraph.exporters.onnx.model import session_bytes
    from tfgraph.passes.cost import weights_bytes

    graph = tfgraph.compile(tfgraph.load_spec(TINY_LLAMA))
    monkeypatch.setattr(io, "available_memory", lambda: weights_bytes(graph))
    command, *rest = args
    result = CliRunner().invoke(main, [command, str(TINY_LLAMA), *rest])
    assert result.exit_code == 2, result.output
    assert words in result.output and "for the weights" in result.output, result.output
    room = 10 * session_bytes(graph, given=False)  # the torch reference's share included
    monkeypatch.setattr(io, "available_memory", lambda: room)
    result = CliRunner().invoke(main, [command, str(TINY_LLAMA), *rest])
    assert result.exit_code == 0, result.output


def test_api_refuses_before_allocating(tmp_path: Path) -> None:
    import tfgraph
    from tfgraph.errors import TfgraphError
    from tfgraph.exporters import to_onnx, to_torch

    graph = tfgraph.compile(tfgraph.load_spec(huge_spec(tmp_path)))
    with pytest.raises(TfgraphError, match="the torch module: needs about .* for the weights"):
        to_torch(graph)
    with pytest.raises(TfgraphError, match="the ONNX model: needs about .* for the weights"):
        to_onnx(graph)
    with pytest.raises(TfgraphError, match="for the weights"):
        to_torch(graph, weights={})  # given weights: the module's own copy is too large
    assert to_torch(graph, device="meta") is not None  # meta: nothing allocated, not refused


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_refused_exactly_when_the_estimate_passes_available(
        monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """The boundary: built with exactly the estimated memory available, refused one byte
    short of it (the estimates: torch_build_bytes, onnx_build_bytes)."""
    import tfgraph
    from tfgraph import io
    from tfgraph.errors import TfgraphError
    from tfgraph.exporters import to_onnx, to_torch
    from tfgraph.exporters.onnx.model import onnx_build_bytes
    from tfgraph.exporters.torch.module import torch_build_bytes
    from tfgraph.passes.cost import weights_bytes

    spec = tfgraph.load_spec(TINY_LLAMA).model_copy(update={"dtype": dtype})
    graph = tfgraph.compile(spec)
    for build, need in ((to_torch, torch_build_bytes(graph, given=False)),
                        (to_onnx, onnx_build_bytes(graph, given=False))):
        assert need >= weights_bytes(graph)
        monkeypatch.setattr(io, "available_memory", lambda: need)
        build(graph)
        monkeypatch.setattr(io, "available_memory", lambda: need - 1)
        with pytest.raises(TfgraphError, match="only .* available"):
            build(graph)
    # generated 16-bit weights pass through float32 first: 3x the weights (measured)
    factor = 1 if dtype == "float32" else 3
    assert torch_build_bytes(graph, given=False) == factor * weights_bytes(graph)


def test_llama_benchmark_is_not_refused_on_a_23_gb_machine() -> None:
    """specs/llama.yaml (1.1B parameters, 4.4 GB in float32) builds on this 23 GB machine:
    every estimate stays well under it (ONNX past 2 GiB goes through external data)."""
    import tfgraph
    from tfgraph.exporters.onnx.model import onnx_build_bytes, session_bytes
    from tfgraph.exporters.torch.module import torch_build_bytes
    from tfgraph.passes.cost import weights_bytes

    graph = tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / "llama.yaml"))
    weights = weights_bytes(graph)
    assert 4.3e9 < weights < 4.5e9
    for need in (torch_build_bytes(graph, given=False), torch_build_bytes(graph, given=True),
                 session_bytes(graph, given=False), session_bytes(graph, given=True)):
        assert weights <= need < 6e9, need
    assert onnx_build_bytes(graph, given=False) < 6e9


def test_weights_file_is_refused_before_reading(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--weights FILE: what reading it holds (from its header) checked before the read."""
    from click.testing import CliRunner

    import tfgraph
    from tfgraph import io
    from tfgraph.cli import main
    from tfgraph.graph.weights import generate, save_weights

    graph = tfgraph.compile(tfgraph.load_spec(TINY_LLAMA))
    weights = tmp_path / "w.safetensors"
    save_weights(generate(graph, 0), str(weights))
    monkeypatch.setattr(io, "available_memory", lambda: 1000)
    result = CliRunner().invoke(main, ["build", str(TINY_LLAMA), "--to", "onnx", "--weights",
                                       str(weights), "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 2, result.output
    assert "w.safetensors: reading the weights: needs about" in result.output, result.output
    assert not (tmp_path / "m.onnx").exists()


def test_onnx_file_through_torch_checks_its_weights(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """generate MODEL.onnx --backend torch reads the file's weights as float32 and copies
    them into a module: refused before the read when that cannot fit (the decoding itself
    fits: its KV cache and logits are a few KB)."""
    from click.testing import CliRunner

    import tfgraph
    from tfgraph import io
    from tfgraph.cli import main
    from tfgraph.passes.cost import weights_bytes

    model = tmp_path / "m.onnx"
    built = CliRunner().invoke(main, ["build", str(TINY_LLAMA), "--to", "onnx", "-o",
                                      str(model)])
    assert built.exit_code == 0, built.output
    weights = weights_bytes(tfgraph.compile(tfgraph.load_spec(TINY_LLAMA)))
    monkeypatch.setattr(io, "available_memory", lambda: 2 * weights)  # short of 3x + float32
    result = CliRunner().invoke(main, ["generate", str(model), "--prompt-ids", "1",
                                       "--max-new-tokens", "1", "--backend", "torch"])
    assert result.exit_code == 2, result.output
    assert "its weights in torch: needs about" in result.output, result.output
    monkeypatch.setattr(io, "available_memory", lambda: 10**11)
    result = CliRunner().invoke(main, ["generate", str(model), "--prompt-ids", "1",
                                       "--max-new-tokens", "1", "--backend", "torch"])
    assert result.exit_code == 0, result.output
