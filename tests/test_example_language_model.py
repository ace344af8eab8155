"""examples/language-model/train.py --quick, run as a user runs it (issue 14).

The script trains the byte-level model of examples/language-model/byte-lm.yaml for 40 steps
on the standard library's source, builds the trained weights into a KV-cache ONNX model with
`tfgraph build --weights` and decodes with `tfgraph generate`. It exits 0 only when held-out
perplexity is below 40 (untrained: about 256) and onnxruntime's greedy tokens equal the torch
module's; this test also reads its --json-out figures, so a check that silently disappeared
(or a run that trained nothing) fails here too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

import tfgraph
from conftest import ROOT
from tfgraph.exporters import to_torch

SCRIPT = ROOT / "examples" / "language-model" / "train.py"


def test_quick_run_learns_and_onnx_greedy_equals_torch(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out),
         "--json-out", str(figures_file)],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("PASS: held-out perplexity")
    figures = json.loads(figures_file.read_text())
    assert figures["quick"] is True and figures["passed"] is True
    assert figures["steps"] == 40 and figures["max_ppl"] == 40.0
    # the untrained model guesses about uniformly over 256 bytes; training beat it and the
    # threshold, and the unigram baseline is the frequency model of the same bytes
    assert 200 < figures["untrained_ppl"] < 320
    assert figures["held_out_ppl"] < 40.0 < figures["untrained_ppl"]
    assert 10 < figures["unigram_ppl"] < 40
    assert figures["greedy_equal"] is True
    assert [len(t) for t in figures["greedy_tokens"]] == [24, 24, 24]
    assert figures["sample"].startswith("def ")
    # --prompt TEXT through the byte-level tokenizer.json written beside the model
    assert figures["tokenizer_text_equal"] is True
    assert (out / "tokenizer.json").is_file()
    assert (out / "byte-lm.onnx").is_file()
    # the greedy tokens it reports are the trained torch module's, recomputed here
    model = to_torch(tfgraph.compile(SCRIPT.parent / "byte-lm.yaml"),
                     weights=load_file(out / "weights.safetensors"))
    prompts = ["def ", "import ", "class Parser:\n    def __init__(self"]
    for prompt, tokens in zip(prompts, figures["greedy_tokens"]):
        ids = torch.tensor([list(prompt.encode())])
        with torch.no_grad():
            for _ in range(24):
                ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
        assert ids[0, len(prompt):].tolist() == tokens


def test_bad_length_is_refused(tmp_path: Path) -> None:
    """Windows longer than the spec's max_len (256) are refused before any training: bad
    input, so one line and exit 2 (tests/test_example_flags.py checks the other flags)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seq", "300", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "max_len 256" in done.stderr and done.stderr.count("\n") == 1


def test_explicit_flags_win_over_quick_defaults() -> None:
    """--quick sets defaults only: a flag given explicitly keeps its value (as the seq2seq
    and train_distributed examples do); without --quick the full run's defaults."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("language_model_train", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = script.parse_args(["--quick", "--steps", "5", "--seq", "32", "--max-ppl", "9",
                              "--eval-windows", "0", "--new-tokens", "3"])
    assert (args.steps, args.seq, args.max_ppl, args.eval_windows, args.new_tokens) == \
        (5, 32, 9.0, 0, 3)
    assert (args.batch, args.sample_tokens) == (16, 48)  # --quick's
    full = script.parse_args([])
    assert (full.steps, full.seq, full.max_ppl, full.eval_windows) == (1000, 256, 8.0, 0)
