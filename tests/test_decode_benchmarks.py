"""The CPU decoding benchmarks run (benchmarks/decode_fused.py --quick): a GPU session and
RESULTS.md rely on them, so a change that breaks them (the fused stepper's fixed logits once
met the script's stand-in vocabulary of 2^30 and refused to run) is caught here. Their
figures are checked in benchmarks/RESULTS.md, not here."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_decode_fused_runs_both_builds_to_the_same_tokens() -> None:
    done = subprocess.run([sys.executable, "benchmarks/decode_fused.py", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if "tokens/s" in line]
    assert len(rows) == 2 and all(line.endswith("same tokens") for line in rows), done.stdout
    assert sum("steps taken in turn" in line for line in done.stdout.splitlines()) == 2
