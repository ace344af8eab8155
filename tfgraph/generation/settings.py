"""Generation settings a Hugging Face model folder carries: which tokens end a sequence and
which token starts an encoder-decoder target.

``generation_config.json`` is read before ``config.json``, as transformers' ``generate`` does
(its GenerationConfig is loaded from the former and falls back on the latter). Without either
file (a spec), no token ends a sequence (generation runs to ``max_new_tokens``) and targets start
from token 0 (T5's and the seeds' pad id). Both files are read as untrusted input like the rest
of a folder (tfgraph.hf.files).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfgraph.errors import TfgraphError
from tfgraph.hf.files import inside, read_json
from tfgraph.spec.safe_yaml import MAX_BYTES

FILES = ("generation_config.json", "config.json")
DEFAULT_DECODER_START = 0


# generation_config.json keys that change the tokens transformers' generate produces, with
# the value at which they change nothing (GenerationConfig's defaults): tfgraph generate
# applies none of them (its search and length come from its own flags), so a folder that
# sets one is told so rather than decoded differently without a word.
NOT_APPLIED: dict[str, Any] = {
    "do_sample": False, "num_beams": 1, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "max_new_tokens": None, "max_length": 20, "min_new_tokens": None, "min_length": 0,
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "sequence_bias": None,
    "suppress_tokens": None, "begin_suppress_tokens": None, "forced_bos_token_id": None,
    "forced_eos_token_id": None, "forced_decoder_ids": None, "length_penalty": 1.0,
    "exponential_decay_length_penalty": None, "guidance_scale": None, "penalty_alpha": None,
    # stop when the decoded text holds one of these strings / after this many seconds /
    # re-tokenize the prompt's end: each can end or change a greedy sequence too
    "stop_strings": None, "max_time": None, "token_healing": False,
}
# Not listed: renormalize_logits and low_memory change no token by themselves (a softmax
# after the processors listed above; contrastive search's memory), so a note would be noise.
SAMPLING: dict[str, Any] = {
    # read by transformers only when do_sample is true
    "temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None, "typical_p": 1.0,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
}


@dataclass(frozen=True)
class Settings:
    eos_token_id: tuple[int, ...] = ()
    decoder_start_token_id: int = DEFAULT_DECODER_START
    not_applied: tuple[str, ...] = ()
    """``key = value`` of each generation_config.json setting tfgraph generate does not
    apply (``NOT_APPLIED``, and ``SAMPLING`` when it samples)."""

    def note(self) -> str | None:
        """What a user must know about ``not_applied`` (None: nothing)."""
        if not self.not_applied:
            return None
        return (f"generation_config.json: {', '.join(self.not_applied)}: not applied "
                "(tfgraph generate searches as its flags say: greedy unless --temperature, "
                "--top-k, --top-p or --beams; --max-new-tokens tokens)")


def read_settings(folder: Path | None) -> Settings:
    """The settings of ``folder`` (a model folder, or the folder of an .onnx file)."""
    if folder is None:
        return Settings()
    found: dict[str, Any] = {}
    not_applied: tuple[str, ...] = ()
    for name in FILES:
        if not (folder / name).is_file():
            continue
        path = inside(folder, name, "settings file")
        data = read_json(path, MAX_BYTES, name)
        if name == "generation_config.json":
            not_applied = _not_applied(data)
        for key in ("eos_token_id", "decoder_start_token_id"):
            if found.get(key) is None and data.get(key) is not None:
                found[key] = (data[key], path)
    eos: tuple[int, ...] = ()
    if "eos_token_id" in found:
        value, path = found["eos_token_id"]
        items = value if isinstance(value, list) else [value]
        eos = tuple(_token(item, path, "eos_token_id") for item in items)
    start = DEFAULT_DECODER_START
    if "decoder_start_token_id" in found:
        value, path = found["decoder_start_token_id"]
        start = _token(value, path, "decoder_start_token_id")
    return Settings(eos, start, not_applied)


# The token ids transformers' GenerationConfig holds (eos_token_id: one, or a list).
def _not_applied(data: dict[str, Any]) -> tuple[str, ...]:
    """``key = value`` of each setting in ``data`` that would change transformers' tokens
    and that tfgraph generate does not apply."""
    rules = dict(NOT_APPLIED)
    if data.get("do_sample") is True:
        rules.update(SAMPLING)
    return tuple(f"{key} = {_short(data[key])}" for key, default in rules.items()
                 if key in data and data[key] != default)


def _short(value: Any) -> str:
    """A value as the note shows it: JSON's spelling, at most 40 characters."""
    import json

    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


def _token(value: Any, path: Path, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TfgraphError(f"{path}: {key}: {value!r} is not a token id")
    return value
