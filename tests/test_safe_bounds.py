"""Issue 27: every size option bounded before work starts, strict YAML 1.2 core specs, user
errors as exit 2 with one line (subprocess CLI runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tfgraph.limits import usable_cores

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "specs" / "tiny-decoder.yaml")


def tfgraph(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tfgraph", *args], capture_output=True,
                          text=True, timeout=timeout)


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 300, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


TOO_MANY_THREADS = str(usable_cores() + 1)


@pytest.mark.parametrize("args, words", [
    (("run", TINY, "--batch", "99999999999"), ("--batch", "memory")),
    (("run", TINY, "--threads", TOO_MANY_THREADS), ("--threads",)),
    (("run", TINY, "--seed", "-1"), ("--seed",)),
    (("build", TINY, "--to", "onnx", "--seed", "-1"), ("--seed",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--threads", TOO_MANY_THREADS), ("--threads",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--beams", "1000000000"), ("--beams",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--max-new-tokens", "999999999999"),
     ("--max-new-tokens",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--weights-seed", "-1"), ("--weights-seed",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--length-penalty", "nan"),
     ("--length-penalty",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--eos-id", "99999"), ("--eos-id", "211")),
    (("plan", TINY, "--gpus", "999999999999"), ("--gpus",)),
    (("plan", TINY, "--gpus", "999999999", "--search", "--top", "100000000"), ("--gpus",)),
    (("plan", TINY, "--gpus", "8", "--search", "--top", "100000000"), ("--top",)),
    (("plan", TINY, "--gpus", "8", "--micro-batch", "99999999999999"), ("--micro-batch",)),
])
def test_size_options_are_bounded(args: tuple[str, ...], words: tuple[str, ...]) -> None:
    refused(tfgraph(*args, timeout=120), *words)


def spec_with(tmp_path: Path, old: str, new: str) -> str:
    text = Path(TINY).read_text()
    assert old in text
    path = tmp_path / "spec.yaml"
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize("old, new, words", [
    ("d_model: 48", "d_model: 1:30", ("d_model", "'1:30'")),
    ("d_model: 48", "d_model: 1_000", ("d_model", "'1_000'")),
    ("scale: false", "scale: yes", ("scale", "'yes'")),
    ("scale: false", "scale: off", ("scale", "'off'")),
    ("d_model: 48", "d_model: " + "4" * 5000, ("digits",)),
])
def test_yaml_1_1_forms_are_strings(tmp_path: Path, old: str, new: str,
                                    words: tuple[str, ...]) -> None:
    refused(tfgraph("validate", spec_with(tmp_path, old, new)), *words)


def test_yaml_1_2_core_numbers(tmp_path: Path) -> None:
    from tfgraph import load_spec

    assert load_spec(spec_with(tmp_path, "d_model: 48", "d_model: 048")).d_model == 48
    assert load_spec(spec_with(tmp_path, "d_model: 48", "d_model: 0x30")).d_model == 48
    assert load_spec(spec_with(tmp_path, "d_model: 48", "d_model: 0o60")).d_model == 48
    assert load_spec(spec_with(tmp_path, "scale: false", "scale: False")).embedding.scale is False
