"""The example scripts refuse bad flag values as tfgraph's commands do: one line on stderr and
exit 2, before any work (tfgraph.script_args). Parsing is checked in process (no training,
no model is built); one subprocess per script checks the whole path, an error raised by the
script's own setup (a spec that does not load, lengths past max_len) included, and that
nothing was written."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tfgraph.errors import TfgraphError
from tfgraph.script_args import (MAX_SEED, ArgumentParser, non_negative_float,
                                 non_negative_int, positive_float, positive_int, positive_ints,
                                 run_main, seed)

from conftest import ROOT

EXAMPLES = ROOT / "examples"
SCRIPTS = {"seq2seq": EXAMPLES / "seq2seq" / "train.py",
           "language-model": EXAMPLES / "language-model" / "train.py",
           "compare-variants": EXAMPLES / "compare-variants" / "compare.py"}


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    path = SCRIPTS[name]
    monkeypatch.syspath_prepend(str(path.parent))  # seq2seq imports number_words beside it
    spec = importlib.util.spec_from_file_location(f"example_{name.replace('-', '_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("name", "argv", "message"), [
    ("seq2seq", ["--steps", "0"], "argument --steps: expected an integer of 1 or more, got '0'"),
    ("seq2seq", ["--steps", "-3"], "--steps: expected an integer of 1 or more, got '-3'"),
    ("seq2seq", ["--batch", "0"], "--batch: expected an integer of 1 or more"),
    ("seq2seq", ["--beams", "0"], "--beams: expected an integer of 1 or more"),
    ("seq2seq", ["--lr", "-1"], "--lr: expected a finite number > 0, got '-1'"),
    ("seq2seq", ["--lr", "nan"], "--lr: expected a finite number > 0, got 'nan'"),
    ("seq2seq", ["--warmup", "-1"], "--warmup: expected an integer of 0 or more, got '-1'"),
    ("seq2seq", ["--threads", "0"], "--threads: expected an integer of 1 or more"),
    ("seq2seq", ["--threads", "-2"], "--threads: expected an integer of 1 or more"),
    ("seq2seq", ["--seed", "-1"], "--seed: expected an integer from 0 to 4294967295, got '-1'"),
    ("seq2seq", ["--seed", "4294967296"], "--seed: expected an integer from 0 to 4294967295"),
    ("language-model", ["--seed", "99999999999999999999"],
     "--seed: expected an integer from 0 to 4294967295, got '99999999999999999999'"),
    ("language-model", ["--seq", "0"], "--seq: expected an integer of 1 or more"),
    ("language-model", ["--batch", "0"], "--batch: expected an integer of 1 or more"),
    ("language-model", ["--steps", "0"], "--steps: expected an integer of 1 or more"),
    ("language-model", ["--threads", "-2"], "--threads: expected an integer of 1 or more"),
    ("language-model", ["--eval-windows", "-1"], "--eval-windows: expected an integer of 0"),
    ("language-model", ["--max-ppl", "inf"], "--max-ppl: expected a finite number > 0"),
    ("language-model", ["--json-out", str(ROOT / "specs")], "specs: is a directory; give a file name"),
    ("seq2seq", ["--json-out", "/nonexistent-dir/x.json"], "--json-out: /nonexistent-dir/x"),
    ("compare-variants", ["--lengths", "abc"],
     "--lengths: expected comma-separated integers of 1 or more, got 'abc'"),
    ("compare-variants", ["--lengths", "64,0"], "--lengths: expected comma-separated"),
    ("compare-variants", ["--repeats", "0"], "--repeats: expected an integer of 1 or more"),
    ("compare-variants", ["--threads", "0"], "--threads: expected an integer of 1 or more"),
])
def test_bad_values_are_one_line_exit_2(name: str, argv: list[str], message: str,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    script = _load(name, monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        script.parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert err.endswith("--help)\n"), err


@pytest.mark.parametrize(("argv", "message"), [
    (["--threads", "0"], "argument --threads: expected an integer of 1 or more, got '0'"),
    (["--seed", "-2"], "argument --seed: expected an integer from 0 to 4294967295, got '-2'"),
    (["--seed", "99999999999999999999"], "argument --seed: expected an integer from 0 to "
                                         "4294967295, got '99999999999999999999'"),
])
def test_hf_checkpoint_bad_flags(argv: list[str], message: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """roundtrip.py parses inside main(): a bad value stops there, before any work."""
    path = EXAMPLES / "hf-checkpoint" / "roundtrip.py"
    spec = importlib.util.spec_from_file_location("example_hf_roundtrip", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as exit_:
        script.main([*argv, "--quick", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err  # prog is sys.argv[0]'s name: pytest's here
    assert err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "out").exists()


def test_good_values_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """0 stays 0 where it means something; --repeats and --lengths given are kept, not
    replaced by the defaults (--repeats 0 used to become 3)."""
    s2s = _load("seq2seq", monkeypatch).parse_args(["--quick", "--warmup", "0", "--lr", "1e-3"])
    assert (s2s.warmup, s2s.lr, s2s.steps) == (0, 1e-3, 400)
    lm = _load("language-model", monkeypatch).parse_args(["--eval-windows", "0"])
    assert lm.eval_windows == 0
    cv = _load("compare-variants", monkeypatch).parse_args(["--lengths", "32, 64",
                                                             "--repeats", "1"])
    assert (cv.lengths, cv.repeats) == ([32, 64], 1)


def test_the_types() -> None:
    assert (positive_int("7"), non_negative_int("0"), positive_ints("1,2")) == (7, 0, [1, 2])
    assert (positive_float("2.5e-3"), non_negative_float("0")) == (2.5e-3, 0.0)
    for parse, text in ((positive_int, "0"), (positive_int, "1.5"), (non_negative_int, "-1"),
                        (positive_float, "0"), (positive_float, "inf"),
                        (non_negative_float, "-0.1"), (non_negative_float, "nan"),
                        (positive_ints, "")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_run_main_turns_a_tfgraph_error_into_one_line(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    def main() -> int:
        raise TfgraphError("spec.yaml:3:1: attention.heads: must be >= 1\n\u2028(more)")

    assert run_main(main) == 2
    assert capsys.readouterr().err == \
        "error: spec.yaml:3:1: attention.heads: must be >= 1 \\u2028(more)\n"
    assert run_main(lambda: 1) == 1
    parser = ArgumentParser(prog="x.py")
    parser.add_argument("--n", type=positive_int)
    with pytest.raises(SystemExit):
        parser.parse_args(["--n", "0"])
    assert capsys.readouterr().err == ("x.py: argument --n: expected an integer of 1 or more, "
                                       "got '0' (see x.py --help)\n")


@pytest.mark.parametrize(("name", "argv", "message"), [
    ("seq2seq", ["--spec", "/nonexistent/spec.yaml"], "error: /nonexistent/spec.yaml: "),
    ("language-model", ["--seq", "300"], "error: --seq, prompt + --new-tokens and "
                                         "--sample-tokens must fit the spec's max_len 256"),
    ("compare-variants", ["--lengths", "0"], "compare.py: argument --lengths"),
    ("compare-variants", ["--lengths", "64,100000000"],
     "error: --lengths 100000000 (cv-base's forward pass, batch 1): needs about "
     "320,000,512.1 GB of memory"),
    ("compare-variants", ["--lengths", "2000000000"],
     "error: --lengths 2000000000: at most 1,073,741,824 (tokens per sequence)"),
])
def test_the_scripts_exit_2_before_any_work(name: str, argv: list[str], message: str,
                                            tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPTS[name]), "--quick", "--out", str(out),
                           *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(message), done.stderr
    assert done.stdout == "" and not out.exists()


@pytest.mark.parametrize(("name", "argv", "message"), [
    ("language-model", ["--batch", "1000000000"], "error: --batch 1000000000 x --seq 64: "
     "needs about 66,560.0 GB of memory, only 1.0 GB available"),
    ("seq2seq", ["--batch", "100000000"],
     "error: --batch 100000000: needs about 56.4 GB of memory, only 1.0 GB available"),
    ("seq2seq", ["--batch", "99999999999"],
     "error: --batch 99999999999: at most 1,073,741,824 (sequences per step)"),
])
def test_a_batch_that_cannot_fit_is_refused_before_any_work(
        name: str, argv: list[str], message: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Rows x tokens whose ids and float32 logits alone exceed the memory available (1 GB
    here) stop before the output folder is made or anything is allocated."""
    from tfgraph import io

    monkeypatch.setattr(io, "available_memory", lambda: 10**9)
    script = _load(name, monkeypatch)
    out = tmp_path / "out"
    assert run_main(lambda: script.main(["--quick", "--out", str(out), *argv])) == 2
    assert capsys.readouterr().err == message + "\n"
    assert not out.exists()


def test_the_seed_type() -> None:
    assert (seed("0"), seed(str(MAX_SEED))) == (0, 2**32 - 1)
    for text in ("-1", str(MAX_SEED + 1), "1.0", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed(text)
