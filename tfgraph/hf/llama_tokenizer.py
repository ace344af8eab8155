"""transformers 5.24's ``LlamaTokenizer`` pipeline, for the folders ``AutoTokenizer`` loads as one.

A model-specific tokenizer class of transformers 5 does not run a folder's tokenizer.json as
it is: ``TokenizersBackend.convert_to_native_format`` takes only its vocabulary, merges,
post-processor and added tokens, and the class's ``__init__`` builds the rest
(``models/llama/tokenization_llama.py``): a byte-fallback BPE without an unknown token, no
normalizer, a ``Metaspace`` pre-tokenizer (prepend scheme ``first``, ``always`` with
``legacy`` true, ``never`` with ``add_prefix_space`` false) and a Replace / ByteFallback /
Fuse (/ Strip) decoder. tokenizer_config.json's ``add_bos_token`` and ``add_eos_token`` are
not read where there is a tokenizer.json (``PreTrainedTokenizerBase._from_pretrained`` drops
them): its post-processor adds what it adds.

``AutoTokenizer`` picks ``LlamaTokenizer`` (``models/auto/tokenization_auto.py``) for a
folder whose tokenizer_config.json names ``tokenizer_class`` LlamaTokenizer(Fast) without an
``auto_map``, whose tokenizer.json is not byte-level (``_tokenizer_json_has_byte_level``),
whose path does not match ``MODEL_IDS_TO_TOKENIZERS_BACKEND``, and whose config.json is
absent, has no ``model_type``, or has one of :data:`LLAMA_MODEL_TYPES`: the model types of
the families tfgraph imports for which transformers 5.24 trusts that class (a model type
registering no tokenizer class, or one whose registered class it lets the folder's
override). Others resolve elsewhere (``mistral``, ``phi3``, ... run tokenizer.json as it is;
``qwen2`` runs ``Qwen2Tokenizer``'s pipeline, which is not rebuilt here) and keep
tokenizer.json's pipeline.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfgraph.errors import TfgraphError
from tfgraph.hf.tokenizer import side_json

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# models/auto/tokenization_auto.py MODEL_IDS_TO_TOKENIZERS_BACKEND (matched against the path)
_BACKEND_IDS = ("deepseek-ai/deepseek-r1-distill-llama-*", "deepseek-ai/deepseek-coder-*",
                "allenai/dolma2-tokenizer", "google/umt5-small", "naver-clova-ix/donut-*",
                "salesforce/blip2-opt-*", "salesforce/blip2-flan-t5-*",
                "salesforce/instructblip-flan-t5-*", "stepfun-ai/step-3.7-*")
# tests/test_prompt_encoding.py checks each against AutoTokenizer
LLAMA_MODEL_TYPES = frozenset((
    "arcee", "bart", "bert", "bloom", "cohere", "cohere2", "deepseek_v2", "deepseek_v3",
    "distilbert", "falcon", "gemma", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "gptj",
    "helium", "llama", "marian", "mbart", "mpt", "olmo", "olmoe", "opt", "pegasus", "phi",
    "qwen2_moe", "qwen3", "qwen3_moe", "roberta", "seed_oss", "starcoder2", "t5",
    "xlm-roberta"))
_DEFAULTS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}


def loads_as_llama(path: Path) -> bool:
    """Whether AutoTokenizer loads the folder of ``path`` (its tokenizer.json) as
    ``LlamaTokenizer`` (the module docstring)."""
    folder = path.parent
    config = side_json(folder, "tokenizer_config.json") or {}
    declared = config.get("tokenizer_class")
    if not isinstance(declared, str) or declared.removesuffix("Fast") != "LlamaTokenizer":
        return False
    if "auto_map" in config or any(fnmatch.fnmatch(str(folder).lower(), pattern)
                                   for pattern in _BACKEND_IDS):
        return False
    model = side_json(folder, "config.json") or {}
    if model.get("model_type") not in (None, "", *LLAMA_MODEL_TYPES):
        return False
    return '"ByteLevel"' not in path.read_bytes().decode("utf-8", errors="replace")


def llama_tokenizer(path: Path, given: Tokenizer) -> Tokenizer:
    """The ``LlamaTokenizer`` transformers builds from tokenizer.json ``path`` (``given``, as
    the tokenizers library loads it), with the tokens the folder's files add."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    from tfgraph.hf.special_tokens import _added_token, _read, added_tokens

    folder = path.parent
    config = side_json(folder, "tokenizer_config.json") or {}
    flags = {key: _flag(config, key, path) for key in
             ("add_prefix_space", "legacy")}
    try:
        model = json.loads(path.read_bytes().decode("utf-8")).get("model") or {}
    except (UnicodeDecodeError, ValueError, RecursionError, AttributeError):
        raise TfgraphError(f"{path}: not a tokenizer.json object") from None
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise TfgraphError(f"{path}: tokenizer_class LlamaTokenizer needs a BPE model with a "
                           "vocabulary; this tokenizer.json has another")
    merges: list[tuple[str, str]] = []
    for merge in model.get("merges", []):  # "a b" (the older layout) or ["a", "b"]
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(pair, list) or len(pair) != 2:
            raise TfgraphError(f"{path}: model.merges: {str(merge)[:40]!r} is not a pair")
        merges.append((str(pair[0]), str(pair[1])))
    try:
        tokenizer = Tokenizer(models.BPE(vocab=model["vocab"], merges=merges, fuse_unk=True,
                                         byte_fallback=True, dropout=None))
    except Exception as err:  # the Rust library raises plain Exception
        raise TfgraphError(f"{path}: its BPE vocabulary and merges do not build a "
                           f"LlamaTokenizer: {str(err)[:120]}") from None
    prefix = flags["add_prefix_space"] is not False  # None: True
    scheme = ("always" if flags["legacy"] else "first") if prefix else "never"
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁",
                                                       prepend_scheme=scheme, split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    tokenizer.decoder = decoders.Sequence(steps)
    tokenizer.post_processor = given.post_processor
    # the added tokens: tokenizer_config.json's added_tokens_decoder, tokenizer.json's in
    # place of those of the same id, in id order; then the named and extra special tokens
    entries, _settings = _read(folder)
    adding: dict[int, AddedToken] = {
        int(key): _added_token(entry, folder / CONFIG, f"added_tokens_decoder: {key}", None)
        for key, entry in entries}
    adding.update(given.get_added_tokens_decoder())
    tokenizer.add_tokens([adding[i] for i in sorted(adding)])
    tokenizer.add_tokens(added_tokens(folder, tokenizer, _DEFAULTS, frozenset(adding)))
    if tokenizer.post_processor is None:  # update_post_processor, add_bos/eos_token unset
        tokenizer.post_processor = processors.TemplateProcessing(single="$A:0",
                                                                 pair="$A:0 $B:1")
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


CONFIG = "tokenizer_config.json"


def _flag(config: dict[str, Any], key: str, path: Path) -> bool | None:
    value = config.get(key)
    if value is not None and not isinstance(value, bool):
        raise TfgraphError(f"{path.parent / CONFIG}: {key}: not true or false")
    return value
