"""examples/seq2seq: the task's reference translations, its training batches, and the quick
run as CI runs it (a subprocess that trains, exports to ONNX with a KV cache and compares
``tfgraph generate`` on onnxruntime with the torch module, greedy and beam search)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "seq2seq"


def _task() -> ModuleType:
    spec = importlib.util.spec_from_file_location("number_words", EXAMPLE / "number_words.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("n", "words"), [
    (0, "zero"), (7, "seven"), (10, "ten"), (13, "thirteen"), (40, "forty"),
    (99, "ninety nine"), (105, "one hundred five"), (110, "one hundred ten"),
    (1000, "one thousand"), (1013, "one thousand thirteen"),
    (40213, "forty thousand two hundred thirteen"), (100000, "one hundred thousand"),
    (700070, "seven hundred thousand seventy"),
    (999999, "nine hundred ninety nine thousand nine hundred ninety nine"),
])
def test_number_to_words(n: int, words: str) -> None:
    assert " ".join(_task().number_to_words(n)) == words


def test_number_to_words_refuses_out_of_range() -> None:
    task = _task()
    for n in (-1, 1_000_000):
        with pytest.raises(ValueError):
            task.number_to_words(n)


def test_vocabulary_matches_the_spec() -> None:
    import tfgraph

    task = _task()
    assert len(set(task.VOCAB)) == len(task.VOCAB)
    spec = tfgraph.load_spec(EXAMPLE / "spec.yaml")
    assert spec.vocab_size("source") == len(task.VOCAB) == 43
    assert (spec.arch, spec.norm.position, spec.embedding.positions) == \
        ("encoder-decoder", "post", "sinusoidal")
    assert spec.embedding.share and spec.embedding.tie_output


def test_batches_hold_out_and_shift() -> None:
    """Sources of one length per batch, none held out; tgt_in is <bos> + labels shifted,
    labels end in <eos> then padding, and they spell number_to_words."""
    task = _task()
    exclude = set(task.held_out(300, 3, seed=1))
    data = task.batches(16, 3, exclude, seed=0)
    for _ in range(30):
        src, tgt_in, labels = next(data)
        assert src.shape[0] == tgt_in.shape[0] == labels.shape[0] == 16
        assert tgt_in.shape == labels.shape
        assert (tgt_in[:, 0] == task.BOS).all()
        for row in range(16):
            n = int("".join(task.VOCAB[int(t)] for t in src[row]))
            assert n not in exclude
            want = task.target_ids(n)
            got = [int(t) for t in labels[row]]
            assert got == want + [task.PAD] * (len(got) - len(want))
            shifted = [task.BOS] + want[:-1]
            assert [int(t) for t in tgt_in[row]][:len(shifted)] == shifted


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    summary = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--quick", "--out",
                           str(tmp_path), "--json-out", str(summary), *extra],
                          capture_output=True, text=True, timeout=600)
    assert summary.is_file(), done.stdout + done.stderr
    return done, json.loads(summary.read_text())


def test_quick_run_learns_and_onnx_agrees(tmp_path: Path) -> None:
    done, summary = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == summary
    assert summary["ok"] is True
    assert summary["exact_match"] >= summary["target"] >= 0.5
    assert summary["greedy_agree"] is True and summary["beam_agree"] is True
    assert summary["onnx_exact_match"] == summary["exact_match"]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("weights.safetensors", "onnx/encoder_model.onnx", "onnx/decoder_model.onnx",
                 "onnx/tokenizer.json", "onnx/generation_config.json"):
        assert (tmp_path / name).stat().st_size > 0, name


def test_tokenizer_reads_digits_and_writes_words(tmp_path: Path) -> None:
    """The tokenizer.json beside the ONNX model: "40213" and "4 0 2 1 3" are the source
    digits; a target's ids decode to its words (the specials left out)."""
    import tfgraph.hf.tokenizer
    from tfgraph.generation.settings import read_settings

    task = _task()
    task.write_tokenizer(tmp_path)
    tokenizer = tfgraph.hf.tokenizer.load_tokenizer(tmp_path / "tokenizer.json")
    assert tokenizer.encode("40213").ids == tokenizer.encode("4 0 2 1 3").ids \
        == task.source_ids(40213)
    assert tokenizer.decode(task.target_ids(40213)) == "forty thousand two hundred thirteen"
    settings = read_settings(tmp_path)
    assert (settings.decoder_start_token_id, settings.eos_token_id) == (task.BOS, (task.EOS,))


def test_quick_run_fails_below_its_target(tmp_path: Path) -> None:
    """Undertrained (20 steps), the run must report failure through its exit status."""
    done, summary = _run(tmp_path, "--steps", "20")
    assert done.returncode == 1, done.stdout + done.stderr
    assert summary["ok"] is False and summary["exact_match"] < summary["target"]
