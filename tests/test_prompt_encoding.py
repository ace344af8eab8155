"""A text prompt is encoded as transformers 5.24's ``AutoTokenizer(text)`` encodes it.

- The truncation and padding a tokenizer.json carries are not applied (transformers'
  ``tokenizer(text)`` turns both off): the prompt is neither cut to the saved max_length nor
  padded with pad ids.
- Special tokens that only tokenizer_config.json / special_tokens_map.json name (named,
  model-specific, extra/additional, added_tokens_decoder) are split out of the text with the
  ids transformers gives them on loading.

Each folder is built with the tokenizers library and saved by transformers'
PreTrainedTokenizerFast; the reference is AutoTokenizer loading it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tfgraph.hf.tokenizer import encode_text, load_text_tokenizer

transformers = pytest.importorskip("transformers")

PROMPTS = ["hello world, how are you", "a <|tool|> b <|b|>c<|e|>", "x <img> <aud><pad> y",
           "q <s> <|t2|><|t1|> r <|far|>", "a </s> <x> b", "u <|l|> v <m> w", " two\nlines"]


def byte_level_folder(folder: Path, truncation: dict[str, Any] | None = None,
                      padding: dict[str, Any] | None = None) -> None:
    """A byte-level BPE tokenizer (the 256 byte characters, then <s>, </s>, <x>; <s> an added
    special token), saved by PreTrainedTokenizerFast with the truncation / padding given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    for token in ("<s>", "</s>", "<x>"):
        vocab[token] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<s>"])
    if truncation is not None:
        tokenizer.enable_truncation(**truncation)
    if padding is not None:
        tokenizer.enable_padding(pad_id=vocab["<x>"], pad_token="<x>", **padding)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>").save_pretrained(folder)


def edit_config(folder: Path, changes: dict[str, Any]) -> None:
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def reference_ids(folder: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(folder)(text)["input_ids"])


@pytest.mark.parametrize("truncation,padding", [
    ({"max_length": 3}, None),
    (None, {"length": 40}),
    ({"max_length": 5, "direction": "left"}, {"length": 12}),
])
def test_saved_truncation_and_padding_are_not_applied(
        tmp_path: Path, truncation: dict[str, Any] | None,
        padding: dict[str, Any] | None) -> None:
    byte_level_folder(tmp_path, truncation, padding)
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert (saved["truncation"] is not None) == (truncation is not None)
    assert (saved["padding"] is not None) == (padding is not None)
    tokenizer = load_text_tokenizer(tmp_path / "tokenizer.json")
    for text in (PROMPTS[0], "hi", PROMPTS[-1]):
        want = reference_ids(tmp_path, text)
        assert encode_text(tokenizer, text, "prompt") == want
        assert len(want) == len(text.encode())  # one id a byte: whole, no pad ids


def added(content: str, special: bool = True, **flags: bool) -> dict[str, Any]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special, **flags}


CONFIGS: list[dict[str, Any]] = [
    {"extra_special_tokens": ["<|tool|>", "<|b|>"]},
    {"additional_special_tokens": ["<|b|>", "<|tool|>"], "eos_token": "<|e|>"},
    {"extra_special_tokens": {"image_token": "<img>"}, "audio_token": "<aud>",
     "pad_token": "<pad>"},
    {"added_tokens_decoder": {"259": added("<s>"), "270": added("<|t2|>"),
                              "265": added("<|t1|>", False)}, "eos_token": "<|e|>"},
    {"added_tokens_decoder": {"300": added("<|far|>")}},  # an id past the vocabulary's end
    {"eos_token": "</s>", "unk_token": "<x>"},  # tokens of the vocabulary, not added ones
    {"added_tokens_decoder": {"258": added("<x>", False, normalized=True)},
     "extra_special_tokens": ["<x>"]},
    {"extra_special_tokens": [{"__type": "AddedToken", **added("<|l|>", lstrip=True)}],
     "mask_token": {"__type": "AddedToken", **added("<m>", False, rstrip=True)}},
]


@pytest.mark.parametrize("config", CONFIGS)
def test_special_tokens_named_only_in_tokenizer_config_are_split_out(
        tmp_path: Path, config: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    byte_level_folder(tmp_path)
    edit_config(tmp_path, config)
    tokenizer = load_text_tokenizer(tmp_path / "tokenizer.json")
    reference = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.get_vocab_size() == len(reference)
    split = 0
    for text in PROMPTS:
        want = list(reference(text)["input_ids"])
        assert encode_text(tokenizer, text, "prompt") == want, text
        split += len(text.encode()) - len(want)
    assert split > 0  # some token was split out as one id


def test_generate_encodes_its_prompts_so(tmp_path: Path) -> None:
    """tfgraph.generate's prompts: a config-only special token is one id, a saved truncation
    cuts nothing."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tfgraph.commands.generate_api import prepare

    from test_generate_hf_rules import saved

    saved("llama", tmp_path)  # a vocabulary of 101
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(101)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.enable_truncation(max_length=2)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "extra_special_tokens": ["w5"]}))
    text = "w1 w2w5w3 w4"
    want = reference_ids(tmp_path, text)
    assert want == [1, 2, 5, 3, 4]
    prepared = prepare(tmp_path, [text])
    try:
        assert prepared.prompts == [want]
    finally:
        prepared.opened.close()
