"""How fast hostile or oversized inputs are refused: the timings the unit tests used to assert.

    python benchmarks/hostile_inputs.py [--repeats 3]

The tests check that each input is refused, with the right one-line message and exit status;
this script times the same inputs (built by the tests' own helpers) and prints the best of
``--repeats`` wall times next to the ceiling the test once asserted (loose bounds against a
catastrophic regression; a wall-clock assertion flakes on a loaded machine, so none remains in
tests/):

- the spec reader (tests/test_spec_loader.py): a billion-laughs alias bomb, deep flow nesting,
  a flat list and a mapping of 60,000 keys, each under 1 MiB (ceilings 5 s, 10 s);
- ``tfgraph validate`` (tests/test_cli_validate.py) on each hostile file in process (5 s each)
  and on all of them in one real process (30 s);
- ``tfgraph run --check`` / ``generate`` of an ONNX model whose metadata claims 10,000 layers
  (tests/test_run_metadata.py), refused before compiling them (10 s; compiling took ~30 s);
- ``tfgraph build`` of a spec with petabytes of weights (tests/test_review_regressions.py),
  refused at once for lack of disk (60 s).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' builders of the hostile inputs


def _best(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _line(what: str, seconds: float, ceiling: float) -> None:
    ok = "within" if seconds < ceiling else "OVER"
    print(f"  {what:<58} {seconds:>8.3f} s  ({ok} the former test ceiling {ceiling:g} s)")


def _spec_reader(repeats: int) -> None:
    from test_spec_loader import bomb

    from tfgraph import parse_spec
    from tfgraph.errors import SpecError

    def refused(text: str) -> Callable[[], object]:
        def run() -> object:
            try:
                parse_spec(text, "t.yaml")
            except SpecError as err:
                return err
            raise AssertionError("not refused")
        return run

    print("spec reader (parse_spec):")
    _line("billion laughs (10^9 values by aliases)", _best(refused(bomb()), repeats), 5.0)
    for what, text in (("deep flow nesting (200,000 levels)", "a: " + "[" * 200_000
                        + "]" * 200_000),
                       ("flat list of 300,000 values", "a: [" + "1, " * 300_000 + "1]\n"),
                       ("mapping of 60,000 keys", "".join(f"k{i}: 1\n" for i in range(60_000)))):
        _line(what, _best(refused(text), repeats), 10.0)


def _validate(repeats: int, tmp: Path) -> None:
    from click.testing import CliRunner
    from test_cli_validate import hostile_files

    from tfgraph.cli import main

    paths = hostile_files(tmp)
    print("tfgraph validate on hostile files:")
    for name, path in paths.items():
        def run(path: Path = path) -> object:
            result = CliRunner().invoke(main, ["validate", str(path)], catch_exceptions=False)
            assert result.exit_code == 2, name
            return result
        _line(f"in process: {name}", _best(run, repeats), 5.0)

    def all_in_one() -> object:
        proc = subprocess.run([sys.executable, "-m", "tfgraph", "validate",
                               *map(str, paths.values())], cwd=tmp, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2
        return proc
    _line(f"one process, all {len(paths)} files", _best(all_in_one, repeats), 30.0)


def _metadata(repeats: int, tmp: Path) -> None:
    from click.testing import CliRunner
    from test_run_metadata import tampered, with_spec

    import tfgraph
    from tfgraph.cli import main
    from tfgraph.exporters import to_onnx

    model = to_onnx(tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / "tiny-llama.yaml")))
    path = tampered(model, tmp / "m.onnx", with_spec(lambda spec: spec.update(layers=10_000)))
    print("an ONNX model whose metadata claims 10,000 layers:")
    for args in (("run", str(path), "--check"),
                 ("generate", str(path), "--backend", "torch", "--prompt-ids", "1,2")):
        def run(args: tuple[str, ...] = args) -> object:
            result = CliRunner().invoke(main, list(args), catch_exceptions=False)
            assert result.exit_code == 2
            return result
        _line(f"tfgraph {args[0]} refuses it", _best(run, repeats), 10.0)


def _too_big_to_build(repeats: int, tmp: Path) -> None:
    text = (ROOT / "specs" / "tiny.yaml").read_text().replace("d_model: 32", "d_model: 262144")
    spec = tmp / "huge.yaml"
    spec.write_text(text)
    print("tfgraph build of a spec with petabytes of weights:")
    for target in ("onnx", "torch"):
        def run(target: str = target) -> object:
            proc = subprocess.run([sys.executable, "-m", "tfgraph", "build", str(spec), "--to",
                                   target, "-o", str(tmp / f"huge.{target}")],
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 2, proc.stderr
            return proc
        _line(f"--to {target} refused (one process)", _best(run, repeats), 60.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    _spec_reader(args.repeats)
    for part in (_validate, _metadata, _too_big_to_build):
        with tempfile.TemporaryDirectory() as tmp:
            part(args.repeats, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
