"""Do ONNX models built from a Hugging Face folder compute the folder's model?

benchmarks/hf_build.py times builders; this module checks what they built: each ONNX model
runs in onnxruntime (CPU) on the same token ids, and its logits are compared with those of
transformers' own model loaded from the same folder, and with each other. A fast build of the
wrong weights (say, random ones from a seed instead of the folder's) fails here.

Inputs are fed by name, so one routine serves tfgraph's models (``input_ids``, or ``src_ids``
and ``tgt_ids``) and onnxruntime-genai's (``input_ids``, ``attention_mask`` and the KV cache
``past_key_values.{i}.key|value`` ``[batch, kv_heads, past_len, head_dim]``, fed empty: past
length 0, so the model computes the whole prompt as a plain forward pass does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

BATCH, SEQ, TGT_SEQ = 2, 16, 8
SEED = 0

ORT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32,
             "tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass(frozen=True)
class Check:
    """Printable lines, and whether every tfgraph model agrees with transformers."""

    lines: list[str]
    ok: bool


def load_config(folder: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return config


def tolerance(reference: np.ndarray) -> float:
    """fp32 through a dozen layers in two engines: 1e-4 absolute plus 1e-3 of the range."""
    return 1e-4 + 1e-3 * float(np.abs(reference).max())


def compare_onnx(folder: Path, encoder_decoder: bool, models: dict[str, Path]) -> Check:
    """Logits of each labelled ONNX model vs transformers' model of ``folder``."""
    config = load_config(folder)
    rng = np.random.default_rng(SEED)
    ids = {"src": rng.integers(3, config["vocab_size"], (BATCH, SEQ), dtype=np.int64),
           "tgt": rng.integers(3, config["vocab_size"], (BATCH, TGT_SEQ), dtype=np.int64)}
    reference = _transformers_logits(folder, config, ids, encoder_decoder)
    tol = tolerance(reference)
    logits = {label: _onnx_logits(path, config, ids, encoder_decoder)
              for label, path in models.items()}
    lines = [f"logits on {BATCH}x{SEQ} random ids (max |transformers logits| "
             f"{np.abs(reference).max():.3g}, tolerance {tol:.2g}):"]
    ok = "tfgraph" in logits
    for label, values in logits.items():
        diff = float(np.abs(values - reference).max())
        agree = diff <= tol
        ok &= agree or not label.startswith("tfgraph")
        lines.append(f"  max |{label} - transformers| = {diff:.3g}"
                     f"{'' if agree else '  DISAGREE'}")
    for a, b in combinations(logits, 2):
        lines.append(f"  max |{a} - {b}| = {float(np.abs(logits[a] - logits[b]).max()):.3g}")
    if "tfgraph" not in logits:
        lines.append("  (no tfgraph model to check: its build failed)")
    return Check(lines, ok)


def _transformers_logits(folder: Path, config: dict[str, Any], ids: dict[str, np.ndarray],
                         encoder_decoder: bool) -> np.ndarray:
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    model_class = getattr(transformers, config["architectures"][0])
    model = model_class.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        if encoder_decoder:
            out = model(input_ids=torch.from_numpy(ids["src"]),
                        decoder_input_ids=torch.from_numpy(ids["tgt"]))
        else:
            out = model(input_ids=torch.from_numpy(ids["src"]))
    logits: np.ndarray = out.logits.float().numpy()
    del model
    return logits


def _onnx_logits(path: Path, config: dict[str, Any], ids: dict[str, np.ndarray],
                 encoder_decoder: bool) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: _feed(i.name, ORT_TYPES[i.type], config, ids, encoder_decoder)
             for i in session.get_inputs()}
    logits: np.ndarray = session.run(["logits"], feeds)[0]
    return logits.astype(np.float32)


def _feed(name: str, dtype: Any, config: dict[str, Any], ids: dict[str, np.ndarray],
          encoder_decoder: bool) -> np.ndarray:
    """The value for one named graph input (an unknown name is an error, not a guess)."""
    src = ids["src"]
    batch, seq = src.shape
    if name in ("input_ids", "src_ids"):
        return src.astype(dtype)
    if name == "tgt_ids" and encoder_decoder:
        return ids["tgt"].astype(dtype)
    if name == "attention_mask":
        return np.ones((batch, seq), dtype=dtype)
    if name == "position_ids":
        return np.broadcast_to(np.arange(seq, dtype=dtype), (batch, seq)).copy()
    if name.startswith("past_key_values."):
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        return np.zeros((batch, kv_heads, 0, head_dim), dtype=dtype)
    raise ValueError(f"{name}: an ONNX input this check does not know how to feed")


def torch_folder_line(folder: Path, torch_dir: Path) -> tuple[str, bool]:
    """Whether ``--to torch`` wrote the folder's token table (README's ``embed.tokens.weight``),
    not generated values: the cheap check that the torch build read the folder's weights."""
    from safetensors import safe_open

    def table(files: list[Path], suffix: str) -> np.ndarray | None:
        for file in files:
            with safe_open(str(file), framework="numpy") as f:
                for key in f.keys():
                    if key.endswith(suffix):
                        values: np.ndarray = f.get_tensor(key)
                        return values
        return None

    theirs = table(sorted(folder.glob("*.safetensors")), "embed_tokens.weight")
    ours = table([torch_dir / "weights.safetensors"], "embed.tokens.weight")
    if theirs is None or ours is None:
        return "--to torch: no token table to compare", False
    same = theirs.shape == ours.shape and np.array_equal(theirs, ours)
    return (f"--to torch token table {'equals' if same else 'DIFFERS from'} the folder's", same)
