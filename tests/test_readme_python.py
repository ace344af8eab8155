"""Every Python block of README.md runs as written (issue 15, item 8: a snippet used a name no
block defined). Blocks run in order in one namespace, in a folder where `specs/` is the
repository's, as a reader pasting them into one session would; a block whose first line says
`torchrun` runs under `torchrun --nproc_per_node 2` (gloo on CPU) on its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from distributed_support import launch

README = (ROOT / "README.md").read_text()
BLOCKS = [(README[: m.start()].count("\n") + 2, m.group(1))
          for m in re.finditer(r"^```python\n(.*?)^```$", README, re.S | re.M)]

RUNNER = """
import json, sys, traceback
namespace = {"__name__": "__readme__"}
for line, code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, f"README.md:{line}", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        sys.exit(f"README.md block at line {line} failed")
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_there_are_python_blocks() -> None:
    assert len(BLOCKS) >= 8


def test_every_python_block_runs_in_order(tmp_path: Path) -> None:
    (tmp_path / "specs").symlink_to(ROOT / "specs")
    plain = [(line, code) for line, code in BLOCKS if "torchrun" not in code.splitlines()[0]]
    (tmp_path / "blocks.json").write_text(json.dumps(plain))
    (tmp_path / "runner.py").write_text(RUNNER)
    result = subprocess.run([sys.executable, "runner.py", "blocks.json"], cwd=tmp_path,
                            capture_output=True, text=True, env=_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "gpt2.json").is_file() and (tmp_path / "gpt2.onnx").is_file()


def test_the_torchrun_block_runs_on_two_processes(tmp_path: Path) -> None:
    (tmp_path / "specs").symlink_to(ROOT / "specs")
    (distributed,) = [(line, code) for line, code in BLOCKS
                      if "torchrun" in code.splitlines()[0]]
    (tmp_path / "block.py").write_text(distributed[1] + "\nprint('done', flush=True)\n")
    # A free rendezvous port, and past the timeout both ranks are killed (distributed_support)
    result = launch(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "block.py"],
        300, cwd=tmp_path, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("done") == 2
