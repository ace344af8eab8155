"""The byte-level tokenizer (issue 28 item 6): ids are the UTF-8 bytes of the text, and
``tfgraph generate MODEL --prompt TEXT`` reads it from beside the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfgraph.errors import TfgraphError
from tfgraph.hf.tokenizer import byte_level, write_byte_level

from cli_support import tfgraph as run_cli
from conftest import ROOT


@pytest.mark.parametrize("text", ["def f(x):\n    return x", "héllo, 日本 ✓", " \t\x00\x7f", ""])
def test_ids_are_the_bytes_and_decode_back(text: str) -> None:
    tokenizer = byte_level()
    ids = tokenizer.encode(text).ids
    assert ids == list(text.encode())
    assert tokenizer.decode(ids) == text


def test_every_byte_is_one_id() -> None:
    tokenizer = byte_level()
    assert tokenizer.get_vocab_size() == 256
    assert sorted(tokenizer.get_vocab().values()) == list(range(256))
    assert tokenizer.decode([104, 105, 0xE6]) == "hi\ufffd"  # a cut character: U+FFFD
    with pytest.raises(TfgraphError, match="256 ids"):
        byte_level(100)


def test_generate_prompt_text_with_it(tmp_path: Path) -> None:
    spec = ROOT / "examples" / "language-model" / "byte-lm.yaml"
    model = tmp_path / "byte-lm.onnx"
    assert run_cli("build", str(spec), "--to", "onnx", "--kv-cache", "-o",
                   str(model)).returncode == 0
    write_byte_level(tmp_path)
    by_text = run_cli("generate", str(model), "--prompt", "def ", "--max-new-tokens", "6",
                      "--json")
    by_ids = run_cli("generate", str(model), "--prompt-ids", "100,101,102,32",
                     "--max-new-tokens", "6", "--json")
    assert by_text.returncode == 0 and by_ids.returncode == 0, by_text.stderr + by_ids.stderr
    text, ids = json.loads(by_text.stdout), json.loads(by_ids.stdout)
    assert text["tokens"] == ids["tokens"]
    assert text["text"][0] == bytes(ids["tokens"][0]).decode("utf-8", errors="replace")
