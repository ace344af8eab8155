"""A model folder's tokenizer files: found, checked, carried with built artifacts, loaded.

Only files of the ``tokenizers`` library's format are used (``tokenizer.json``; the other
files carry settings transformers and onnxruntime-genai read: special tokens, chat template,
generation defaults). Each is read as untrusted input like the rest of the folder
(tfgraph.hf.files.inside): only from within it, size-limited, and ``tokenizer.json`` must load
with ``tokenizers`` before it is copied anywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tfgraph.errors import TfgraphError
from tfgraph.hf.files import inside

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_JSON = "tokenizer.json"
FILES = (TOKENIZER_JSON, "tokenizer_config.json", "special_tokens_map.json",
         "generation_config.json")
MAX_BYTES = 256 << 20  # the largest real tokenizer.json files are tens of MB


def tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer files of ``folder`` (none when it has no ``tokenizer.json``)."""
    if not (folder / TOKENIZER_JSON).exists() and not (folder / TOKENIZER_JSON).is_symlink():
        return []
    found = []
    for name in FILES:
        if not (folder / name).exists() and not (folder / name).is_symlink():
            continue
        path = inside(folder, name, "tokenizer file")
        if path.stat().st_size > MAX_BYTES:
            raise TfgraphError(f"{path}: larger than {MAX_BYTES >> 20} MiB; not a tokenizer file")
        found.append(path)
    load_tokenizer(found[0])  # refuse a tokenizer.json the library cannot read, now
    return found


def load_tokenizer(path: Path) -> Tokenizer:
    """The ``tokenizers`` tokenizer in ``path`` (a tokenizer.json); one line when it is not."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TfgraphError("text prompts need the tokenizers package "
                           "(pip install tokenizers)") from None
    if path.stat().st_size > MAX_BYTES:
        raise TfgraphError(f"{path}: larger than {MAX_BYTES >> 20} MiB; not a tokenizer file")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust library raises plain Exception for any bad file
        detail = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise TfgraphError(f"{path}: not a tokenizer.json the tokenizers library reads: "
                           f"{detail}") from None


def copy_files(files: list[Path], folder: Path) -> list[Path]:
    """Copy ``files`` into ``folder`` atomically, each replacing any file of that name."""
    from tfgraph.io import atomic_path, check_side_file

    pending = [(folder / source.name, source.read_bytes()) for source in files]
    # Every name is checked before any is written: a file of that name that tfgraph did not
    # write (other content) is refused, never replaced (tfgraph.io.check_side_file).
    needed = [(target, data) for target, data in pending if check_side_file(target, data)]
    for target, data in needed:
        with atomic_path(target) as tmp:
            tmp.write_bytes(data)
    return [target for target, _data in pending]


def byte_level(vocab_size: int = 256) -> Tokenizer:
    """A tokenizer whose ids are the UTF-8 bytes of the text (id = byte value), for byte-level
    models (examples/language-model): GPT-2's byte-to-character table, no merges, decoding
    back to the bytes (invalid UTF-8 shows as U+FFFD). ``vocab_size`` >= 256; ids past 255
    are left for special tokens the model may have."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if vocab_size < 256:
        raise TfgraphError(f"a byte-level tokenizer needs 256 ids, the vocabulary has "
                           f"{vocab_size}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 characters standing for bytes
    table = _byte_characters()
    assert sorted(alphabet) == sorted(table)
    tokenizer = Tokenizer(models.BPE({ch: b for b, ch in enumerate(table)}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _byte_characters() -> list[str]:
    """GPT-2's byte-to-character table (the one ``tokenizers``' ByteLevel uses): printable
    Latin-1 bytes stand for themselves, the rest map to characters from U+0100 on, in order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = [], 0
    for b in range(256):
        if b in keep:
            table.append(chr(b))
        else:
            table.append(chr(256 + extra))
            extra += 1
    return table


def write_byte_level(folder: Path, vocab_size: int = 256) -> Path:
    """Write :func:`byte_level`'s ``tokenizer.json`` into ``folder`` (beside a model, where
    ``tfgraph generate --prompt`` reads it); returns its path."""
    from tfgraph.io import atomic_write

    target = folder / TOKENIZER_JSON
    with atomic_write(target) as out:
        out.write(byte_level(vocab_size).to_str())
    return target
