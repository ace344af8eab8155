"""Issue 25's speed goal: a tiny Hugging Face folder of every family to ONNX in under 3 s.

    python benchmarks/family_build_time.py [--families mpt,olmo,...] [--repeat 2]

For each family of tests/test_hf_families.py (the same tiny configs: <= 3 layers, d <= 128),
transformers builds the model with random weights and ``save_pretrained`` writes its folder.
Then ``python -m tfgraph build DIR --to onnx -o DIR/model.onnx`` runs as a fresh process, as a
user would run it: it reads config.json (the import: spec, strict checks, name map), streams
the safetensors through the name map and writes the ONNX model. The figure is the wall time of
that process (Python start-up and imports included), the fastest of ``--repeat`` runs, with
the machine's load average printed beside it (this 2-core machine is often shared).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 3.0


def save_folder(name: str, out: Path) -> None:
    """The family test's tiny model, random weights, as transformers saves it."""
    sys.path.insert(0, str(ROOT / "tests"))
    import transformers
    from test_hf_families import CASES

    case = CASES[name]
    config = getattr(transformers, case.config)(**case.kwargs)
    model = getattr(transformers, case.model)._from_config(config)
    model.save_pretrained(out)


def build_seconds(folder: Path, repeat: int) -> float:
    times = []
    for i in range(repeat):
        # each build its own folder: build also writes generation_config.json beside the model
        out = folder.parent / f"{folder.name}-out{i}" / "model.onnx"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tfgraph", "build", str(folder), "--to",
                               "onnx", "-o", str(out)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{folder.name}: exit {done.returncode}: {done.stderr.strip()}")
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_hf_families import CASES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(CASES),
                        help="comma-separated family cases (default: all)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    names = [n for n in args.families.split(",") if n]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            folder = Path(tmp) / name
            save_folder(name, folder)
            seconds = build_seconds(folder, args.repeat)
            rows.append((name, seconds, os.getloadavg()[0]))
            print(f"{name:24s} {seconds:6.2f} s  (load {rows[-1][2]:.1f})", flush=True)
    worst = max(rows, key=lambda r: r[1])
    over = [n for n, s, _ in rows if s >= GOAL_S]
    print(f"{len(rows)} cases; slowest {worst[0]} {worst[1]:.2f} s; "
          f"goal < {GOAL_S:.0f} s per folder: {'met' if not over else 'NOT met: ' + ', '.join(over)}")


if __name__ == "__main__":
    main()
