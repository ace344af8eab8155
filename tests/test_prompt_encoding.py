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

from tfgraph.hf.text_tokenizer import load_text_tokenizer
from tfgraph.hf.tokenizer import decode_text, encode_text

transformers = pytest.importorskip("transformers")

PROMPTS = ["hello world, how are you", "a <|tool|> b <|b|>c<|e|>", "x <img> <aud><pad> y",
           "q <s> <|t2|><|t1|> r <|far|>", "a </s> <x> b", "u <|l|> v <m> w", " two\nlines"]


def assert_as_transformers(tokenizer: Any, reference: Any, special: Any, text: str) -> list[int]:
    """``text`` encodes to AutoTokenizer's ids, which decode to its text with and without
    special tokens; the ids."""
    want = list(reference(text)["input_ids"])
    assert encode_text(tokenizer, text, "prompt") == want, text
    assert tokenizer.decode(want, skip_special_tokens=False) == \
        reference.decode(want, skip_special_tokens=False), text
    assert decode_text(tokenizer, want, False, special=special) == \
        reference.decode(want, skip_special_tokens=True), text
    return want


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


# ---- tokenizer_class LlamaTokenizer: transformers' own pipeline, not tokenizer.json's -------

CORPUS = ["hello world, this is a test.", "the quick brown fox jumps over the lazy dog!",
          "don't you think it's nice?", "Ünïcödé text 日本語 emojis 🙂",
          "numbers 12345 and symbols #$%"] * 20
LLAMA_PROMPTS = ["hello world", " two", "  two  spaces", "Hi</s>there", "a <s> b", "<s>x",
                 "x</s>", "Ünïcödé 日本語 🙂", "line\nnext\n\n", "\tTab", "don't", " ",
                 "a  <s>  b", "</s> lead", "<unk> u", "a <|tool|>b", "▁x ▁", "\n lead nl"]


def llama2_folder(folder: Path, config: dict[str, Any], model_type: str | None = "llama",
                  byte_level: bool = False) -> None:
    """A tokenizer.json laid out as Llama 2's (normalizer Prepend("▁") + Replace(" ", "▁"),
    no pre-tokenizer, byte-fallback BPE, a template adding <s>), saved by
    PreTrainedTokenizerFast, with ``config`` in tokenizer_config.json and ``model_type`` in
    config.json (none: no config.json)."""
    from tokenizers import (Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors, trainers)
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                                 normalizers.Replace(" ", "▁")])
    if byte_level:  # Llama 3's layout, still declaring LlamaTokenizer
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                           decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400,
                                                              special_tokens=specials))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    edit_config(folder, {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, **config})
    if model_type is not None:
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))


@pytest.mark.parametrize("config", [
    {"legacy": False}, {"legacy": True}, {}, {"tokenizer_class": "LlamaTokenizerFast"},
    {"legacy": True, "add_eos_token": True}, {"add_prefix_space": False},
    {"add_prefix_space": False, "legacy": True},
    {"legacy": True, "extra_special_tokens": ["<|tool|>"], "pad_token": "<pad>"},
])
def test_a_llama_tokenizer_class_encodes_and_decodes_as_transformers(
        tmp_path: Path, config: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    from tfgraph.hf.special_tokens import special_ids

    llama2_folder(tmp_path, config)
    reference = AutoTokenizer.from_pretrained(tmp_path)
    assert type(reference).__name__ == "LlamaTokenizer"
    tokenizer = load_text_tokenizer(tmp_path / "tokenizer.json")
    special = special_ids(tmp_path / "tokenizer.json", tokenizer)
    for text in LLAMA_PROMPTS:
        assert_as_transformers(tokenizer, reference, special, text)
    # tokenizer.json's own pipeline differs: the leading space and the text after a special
    # token are split otherwise
    from tfgraph.hf.tokenizer import load_tokenizer

    as_saved = load_tokenizer(tmp_path / "tokenizer.json")
    assert any(as_saved.encode(text).ids != reference(text)["input_ids"]
               for text in LLAMA_PROMPTS)


def test_which_folders_load_as_a_llama_tokenizer(tmp_path: Path) -> None:
    """tfgraph.hf.llama_tokenizer's resolution against AutoTokenizer's: each model type of
    LLAMA_MODEL_TYPES, some that resolve elsewhere, none, and a byte-level tokenizer.json."""
    from transformers import AutoTokenizer

    from tfgraph.hf.llama_tokenizer import LLAMA_MODEL_TYPES, loads_as_llama

    llama2_folder(tmp_path / "base", {"legacy": False}, None)
    cases: list[tuple[str | None, bool]] = [(t, False) for t in sorted(LLAMA_MODEL_TYPES)]
    cases += [(t, False) for t in ("mistral", "qwen2", "phi3", "mixtral", "stablelm")]
    cases += [(None, False), ("llama", True)]
    for index, (model_type, byte_level) in enumerate(cases):
        folder = tmp_path / f"m{index}"
        if byte_level:
            llama2_folder(folder, {}, model_type, byte_level=True)
        else:
            import shutil

            shutil.copytree(tmp_path / "base", folder)
            if model_type is not None:
                (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        want = type(AutoTokenizer.from_pretrained(folder)).__name__ == "LlamaTokenizer"
        assert loads_as_llama(folder / "tokenizer.json") == want, (model_type, byte_level)
        if model_type == "qwen2":  # Qwen2Tokenizer's pipeline: not rebuilt (README)
            continue
        text = "Hi</s>there  two"
        assert encode_text(load_text_tokenizer(folder / "tokenizer.json"), text, "p") == \
            reference_ids(folder, text), (model_type, byte_level)


# ---- tokenizer_class GemmaTokenizer / Qwen2Tokenizer: folders laid out as the checkpoints ----
# transformers 5.24 rebuilds both classes' pipelines (models/gemma/tokenization_gemma.py,
# models/qwen2/tokenization_qwen2.py); for the layouts Gemma 1/2/3 and Qwen2/2.5/3 ship, the
# rebuilt pipeline is the tokenizer.json's, which tfgraph runs as it is.

CHECKPOINT_PROMPTS = [
    "hello world", " lead", "trail ", "  two  spaces  ", "a\nb\n\n", "\tTab\t x", "a   \n\n  b",
    "Ünïcödé 日本語 🙂", "café naïve", "cafe\u0301 nai\u0308ve", "e\u0301", "ÅΩ ﬁ ①", "12345 678",
    "don't DON'T 's 've", "日本語の文章です。中文", "👍🏽👨\u200d👩\u200d👧", " ", "▁x ▁",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<bos>x<eos>",
    "a <pad> <unk> b <mask>", "<start_of_image><image_soft_token><end_of_image>",
    "<|im_start|>system\nYou are.<|im_end|>\n<|im_start|>user\nhi<|im_end|>",
    "x<|endoftext|>y", "<tool_call>\n{}</tool_call>", "a<|fim_prefix|>b", "<think>\n</think>"]
CHECKPOINT_CORPUS = [
    "hello world, this is a test.", "the quick brown fox jumps over the lazy dog!",
    "don't you think it's nice?", "Ünïcödé text 日本語 emojis 🙂", "numbers 12345 and #$%",
    "  indented\n\tcode()\n", "café naïve"] * 20


def gemma_folder(folder: Path, model_type: str) -> None:
    """Gemma's layout: normalizer Replace(" ", "▁"), no pre-tokenizer, a byte-fallback BPE
    with <unk>, a Replace / ByteFallback / Fuse decoder, a template adding <bos>; <pad> <eos>
    <bos> <unk> <mask> first, <start_of_turn> / <end_of_turn> (and Gemma 3's image tokens)
    added; tokenizer_config.json GemmaTokenizer with add_bos_token."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                           decoders.Fuse()])
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + \
        [f"<0x{i:02X}>" for i in range(256)]
    tokenizer.train_from_iterator([text.replace(" ", "▁") for text in CHECKPOINT_CORPUS],
                                  trainers.BpeTrainer(vocab_size=500, special_tokens=specials))
    turns = ["<start_of_turn>", "<end_of_turn>"]
    images = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    tokenizer.add_special_tokens(turns + (images if model_type == "gemma3_text" else []))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                            unk_token="<unk>", pad_token="<pad>",
                            additional_special_tokens=turns).save_pretrained(folder)
    config: dict[str, Any] = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True,
                              "add_eos_token": False, "clean_up_tokenization_spaces": False,
                              "spaces_between_special_tokens": False}
    if model_type == "gemma3_text":
        config.update(boi_token="<start_of_image>", eoi_token="<end_of_image>",
                      image_token="<image_soft_token>")
    edit_config(folder, config)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))


QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen2_folder(folder: Path, model_type: str) -> None:
    """Qwen2's layout: normalizer NFC, Split(Qwen's regex) + ByteLevel(no prefix space, no
    regex), a byte-level BPE without <unk>, ByteLevel decoder and post-processor (no BOS);
    <|endoftext|> <|im_start|> <|im_end|> <|fim_prefix|> special, <tool_call> </tool_call>
    (and Qwen3's <think> </think>) added as plain tokens; tokenizer_config.json
    Qwen2Tokenizer, bos and unk null."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)])
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, use_regex=False,
                                           trim_offsets=False)
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, use_regex=False,
                                                    trim_offsets=False)
    tokenizer.train_from_iterator(CHECKPOINT_CORPUS, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    chat = ["<|im_start|>", "<|im_end|>"]
    tokenizer.add_special_tokens(["<|endoftext|>", *chat, "<|fim_prefix|>"])
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"] +
                         (["<think>", "</think>"] if model_type == "qwen3" else []))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                            pad_token="<|endoftext|>",
                            additional_special_tokens=chat).save_pretrained(folder)
    edit_config(folder, {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None,
                         "unk_token": None, "errors": "replace", "add_prefix_space": False,
                         "split_special_tokens": False, "clean_up_tokenization_spaces": False})
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))


@pytest.mark.parametrize("build,model_type,class_name", [
    (gemma_folder, "gemma", "GemmaTokenizer"), (gemma_folder, "gemma2", "GemmaTokenizer"),
    (gemma_folder, "gemma3_text", "GemmaTokenizer"), (qwen2_folder, "qwen2", "Qwen2Tokenizer"),
    (qwen2_folder, "qwen3", "Qwen2Tokenizer"), (qwen2_folder, "qwen2_moe", "Qwen2Tokenizer"),
])
def test_gemma_and_qwen2_checkpoint_folders_encode_and_decode_as_transformers(
        tmp_path: Path, build: Any, model_type: str, class_name: str) -> None:
    from transformers import AutoTokenizer

    from tfgraph.hf.special_tokens import special_ids

    build(tmp_path, model_type)
    reference = AutoTokenizer.from_pretrained(tmp_path)
    assert type(reference).__name__ == class_name
    tokenizer = load_text_tokenizer(tmp_path / "tokenizer.json")
    assert tokenizer.get_vocab_size() == len(reference)
    special = special_ids(tmp_path / "tokenizer.json", tokenizer)
    split = 0
    for text in CHECKPOINT_PROMPTS:
        want = assert_as_transformers(tokenizer, reference, special, text)
        split += sum(token.startswith("<") and token.endswith(">") and len(token) > 4
                     for token in reference.convert_ids_to_tokens(want))
    assert split >= 8  # the chat / turn / tool tokens in the text were split out as ids
