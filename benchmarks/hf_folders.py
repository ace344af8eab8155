"""Random Hugging Face model folders for benchmarks/hf_build.py, made with transformers.

A folder is what a user downloads from the hub: ``config.json``, ``model.safetensors`` written
by ``save_pretrained`` (float32, transformers' own random initialisation) and a
``tokenizer.json``. The tokenizer is a real one made with the ``tokenizers`` library (a
word-level model over the config's vocabulary): onnxruntime-genai's builder refuses a folder
without one, and a hand-written JSON file could drift from the format the libraries read.

Folders are cached under benchmarks/.cache/hf/ (git-ignored), keyed by the config and the
transformers version, because making the 200M Llama takes longer than building it. A folder is
made under a temporary name and renamed, so an interrupted run never leaves one half written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED = 0


@dataclass(frozen=True)
class FolderSpec:
    """One model family at one size: the transformers classes and the config's arguments."""

    name: str
    config_class: str  # e.g. "LlamaConfig"
    model_class: str  # e.g. "LlamaForCausalLM"
    config: dict[str, Any] = field(default_factory=dict)
    special_tokens: tuple[str, ...] = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2
    encoder_decoder: bool = False
    tokenizer: str = "word-level"  # or "unigram" (T5's SentencePiece kind; its loader wants it)

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])


T5_TOKENS = ("<pad>", "</s>", "<unk>")  # T5's ids 0, 1, 2
LLAMA = FolderSpec("llama", "LlamaConfig", "LlamaForCausalLM", dict(
    hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4,
    intermediate_size=2816, vocab_size=32000, tie_word_embeddings=False))
MIXTRAL = FolderSpec("mixtral", "MixtralConfig", "MixtralForCausalLM", dict(
    hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
    intermediate_size=1408, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
    tie_word_embeddings=False))
T5 = FolderSpec("t5", "T5Config", "T5ForConditionalGeneration", dict(
    d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128,
    feed_forward_proj="relu", tie_word_embeddings=True), T5_TOKENS, True, "unigram")

QUICK = {
    "llama": FolderSpec("llama", "LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=176, vocab_size=1000, tie_word_embeddings=False)),
    "mixtral": FolderSpec("mixtral", "MixtralConfig", "MixtralForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, vocab_size=1000,
        tie_word_embeddings=False)),
    "t5": FolderSpec("t5", "T5Config", "T5ForConditionalGeneration", dict(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=1000,
        feed_forward_proj="relu", tie_word_embeddings=True), T5_TOKENS, True, "unigram"),
}
FULL = {"llama": LLAMA, "mixtral": MIXTRAL, "t5": T5}


def specs(quick: bool) -> dict[str, FolderSpec]:
    """The three folders' specs: the sizes the results are quoted at, or tiny ones."""
    return QUICK if quick else FULL


def folder(spec: FolderSpec, cache: Path) -> Path:
    """The folder for ``spec`` under ``cache``, made now unless an identical one exists."""
    import transformers

    key = json.dumps([spec.config_class, spec.model_class, spec.config, spec.special_tokens,
                      spec.tokenizer, SEED, transformers.__version__], sort_keys=True)
    path = cache / f"{spec.name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    if (path / "model.safetensors").exists() or (path / "model.safetensors.index.json").exists():
        return path
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _save_model(spec, tmp)
        _save_tokenizer(spec, tmp / "tokenizer.json")
        os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _save_model(spec: FolderSpec, out: Path) -> None:
    """transformers' own random model in float32, saved as safetensors."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    config = getattr(transformers, spec.config_class)(**spec.config)
    torch.manual_seed(SEED)
    model = getattr(transformers, spec.model_class)(config).to(torch.float32).eval()
    model.save_pretrained(out)


def _save_tokenizer(spec: FolderSpec, out: Path) -> None:
    """A tokenizer over exactly the model's vocabulary (special tokens first).

    The kind matters to loaders, not to the builds: transformers' T5 tokenizer class accepts
    only a unigram model, Llama's fast tokenizer any. Unigram scores fall with the id, as
    SentencePiece's do."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokens = [*spec.special_tokens]
    tokens += [f"w{i}" for i in range(len(tokens), spec.vocab_size)]
    unk = next(i for i, t in enumerate(spec.special_tokens) if "unk" in t)
    if spec.tokenizer == "unigram":
        scored = [(t, 0.0 if i < len(spec.special_tokens) else -1.0 - i / len(tokens))
                  for i, t in enumerate(tokens)]
        tokenizer = Tokenizer(models.Unigram(scored, unk_id=unk))
    else:
        vocab = {t: i for i, t in enumerate(tokens)}
        tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=tokens[unk]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(out))


def param_count(path: Path) -> int:
    """Parameters stored in the folder's safetensors files (read from their headers only)."""
    from safetensors import safe_open

    total = 0
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                count = 1
                for dim in f.get_slice(name).get_shape():
                    count *= dim
                total += count
    return total


def weights_bytes(path: Path) -> int:
    """Bytes of the folder's safetensors files: what a builder has to read."""
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))
