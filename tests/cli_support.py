"""Running the ``tfgraph`` program in a subprocess and checking a refusal, shared by the tests
of hostile input (tests/test_safe_bounds.py, tests/test_safe_outputs.py); the config.json
``build --to hf`` writes (the Hugging Face dropout tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def tfgraph(*args: str, cwd: Path | None = None, timeout: float = 240
            ) -> subprocess.CompletedProcess[str]:
    """``python -m tfgraph ARGS`` with its output captured."""
    return subprocess.run([sys.executable, "-m", "tfgraph", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 2, one line on stderr of at most ~300 characters naming ``words``, no traceback;
    returns the line."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 300, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def hf_config_written(spec_file: Path, out: Path) -> dict[str, Any]:
    """``tfgraph build SPEC --to hf --seed 0 -o OUT`` in this process: the config.json it
    writes."""
    from click.testing import CliRunner

    from tfgraph.cli import main

    result = CliRunner().invoke(main, ["build", str(spec_file), "--to", "hf", "--seed", "0",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    config: dict[str, Any] = json.loads((out / "config.json").read_text())
    return config
