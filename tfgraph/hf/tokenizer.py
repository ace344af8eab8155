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
