"""Generation settings a Hugging Face model folder carries: which tokens end a sequence, which
token starts an encoder-decoder target, and the temperature, top-k and top-p that sampling
applies when the user's flags do not set them (as transformers' ``generate(do_sample=True)``).

They come from one file, as transformers 5.24's ``from_pretrained`` loads its GenerationConfig:
``generation_config.json`` when the folder has one, taken as it is (an id it lacks is not
looked up in ``config.json``: transformers does not either); otherwise ``config.json``, as
``GenerationConfig.from_model_config`` reads it (its top-level keys, then for keys still unset
those of its first ``decoder`` / ``generator`` / ``text_config`` object). An encoder-decoder's
targets start at ``decoder_start_token_id``, else ``bos_token_id`` (transformers'
``_prepare_special_tokens``). Without either file (a spec), or where the file names none, no
token ends a sequence (generation runs to ``max_new_tokens``) and targets start from token 0
(T5's and the seeds' pad id; transformers would refuse an encoder-decoder with neither id).
Both files are read as untrusted input like the rest of a folder (tfgraph.hf.files).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfgraph.errors import TfgraphError
from tfgraph.hf.files import beside, read_json
from tfgraph.spec.safe_yaml import MAX_BYTES

GENERATION_CONFIG = "generation_config.json"
MODEL_CONFIG = "config.json"
DEFAULT_DECODER_START = 0
# GenerationConfig.from_model_config: the sub-configs whose keys fill those still unset
TEXT_CONFIGS = ("decoder", "generator", "text_config")


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
    # a watermark's logits bias, DoLa's layer contrast, constrained beam search, lossy
    # (ensembled) speculative decoding
    "watermarking_config": None, "dola_layers": None, "constraints": None,
    "force_words_ids": None, "assistant_ensemble_weight": None,
}
# GenerationConfig's other fields change no token: outputs and caching, a softmax after the
# processors above (renormalize_logits), NaN and inf scores replaced (remove_invalid_values:
# tfgraph refuses NaN and never picks a -inf token), contrastive search's memory, assisted
# decoding that checks its guesses against the model's own choices; a note would be noise.
# early_stopping is applied (Settings.early_stopping).
INERT = frozenset({
    "use_cache", "cache_implementation", "cache_config", "max_cache_len", "compile_config",
    "disable_compile", "continuous_batching_config", "prefill_chunk_size", "low_memory",
    "renormalize_logits", "remove_invalid_values", "num_return_sequences",
    "output_attentions", "output_hidden_states", "output_scores", "output_logits",
    "return_dict_in_generate", "is_assistant", "use_mtp", "num_assistant_tokens",
    "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit",
    "assistant_lookbehind", "target_lookbehind", "speculation_type",
})
SAMPLING: dict[str, Any] = {
    # read by transformers only when it samples; temperature, top_k and top_p are applied
    # (Settings.temperature / top_k / top_p), these are not
    "min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None,
}


@dataclass(frozen=True)
class Settings:
    eos_token_id: tuple[int, ...] = ()
    decoder_start_token_id: int = DEFAULT_DECODER_START
    not_applied: tuple[str, ...] = ()
    """``key = value`` of each setting of the file tfgraph generate does not apply
    (``NOT_APPLIED``; ``SAMPLING``'s are ``sampling_not_applied``)."""
    top_k: int | None = None
    """The file's ``top_k`` (0: no top-k filter); None: transformers' default, 50."""
    temperature: float | None = None
    """The file's ``temperature`` (None: transformers' default, 1.0); checked when sampled."""
    top_p: float | None = None
    """The file's ``top_p`` (None: transformers' default, 1.0, no filter); checked when
    sampled."""
    sampling_not_applied: tuple[str, ...] = ()
    """``key = value`` of the file's ``SAMPLING`` settings, which a sampled run ignores."""
    samples: bool = False
    """The file's ``do_sample`` is true: transformers would sample where tfgraph's flags
    may not."""
    source: str = GENERATION_CONFIG
    """The file the settings came from (named in :meth:`note`)."""
    early_stopping: bool | str = False
    """The file's ``early_stopping`` (True, False or "never"; transformers' default False):
    when beam search ends a prompt (tfgraph.generation.beams)."""

    def note(self, sampled: bool = False) -> str | None:
        """What a user must know about the file's settings a run does not apply (None:
        nothing); ``sampled``: the run samples. A file that samples has its temperature and
        top_p named for a greedy run (transformers would sample with them); a sampled run
        applies them (tfgraph.commands.generate_api.Prepared.sampler)."""
        items = list(self.not_applied)
        if sampled or self.samples:
            items += self.sampling_not_applied
        if self.samples and not sampled:
            items += [f"{key} = {_short(value)}" for key, value in
                      (("temperature", self.temperature), ("top_p", self.top_p))
                      if value is not None and value != 1.0]
        if not items:
            return None
        return (f"{self.source}: {', '.join(items)}: not applied "
                "(tfgraph generate searches as its flags say: greedy unless --temperature, "
                "--top-k, --top-p or --beams, sampling with the file's temperature, top-k and "
                "top-p where the flags leave them; --max-new-tokens tokens)")


def read_settings(folder: Path | None) -> Settings:
    """The settings of ``folder`` (a model folder, or the folder of an .onnx file)."""
    if folder is None:
        return Settings()
    found = _generation_config(folder)
    if found is None:
        return Settings()
    data, path = found
    eos: tuple[int, ...] = ()
    value = data.get("eos_token_id")
    if value is not None:
        items = value if isinstance(value, list) else [value]
        eos = tuple(_token(item, path, "eos_token_id") for item in items)
    start = DEFAULT_DECODER_START
    for key in ("decoder_start_token_id", "bos_token_id"):  # _prepare_special_tokens' order
        if data.get(key) is not None:
            start = _token(data[key], path, key)
            break
    top_k = data.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or top_k < 0):  # TopKLogitsWarper's ValueError
        raise TfgraphError(f"{path}: top_k: {top_k!r} is not a number of tokens (an integer "
                           ">= 0)")
    sampled = tuple(f"{key} = {_short(data[key])}" for key, default in SAMPLING.items()
                    if key in data and data[key] != default)
    early = data.get("early_stopping")
    if early is None:
        early = False
    elif not (isinstance(early, bool) or early == "never"):  # GenerationConfig.validate
        raise TfgraphError(f"{path}: early_stopping: {_short(early)} is not true, false or "
                           '"never"')
    return Settings(eos, start, _not_applied(data), top_k, source=path.name,
                    temperature=_number(data, "temperature", path),
                    top_p=_number(data, "top_p", path), sampling_not_applied=sampled,
                    samples=data.get("do_sample") is True, early_stopping=early)


def _generation_config(folder: Path) -> tuple[dict[str, Any], Path] | None:
    """The settings transformers' ``from_pretrained`` would load from ``folder``, and the file
    they came from: generation_config.json as it is, else config.json's (None: neither)."""
    own = beside(folder, GENERATION_CONFIG, "settings file")
    if own is not None:
        return read_json(own, MAX_BYTES, GENERATION_CONFIG), own
    model = beside(folder, MODEL_CONFIG, "config")
    if model is None:
        return None
    return from_model_config(read_json(model, MAX_BYTES, MODEL_CONFIG)), model


def from_model_config(config: dict[str, Any]) -> dict[str, Any]:
    """GenerationConfig.from_model_config on a config.json mapping: its keys set to a value
    (not null), then each key still unset taken from the first of its ``decoder`` /
    ``generator`` / ``text_config`` objects it has."""
    out = {key: value for key, value in config.items() if value is not None}
    inner = next((config[name] for name in TEXT_CONFIGS if config.get(name)), None)
    if isinstance(inner, dict):
        for key, value in inner.items():
            if out.get(key) is None:
                out[key] = value
    return out


# The token ids transformers' GenerationConfig holds (eos_token_id: one, or a list).
def _not_applied(data: dict[str, Any]) -> tuple[str, ...]:
    """``key = value`` of each ``NOT_APPLIED`` setting in ``data`` that would change
    transformers' tokens."""
    return tuple(f"{key} = {_short(data[key])}" for key, default in NOT_APPLIED.items()
                 if key in data and data[key] != default)


def _number(data: dict[str, Any], key: str, path: Path) -> float | None:
    """The file's ``key`` as a float (None: not set); its range is checked when a run samples
    with it (tfgraph.generation.sampling.Sampler)."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TfgraphError(f"{path}: {key}: {value!r} is not a number")
    return float(value)


def _short(value: Any) -> str:
    """A value as the note shows it: JSON's spelling, at most 40 characters."""
    import json

    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


def _token(value: Any, path: Path, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TfgraphError(f"{path}: {key}: {value!r} is not a token id")
    return value
