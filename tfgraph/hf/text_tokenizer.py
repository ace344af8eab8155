"""The tokenizer that encodes a text prompt as transformers 5.24's ``AutoTokenizer`` does."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tfgraph.hf.llama_tokenizer import llama_tokenizer, loads_as_llama
from tfgraph.hf.special_tokens import added_tokens
from tfgraph.hf.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def load_text_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer of ``path`` (a tokenizer.json) as ``AutoTokenizer`` loads its folder:
    :func:`tfgraph.hf.tokenizer.load_tokenizer` (no truncation, no padding), with the tokens
    that the folder's tokenizer_config.json / special_tokens_map.json add
    (tfgraph.hf.special_tokens.added_tokens), or, for a folder loaded as ``LlamaTokenizer``,
    that class's pipeline (tfgraph.hf.llama_tokenizer)."""
    tokenizer = load_tokenizer(path)
    if loads_as_llama(path):
        return llama_tokenizer(path, tokenizer)
    adding = added_tokens(path.parent, tokenizer)
    if adding:
        tokenizer.add_tokens(adding)
    return tokenizer
