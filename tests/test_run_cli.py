"""``tfgraph run``: specs and .onnx files, provider choice, timing lines, --check, bad models."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

import tfgraph
from tfgraph.cli import main
from tfgraph.errors import TfgraphError
from tfgraph.exporters.onnx import runtime as rt
from tfgraph.exporters.onnx.model import write_onnx

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"


def cli(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def lines(text: str) -> dict[str, str]:
    return {line.split()[0]: line for line in text.splitlines()}


def test_run_spec_prints_provider_latency_and_throughput() -> None:
    result = cli("run", str(SPECS / "tiny.yaml"), "--batch", "2", "--seq", "6", "--tgt-seq", "4",
                 "--repeat", "3", "--provider", "cpu")
    assert result.exit_code == 0, result.stderr
    out = lines(result.stdout)
    assert out["provider"] == "provider  CPUExecutionProvider (requested)"
    assert "src_ids int64[2, 6], tgt_ids int64[2, 4] -> logits float32[2, 4, 101]" in out["inputs"]
    assert re.fullmatch(r"latency   median [\d.]+ ms, p90 [\d.]+ ms over 3 runs \(1 warm-up\)",
                        out["latency"])
    assert re.fullmatch(r"throughput [\d,]+ tokens/s \(20 input tokens per run\)",
                        out["throughput"])
    assert "check" not in out


def test_run_spec_check_against_torch() -> None:
    result = cli("run", str(SPECS / "tiny-llama.yaml"), "--seq", "9", "--repeat", "1",
                 "--check", "--opset", "17")
    assert result.exit_code == 0, result.stderr
    check = lines(result.stdout)["check"]
    diff = float(re.search(r"= ([\d.e+-]+) ", check).group(1))  # type: ignore[union-attr]
    assert diff <= 1e-4 and check.endswith("(tolerance 0.0001, float32): ok")


def test_run_model_file_and_check_uses_its_weights(tmp_path: Path) -> None:
    graph = tfgraph.compile(SPECS / "tiny-seq2seq.yaml")
    path = write_onnx(graph, tmp_path / "m.onnx", seed=5)  # not run's default seed 0
    result = cli("run", str(path), "--batch", "3", "--seq", "5", "--repeat", "2", "--check")
    assert result.exit_code == 0, result.stderr
    out = lines(result.stdout)
    assert out["model"] == f"model     {path}"
    assert "-> logits float32[3, 5, 90]" in out["inputs"]
    assert out["check"].endswith("ok")


def test_check_failure_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose weights differ from what the torch side is given must fail --check."""
    from tfgraph.commands import run as run_cmd

    real = run_cmd._torch_logits
    monkeypatch.setattr(run_cmd, "_torch_logits", lambda graph, weights, seed, feeds: real(
        graph, {k: v * 1.01 for k, v in weights.items()}, seed, feeds))
    result = cli("run", str(SPECS / "tiny.yaml"), "--seq", "4", "--repeat", "1", "--check")
    assert result.exit_code == 1
    assert lines(result.stdout)["check"].endswith("FAILED")


def test_corrupt_onnx_file_exit_2_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf \xff\xfe" * 10)
    result = cli("run", str(bad))
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"{bad}: not a readable ONNX model")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    result = cli("run", str(empty))
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    result = cli("run", str(tmp_path / "missing.onnx"))
    assert result.exit_code == 2 and "no such file" in result.stderr


def test_foreign_onnx_model_exit_2(tmp_path: Path) -> None:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["pixels"], ["y"])], "cnn",
                              [vi("pixels", TensorProto.FLOAT, [1, 3])],
                              [vi("y", TensorProto.FLOAT, [1, 3])])
    path = tmp_path / "foreign.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), str(path))
    result = cli("run", str(path))
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "not a tfgraph model: inputs ['pixels']" in line


def test_bfloat16_on_cpu_is_a_clear_error() -> None:
    result = cli("run", str(SPECS / "tiny-bf16.yaml"), "--provider", "cpu")
    assert result.exit_code == 2
    assert "no bfloat16 kernels" in result.stderr and len(result.stderr.splitlines()) == 1


def test_sequence_longer_than_learned_positions_exit_2() -> None:
    result = cli("run", str(SPECS / "tiny-decoder.yaml"), "--seq", "65")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "--seq 65: longer than tiny-decoder's max_len 64: its learned position table has no "
        "row past max_len")


def test_provider_cuda_follows_what_is_really_usable() -> None:
    usable, why = rt.cuda_status()
    result = cli("run", str(SPECS / "tiny.yaml"), "--seq", "4", "--repeat", "1",
                 "--provider", "cuda")
    if usable:
        assert result.exit_code == 0 and "CUDAExecutionProvider" in result.stdout
    else:
        assert result.exit_code == 2
        assert result.stderr.startswith("--provider cuda: the CUDA execution provider is not "
                                        "usable here")
        auto = cli("run", str(SPECS / "tiny.yaml"), "--seq", "4", "--repeat", "1")
        assert f"CPUExecutionProvider (auto: {why})" in auto.stdout


def test_choose_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rt, "cuda_status", lambda: (True, "CUDA session created"))
    assert rt.choose_providers("auto") == ([rt.CUDA, rt.CPU], "auto: CUDA is usable")
    assert rt.choose_providers("cpu") == ([rt.CPU], "requested")
    monkeypatch.setattr(rt, "cuda_status", lambda: (False, "no GPU"))
    assert rt.choose_providers("auto") == ([rt.CPU], "auto: no GPU")
    with pytest.raises(TfgraphError, match="not usable here"):
        rt.choose_providers("cuda")


def test_run_spec_over_the_protobuf_limit_goes_through_external_data(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Specs whose weights pass ~1.8 GB are written to a temporary .onnx + .data pair first
    (a threshold of 0 bytes sends the tiny spec down that path)."""
    from tfgraph.exporters.onnx import model as onnx_model

    monkeypatch.setattr(onnx_model, "EXTERNAL_DATA_THRESHOLD", 0)
    result = cli("run", str(SPECS / "tiny-seq2seq.yaml"), "--seq", "5", "--repeat", "1",
                 "--check")
    assert result.exit_code == 0, result.stderr
    assert lines(result.stdout)["check"].endswith("ok")


def test_check_on_a_model_without_its_spec_exit_2_before_running(tmp_path: Path) -> None:
    """A model with tfgraph's interface but no stored spec (e.g. torch.onnx.export's) runs,
    but --check cannot rebuild the torch side: one line, exit 2, nothing timed first."""
    graph = tfgraph.compile(SPECS / "tiny.yaml")
    path = write_onnx(graph, tmp_path / "m.onnx")
    model = onnx.load(str(path))
    del model.metadata_props[:]
    onnx.save(model, str(path))
    assert cli("run", str(path), "--seq", "4", "--repeat", "1").exit_code == 0
    result = cli("run", str(path), "--seq", "4", "--repeat", "1", "--check")
    assert result.exit_code == 2 and result.stdout == ""
    assert "--check needs the spec" in result.stderr


def test_check_switches_tf32_off_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24 item 5: ``run --check`` compares like with like. The CUDA provider gets
    ``use_tf32=0`` (its float32 matmuls otherwise run in TF32 against a float32 reference) and
    the check line says so; without --check, onnxruntime's defaults stand. Built and tested
    without a GPU: the options, and what run asks create_session for."""
    from tfgraph.commands.run import check_note

    assert rt.provider_options([rt.CUDA, rt.CPU], tf32=False) == [{"use_tf32": "0"}, {}]
    assert rt.provider_options([rt.CUDA, rt.CPU]) == [{}, {}]
    assert rt.provider_options([rt.CPU], tf32=False) == [{}]
    assert "TF32 off in onnxruntime (use_tf32=0) and in torch" in check_note(rt.CUDA,
                                                                             "float32")
    assert check_note(rt.CUDA, "float16") == "" and check_note(rt.CPU, "float32") == ""
    from tfgraph.exporters import to_onnx

    model = to_onnx(tfgraph.compile(SPECS / "tiny-llama.yaml"), seed=0)
    session, ran, _ = rt.create_session(model.SerializeToString(), "cpu", tf32=False)
    assert ran == rt.CPU and session.get_providers() == [rt.CPU]
    asked: list[bool] = []
    real = rt.create_session

    def spy(*args: object, **kwargs: object) -> object:
        asked.append(bool(kwargs.get("tf32", True)))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rt, "create_session", spy)
    spec = str(SPECS / "tiny-llama.yaml")
    for flags in (["--check"], []):
        result = CliRunner().invoke(main, ["run", spec, "--provider", "cpu", "--seq", "8",
                                           "--repeat", "1", *flags])
        assert result.exit_code == 0, result.output
    assert asked == [False, True]


def test_run_checks_memory_at_the_length_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory check before the build uses the default length (128, or max_len when
    smaller: tiny-decoder's 64), not 128: a model with a short max_len was refused at sizes it
    never runs."""
    from tfgraph.commands import run as run_command

    asked: list[str] = []

    def record(what: str, need: float) -> None:
        asked.append(what)

    monkeypatch.setattr(run_command, "check_memory", record)
    result = cli("run", str(SPECS / "tiny-decoder.yaml"), "--batch", "3", "--repeat", "1")
    assert result.exit_code == 0, result.output
    assert asked and all(a == "--batch 3 x --seq 64" for a in asked), asked


def test_run_refuses_opset_for_a_built_model(tmp_path: Path) -> None:
    """--opset builds a spec; on an .onnx file it would do nothing, so it is refused."""
    model = tmp_path / "m.onnx"
    built = cli("build", str(SPECS / "tiny.yaml"), "--to", "onnx", "-o", str(model))
    assert built.exit_code == 0, built.output
    result = CliRunner().invoke(main, ["run", str(model), "--opset", "17"])
    assert result.exit_code == 2
    assert "--opset" in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert cli("run", str(model), "--repeat", "1").exit_code == 0
