"""Regressions for defects found in review: each test failed before its fix."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tfgraph.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "specs" / "tiny.yaml")


def cli(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _huge_spec(tmp_path: Path) -> Path:
    # Within the spec's documented bounds, and petabytes of weights.
    text = (ROOT / "specs" / "tiny.yaml").read_text()
    text = text.replace("d_model: 32", "d_model: 262144")
    path = tmp_path / "huge.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("target", ["onnx", "torch"])
def test_build_of_a_spec_too_big_for_the_disk_is_refused_at_once(
        tmp_path: Path, target: str) -> None:
    # It used to generate weights until the out-of-memory killer ended it (exit 137), leaving
    # temporary files behind.
    spec = _huge_spec(tmp_path)
    out = tmp_path / f"huge.{target}"
    # timeout: a hang guard; how fast the refusal comes is measured by
    # benchmarks/hostile_inputs.py
    proc = subprocess.run([sys.executable, "-m", "tfgraph", "build", str(spec), "--to", target,
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "of disk" in lines[0] and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.yaml"]


def test_onnx_build_needing_more_memory_than_available_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tfgraph.io

    monkeypatch.setattr(tfgraph.io, "available_memory", lambda: 1000)
    out = tmp_path / "tiny.onnx"
    result = cli("build", TINY, "--to", "onnx", "-o", str(out))
    assert result.exit_code == 2
    assert "of memory" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_weights_in_flight_stay_within_the_lookahead_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Parameters bigger than the budget used to be generated one per worker at once.
    import threading

    import tfgraph
    from tfgraph.exporters.onnx import model as onnx_model

    graph = tfgraph.compile(tfgraph.load_spec(TINY))
    largest = max(4 * math.prod(p.attrs["shape"]) for p in graph.params())
    monkeypatch.setattr(onnx_model, "LOOKAHEAD_BYTES", 1)  # every parameter is "huge"
    live, peak, lock = [0], [0], threading.Lock()
    source = onnx_model.weight_source

    def counting(*args):  # type: ignore[no-untyped-def]
        value_of = source(*args)

        def value(p):  # type: ignore[no-untyped-def]
            with lock:
                live[0] += 1
                peak[0] = max(peak[0], live[0])
            return value_of(p)
        return value

    monkeypatch.setattr(onnx_model, "weight_source", counting)
    for _param, _value in onnx_model.parameter_values(graph, None, 0, workers=4):
        with lock:
            live[0] -= 1
    assert largest > 1 and peak[0] == 1


@pytest.mark.parametrize("flags", [["--json", "-o", "{tmp}/out.json"], []])
def test_compare_checks_the_plot_path_before_writing_anything(
        tmp_path: Path, flags: list[str]) -> None:
    # A bad --plot directory used to be found only after the table was printed and the -o
    # file written: exit 2 with partial output. (A missing folder is now created; a file in
    # the way of the folder is the bad path.)
    in_the_way = tmp_path / "afile"
    in_the_way.write_text("mine")
    tiny_decoder = str(ROOT / "specs" / "tiny-decoder.yaml")
    args = ["compare", TINY, tiny_decoder, "--plot", str(in_the_way / "p.png")]
    result = cli(*args, *(f.format(tmp=tmp_path) for f in flags))
    assert result.exit_code == 2
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == [in_the_way] and in_the_way.read_text() == "mine"


def test_run_default_length_fits_a_learned_positions_spec() -> None:
    # tiny-decoder has max_len 64: `tfgraph run` with no --seq used to fail on its own
    # default of 128 (report caps its default at max_len).
    result = cli("run", str(ROOT / "specs" / "tiny-decoder.yaml"), "--repeat", "1")
    assert result.exit_code == 0, result.stderr
    assert "input_ids int64[1, 64]" in result.stdout


def test_run_refuses_tgt_seq_for_a_one_stack_model() -> None:
    # It was silently ignored (report refuses it).
    result = cli("run", str(ROOT / "specs" / "tiny-decoder.yaml"), "--seq", "8",
                 "--tgt-seq", "3")
    assert result.exit_code == 2 and result.stdout == ""
    assert "--tgt-seq" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [
    ["run", TINY, "--seq", "0"],
    ["run", TINY, "--batch", "-1"],
    ["build", TINY, "--to", "nonsense"],
    ["draw", TINY, "--level", "bogus"],
    ["report"],
    ["nonsense"],
    ["--bogus"],
])
def test_usage_errors_are_one_line_and_exit_2(args: list[str]) -> None:
    # click's usage errors used to be three lines (Usage:, Try ..., Error: ...).
    result = CliRunner().invoke(main, args, prog_name="tfgraph")
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfgraph") and "--help" in lines[0]
    assert "Usage:" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("target", "name"), [("svg", "out.png"), ("png", "out.svg"),
                                              ("dot", "out.svg"), ("svg", "out")])
def test_build_diagram_refuses_an_output_suffix_of_another_format(
        tmp_path: Path, target: str, name: str) -> None:
    # "--to svg -o out.png" used to write SVG text into out.png.
    result = cli("build", TINY, "--to", target, "-o", str(tmp_path / name))
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_build_diagram_accepts_its_own_suffix_in_any_case(tmp_path: Path) -> None:
    result = cli("build", TINY, "--to", "dot", "-o", str(tmp_path / "OUT.DOT"))
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "OUT.DOT").read_text().startswith("digraph")


def test_run_on_a_directory_says_it_is_a_directory(tmp_path: Path) -> None:
    # It used to say "no such file" for a directory named like a model.
    folder = tmp_path / "model.onnx"
    folder.mkdir()
    result = cli("run", str(folder))
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == f"{folder}: is a directory, not an ONNX model file"
