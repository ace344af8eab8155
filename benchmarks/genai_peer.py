"""The peer of benchmarks/hf_build.py: onnxruntime-genai's model builder, in a venv of its own.

onnxruntime-genai 0.18.0 depends on the CPU ``onnxruntime`` wheel, which conflicts with the
project's ``onnxruntime-gpu`` (both own the ``onnxruntime`` package), so it cannot share the
project venv. This module makes a separate venv under benchmarks/.cache/ the first time and
reuses it afterwards (a marker file records the pins it was made with).

The pins are what the builder imports and its wheel does not declare, found by running it:
``onnx_ir`` (its graph builder), ``torch`` (it reads checkpoints as tensors) and
``transformers`` (``AutoConfig`` / ``AutoTokenizer``). torch is pinned to the release whose
plain install is the CPU wheel (design section 7); transformers to the project's reference
version, so both sides read the same config.json the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PINS = ("onnxruntime-genai==0.18.0", "torch==2.13.0", "transformers==5.23.0", "onnx-ir==1.1.0")


def venv_python(cache: Path) -> Path:
    """The peer venv's interpreter, creating the venv (a few minutes, once) when needed."""
    venv = cache / "genai-venv"
    python = venv / "bin" / "python"
    marker = venv / "tfgraph-bench-pins.txt"
    wanted = "\n".join(PINS) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"making the peer venv {venv} ({', '.join(PINS)}) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    log = cache / "genai-venv-pip.log"
    with open(log, "wb") as sink:
        done = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                               *PINS], stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"pip install {' '.join(PINS)} failed in the peer venv; see {log}")
    marker.write_text(wanted)
    return python


def builder_command(python: Path, folder: Path, out: Path, cache_dir: Path) -> list[str]:
    """The documented command line: fp32 weights, CPU execution provider."""
    return [str(python), "-m", "onnxruntime_genai.models.builder", "-i", str(folder),
            "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(cache_dir)]


def builder_env(python: Path) -> dict[str, str]:
    """The environment to run the builder in.

    The builder stamps its model with a source revision from ``git rev-parse HEAD`` run five
    folders above its own file. In a venv inside this checkout, git would walk up and find
    tfgraph's repository; the ceiling stops it at the venv, so it falls back to the wheel's
    own commit, as in a venv anywhere else. That git child is the builder's only subprocess.
    """
    env = dict(os.environ)
    env["GIT_CEILING_DIRECTORIES"] = str(python.parent.parent.resolve())
    env.pop("PYTHONPATH", None)
    return env
