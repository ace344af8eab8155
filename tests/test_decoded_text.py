"""The text ``tfgraph generate`` prints equals transformers' ``tokenizer.decode(ids,
skip_special_tokens=True)`` for the same ids: special tokens skipped, and
``clean_up_tokenization_spaces`` from tokenizer_config.json applied where transformers 5
applies it (WordPiece and Unigram tokenizers; not BPE unless forced)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import tfgraph
from tfgraph.cli import main

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["hello", "world", ".", ",", "?", "!", "'", "s", "n't", "re", "spec"]
IDS = [2, 4, 5, 7, 6, 11, 12, 8, 13, 14, 7, 3, 0]  # [CLS] hello world , . ' s ... [SEP] [PAD]


def _folder(tmp_path: Path, kind: str, clean_up: bool, force: bool = False) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    vocab.update({f"w{i}": i for i in range(len(vocab), 256)})
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        tok.decoder = decoders.WordPiece(cleanup=False)  # the clean-up left to the config
    else:
        merges: list[tuple[str, str]] = []
        tok = Tokenizer(models.BPE(vocab, merges, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[PAD]", "[CLS]", "[SEP]"])
    folder = tmp_path / f"{kind}-{clean_up}-{force}"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast",
              "clean_up_tokenization_spaces": clean_up, "pad_token": "[PAD]",
              "cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]"}
    if force:
        config["clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"] = True
    # as transformers saves it: int(1e30), 31 digits (a config.json that size is refused)
    config["model_max_length"] = 1000000000000000019884624838656
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("kind", "clean_up", "force"), [
    ("wordpiece", True, False), ("wordpiece", False, False), ("bpe", True, False),
    ("bpe", True, True)])
def test_decoded_text_is_transformers(tmp_path: Path, kind: str, clean_up: bool,
                                      force: bool) -> None:
    transformers = pytest.importorskip("transformers")
    from tfgraph.hf.tokenizer import cleans_up_spaces, decode_text, load_tokenizer

    folder = _folder(tmp_path, kind, clean_up, force)
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    ours = load_tokenizer(folder / "tokenizer.json")
    want = theirs.decode(IDS, skip_special_tokens=True)
    got = decode_text(ours, IDS, cleans_up_spaces(folder / "tokenizer.json", ours))
    assert got == want
    if kind == "wordpiece":  # the case the clean-up changes
        assert (" ," in got) is not clean_up


def test_generate_prints_transformers_text(tmp_path: Path) -> None:
    """End to end: the --json text of generated tokens is transformers' decode of them."""
    transformers = pytest.importorskip("transformers")
    folder = _folder(tmp_path, "wordpiece", True)
    model = folder / "m.onnx"
    built = CliRunner().invoke(main, ["build", str(ROOT / "specs" / "tiny-llama.yaml"),
                                      "--to", "onnx", "-o", str(model)])
    assert built.exit_code == 0, built.output
    result = tfgraph.generate(model, ["hello world ,"], max_new_tokens=12, eos_token_id=None)
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    assert result.text == [theirs.decode(result.tokens[0], skip_special_tokens=True)]


def test_a_stream_whose_shown_text_changes_prints_the_whole_text(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Clean-up can change text already streamed ("a '" then "a'b": transformers' " ' " ->
    "'"): the stream then ends with the whole text instead of dropping the rest."""
    from tfgraph.commands.generate import _Stream

    texts = {1: "a", 2: "a '", 3: "a'b"}
    stream = _Stream(1, lambda tokens: texts[len(tokens)])
    for token in (1, 2, 3):
        stream(0, token)
    stream.finish([texts[3]])
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "text: a'b", out


def test_a_tokenizer_config_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    """tokenizer_config.json nested past Python's recursion limit: one line naming it,
    exit 2 (it was ``tfgraph: internal error: RecursionError``)."""
    from cli_support import refused, tfgraph

    folder = _folder(tmp_path, "wordpiece", True)
    (folder / "tokenizer_config.json").write_text("[" * 200_000)
    model = folder / "m.onnx"
    built = CliRunner().invoke(main, ["build", str(ROOT / "specs" / "tiny-llama.yaml"),
                                      "--to", "onnx", "-o", str(model)])
    assert built.exit_code == 0, built.output
    refused(tfgraph("generate", str(model), "--prompt", "hello"), "tokenizer_config.json",
            "nested too deeply")
