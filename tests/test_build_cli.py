"""``tfgraph build``: targets, defaults, the closing line, weights files and atomic output."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

import tfgraph
from tfgraph.passes import cost
from tfgraph.cli import main
from tfgraph.exporters.onnx import model as onnx_model
from tfgraph.exporters.onnx import writer as onnx_writer
from tfgraph.graph.weights import generate, save_weights

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "specs" / "tiny.yaml")
TINY_DECODER = str(ROOT / "specs" / "tiny-decoder.yaml")


def cli(*args: str, catch: bool = False):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=catch)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def initializers(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def test_default_output_and_closing_line(in_tmp: Path) -> None:
    result = cli("build", TINY, "--to", "onnx")
    assert result.exit_code == 0, result.stderr
    out = in_tmp / "build" / "tiny.onnx"
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    params = sum(int(np.prod(p.attrs["shape"])) for p in tfgraph.compile(TINY).params())
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"wrote {Path('build') / 'tiny.onnx'} (")
    assert f"{params:,} params" in line and "opset 23" in line and "seed 0" in line
    size_kb = out.stat().st_size / 1000
    assert f"{size_kb:.1f} KB" in line
    assert model.opset_import[0].version == 23
    assert result.stderr == ""


def test_output_opset_and_seed(in_tmp: Path) -> None:
    result = cli("build", TINY_DECODER, "--to", "onnx", "-o", "m17.onnx", "--opset", "17",
                 "--seed", "9")
    assert result.exit_code == 0, result.stderr
    model = onnx.load("m17.onnx")
    assert model.opset_import[0].version == 17 and "opset 17" in result.stdout
    assert not {n.op_type for n in model.graph.node} & {"Attention", "Gelu"}
    want = generate(tfgraph.compile(TINY_DECODER), 9)
    got = initializers(in_tmp / "m17.onnx")
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


def test_weights_file_is_used(in_tmp: Path) -> None:
    graph = tfgraph.compile(TINY)
    weights = {k: v + 1.5 for k, v in generate(graph, 0).items()}
    save_weights(weights, "w.safetensors")
    result = cli("build", TINY, "--to", "onnx", "--weights", "w.safetensors", "-o", "m.onnx")
    assert result.exit_code == 0, result.stderr
    assert "weights w.safetensors" in result.stdout
    got = initializers(in_tmp / "m.onnx")
    for name, value in weights.items():
        np.testing.assert_array_equal(got[name], value)


def test_wrong_weights_exit_2_listing_them(in_tmp: Path) -> None:
    graph = tfgraph.compile(TINY)
    weights = generate(graph, 0)
    weights["encoder.layers.0.ffn.up.weight"] = np.zeros((3, 3), np.float32)
    del weights["decoder.layers.1.cross_attn.k.bias"]
    weights["decoder.layers.9.ffn.up.weight"] = np.zeros((2,), np.float32)
    save_weights(weights, "bad.safetensors")
    Path("m.onnx").write_bytes(b"old model")
    result = cli("build", TINY, "--to", "onnx", "--weights", "bad.safetensors", "-o", "m.onnx")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "1 missing (decoder.layers.1.cross_attn.k.bias" in line
    assert "1 unexpected (decoder.layers.9.ffn.up.weight" in line
    assert "encoder.layers.0.ffn.up.weight (3, 3) != (64, 32)" in line
    assert Path("m.onnx").read_bytes() == b"old model"


def test_unreadable_weights_file_exit_2(in_tmp: Path) -> None:
    Path("junk.safetensors").write_bytes(b"\x00" * 20)
    result = cli("build", TINY, "--to", "onnx", "--weights", "junk.safetensors")
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert "junk.safetensors" in result.stderr
    assert not Path("build/tiny.onnx").exists()


def test_failed_build_keeps_old_file_and_leaves_no_partial(in_tmp: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    Path("m.onnx").write_bytes(b"old model")
    calls = []
    real = onnx_writer.cast_value

    def failing(value, dtype, *name):  # type: ignore[no-untyped-def]
        calls.append(dtype)
        if len(calls) == 5:
            raise MemoryError("simulated failure half-way through the weights")
        return real(value, dtype, *name)

    monkeypatch.setattr(onnx_writer, "cast_value", failing)
    result = cli("build", TINY, "--to", "onnx", "-o", "m.onnx")
    assert result.exit_code == 1 and "internal error" in result.stderr
    assert Path("m.onnx").read_bytes() == b"old model"
    assert sorted(os.listdir(in_tmp)) == ["m.onnx"]


def test_failed_write_keeps_old_file(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure comes while the temporary file is being written (disk full)."""
    Path("m.onnx").write_bytes(b"old model")

    real = onnx_writer._append_initializer
    written = []

    def full_disk(out, header, array):  # type: ignore[no-untyped-def]
        written.append(header.name)
        if len(written) == 5:  # part of the file is already on disk by now
            raise OSError(28, "No space left on device")
        real(out, header, array)

    with monkeypatch.context() as patch:
        patch.setattr(onnx_writer, "_append_initializer", full_disk)
        result = cli("build", TINY, "--to", "onnx", "-o", "m.onnx")
    assert result.exit_code == 2
    assert result.stderr == "m.onnx: cannot write: No space left on device\n"
    assert Path("m.onnx").read_bytes() == b"old model"
    assert sorted(os.listdir(in_tmp)) == ["m.onnx"]


@pytest.mark.parametrize("args, message", [
    (["--to", "svg", "--opset", "17"], "--opset applies to --to onnx only"),
    (["--to", "json", "--weights", "w.safetensors"], "--weights applies to"),
    (["--to", "dot", "--seed", "3"], "--seed applies to"),
    (["--to", "onnx", "--opset", "12"], "opset 12 is not supported"),
    (["--to", "onnx", "-o", "TINY_IS_A_FILE/m.onnx"], "Not a directory"),
])
def test_bad_arguments_exit_2_one_line(in_tmp: Path, args: list[str], message: str) -> None:
    Path("TINY_IS_A_FILE").write_text("a file, not a folder")  # (missing folders are made)
    result = cli("build", TINY, *args)
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.splitlines()) == 1


def test_bad_spec_and_bad_target_exit_2(in_tmp: Path) -> None:
    Path("bad.yaml").write_text("name: x\narch: decoder-only\nd_model: 0\n")
    result = cli("build", "bad.yaml", "--to", "onnx")
    assert result.exit_code == 2 and "bad.yaml" in result.stderr
    assert not Path("build").exists()
    result = cli("build", TINY, "--to", "tflite")
    assert result.exit_code == 2


def test_every_target_dispatches(in_tmp: Path) -> None:
    """Each --to writes its default file (the writers belong to the other back ends)."""
    from tfgraph.commands.build import TARGETS

    for target, how in TARGETS.items():
        if target == "png":
            import shutil

            if shutil.which("dot") is None:  # png needs graphviz's binary; svg/dot do not
                continue
        # --to hf needs a spec a Hugging Face family expresses (tiny.yaml is the 2017 model).
        spec, name = (ROOT / "specs" / "tiny-llama.yaml", "tiny-llama") if target == "hf" \
            else (TINY, "tiny")
        result = cli("build", str(spec), "--to", target)
        assert result.exit_code == 0, (target, result.stderr)
        default = how.default(name)
        assert default.exists(), target
        assert result.stdout.startswith(f"wrote {default}")


def test_progress_bar_on_a_terminal(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Big builds on a terminal show a rich progress bar over the bytes written; it ends
    transient (cleared) and the file is complete."""
    from tfgraph.commands import build as build_cmd

    monkeypatch.setattr(build_cmd, "PROGRESS_BYTES", 0)
    monkeypatch.setattr(build_cmd, "_stderr_is_terminal", lambda: True)
    advanced: list[int] = []
    real = build_cmd._progress.__enter__

    def spy(self):  # type: ignore[no-untyped-def]
        advance = real(self)
        assert advance is not None and self.total == cost.weights_bytes(
            tfgraph.compile(TINY))
        return lambda n: (advanced.append(n), advance(n))

    monkeypatch.setattr(build_cmd._progress, "__enter__", spy)
    result = cli("build", TINY, "--to", "onnx", "-o", "m.onnx")
    assert result.exit_code == 0, result.stderr
    assert sum(advanced) == cost.weights_bytes(tfgraph.compile(TINY))
    onnx.checker.check_model(onnx.load("m.onnx"), full_check=True)


def test_many_renamed_weights_are_summarised_in_one_short_line(in_tmp: Path) -> None:
    # A Hugging Face state dict given as --weights: every name differs.
    graph = tfgraph.compile(TINY)
    renamed = {f"model.layers.{i}.self_attn.q_proj.weight": np.zeros((2, 2), np.float32)
               for i in range(39)}
    save_weights(renamed, "hf.safetensors")
    result = cli("build", TINY, "--to", "onnx", "--weights", "hf.safetensors", "-o", "m.onnx")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert len(line) < 300, line
    missing = len(list(graph.params()))
    assert f"{missing} missing (" in line and f", +{missing - 1} more)" in line
    assert "39 unexpected (model.layers.0.self_attn.q_proj.weight, +38 more)" in line
    assert "Hugging Face names?" in line
    assert "tfgraph import" in line and not Path("m.onnx").exists()
