"""A Hugging Face model folder's weights, read lazily and as untrusted input.

The weights are ``model.safetensors``, or shards listed by ``model.safetensors.index.json``
(``weight_map``: tensor name -> shard file name), as ``save_pretrained`` writes them; a folder
holding both is read as transformers reads it, from ``model.safetensors``
(``modeling_utils._get_resolved_checkpoint_files`` looks for the single file first). Opening
a checkpoint reads headers only, through the safetensors package, which checks each header
against its file (offsets that cover the data exactly, sizes that match dtype and shape, a
bounded header); here the index is checked to name only files inside the folder, every shard
it names to exist and hold exactly the tensors it is said to, and no tensor to be in two
files (transformers loads every tensor of every shard, a later copy replacing an earlier one:
which copy is the model's would be an accident of file order). Tensors used must be float32,
float16 or bfloat16 (tfgraph.hf.checkpoint_names; a buffer transformers ignores on load may
be of any dtype). Pickled checkpoints (``pytorch_model.bin``) are refused: loading one can run
arbitrary code.

:meth:`Checkpoint.read` reads one tensor through a handle opened for that read alone.
safetensors memory-maps the file, and the pages of a mapping stay in the process's resident
memory while the mapping lives: one handle kept open over a whole model makes the peak RSS the
model's size (measured: a 1.6 GB file, 1.66 GB peak; one handle per tensor, 90 MB). Opening a
handle costs about a millisecond.
"""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tfgraph.errors import SpecError, TfgraphError
from tfgraph.hf.files import inside, read_json

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
INDEX_MAX_BYTES = 64 << 20  # a real index is ~100 bytes per tensor: 64 MiB is 600k tensors
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.ckpt")
# safetensors dtype code -> tfgraph dtype name
DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# bytes per element of the tfgraph dtypes, and of the other safetensors codes (README,
# "Format"), which are kept under their code until a tensor of one is used
ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "F64": 8, "I64": 8, "U64": 8,
              "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1,
              "F8_E4M3": 1, "F8_E5M2": 1}


class CheckpointError(TfgraphError):
    """A checkpoint folder tfgraph cannot read (exit 2, one line naming the file)."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor is and what its header says it is."""

    file: Path
    dtype: str  # tfgraph dtype name; a safetensors code (I64, ...) for one tfgraph cannot read
    shape: tuple[int, ...]
    offset: int  # of its first byte in the file
    key: str  # its name in the file (a Checkpoint may know it by another: checkpoint_names)

    @property
    def readable(self) -> bool:
        return self.dtype in DTYPES.values()

    @property
    def nbytes(self) -> int:
        return ITEM_BYTES.get(self.dtype, 1) * int(np.prod(self.shape, dtype=np.int64))

    def refuse_unreadable(self) -> None:
        """Refuse this tensor, used as a weight, when tfgraph cannot read its dtype."""
        if not self.readable:
            raise CheckpointError(f"{self.file}: {self.key} is {self.dtype}; tfgraph reads "
                                  "F32, F16 and BF16 weights (quantized checkpoints are not "
                                  "supported)")


def has_weights(folder: Path) -> bool:
    """Whether ``folder`` holds safetensors weights (a single file or an index)."""
    return (folder / WEIGHTS_NAME).exists() or (folder / INDEX_NAME).exists()


class Checkpoint:
    """The tensors of one model folder, by Hugging Face name, read one at a time."""

    def __init__(self, folder: Path, tensors: dict[str, TensorInfo]) -> None:
        self.folder = folder
        self.tensors = tensors

    @classmethod
    def open(cls, folder: str | Path) -> Checkpoint:
        """Check ``folder``'s index and headers (no tensor data is read)."""
        folder = Path(folder)
        single, index = folder / WEIGHTS_NAME, folder / INDEX_NAME
        # transformers' order (os.path.isfile: the single file, then the index); a single
        # file that is there but not a file (a dangling or looping link, a FIFO) and no index
        # is refused by name below
        if single.is_file():
            shards: dict[str, list[str] | None] = {WEIGHTS_NAME: None}
        elif index.exists() or index.is_symlink():
            shards = _index(folder)
        elif single.exists() or single.is_symlink():
            shards = {WEIGHTS_NAME: None}
        else:
            pickled = [name for name in PICKLES if (folder / name).exists()]
            if pickled:
                raise CheckpointError(f"{folder}: {pickled[0]} is a pickled checkpoint, which "
                                      "can run code when loaded; tfgraph reads safetensors "
                                      "only (convert it with safetensors' convert script)")
            raise CheckpointError(f"{folder}: no weights ({WEIGHTS_NAME} or {INDEX_NAME}); "
                                  "--seed N builds with random weights")
        # every file's header, and the index's claims about each, before any claim about
        # tensors it does not list: the first problem named is the one the index makes
        headers = []
        for shard, listed in shards.items():
            path = _weights_file(folder, shard, indexed=listed is not None)
            found = _header(path)
            missing = sorted(set(listed or ()) - set(found))
            if missing:
                raise CheckpointError(f"{path}: the index says {missing[0]} is in this shard, "
                                      f"but it is not ({len(missing)} missing)")
            headers.append((path, found, listed))
        tensors: dict[str, TensorInfo] = {}
        for path, found, _ in headers:
            for name, info in found.items():
                if name in tensors:
                    raise CheckpointError(f"{folder}: {name} is in both "
                                          f"{tensors[name].file.name} and {path.name}; a "
                                          "checkpoint holds each tensor once")
                tensors[name] = info
        for path, found, listed in headers:
            unlisted = sorted(set(found) - set(listed)) if listed is not None else []
            if unlisted:
                more = f"; {len(unlisted)} such tensors" if len(unlisted) > 1 else ""
                raise CheckpointError(f"{index}: the index does not list {unlisted[0]} "
                                      f"(found in {path.name}{more})")
        return cls(folder, tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def dtype(self) -> str:
        """The checkpoint's dtype: the one most of its bytes are in."""
        by_bytes: Counter[str] = Counter()
        for info in self.tensors.values():
            if info.readable:
                by_bytes[info.dtype] += info.nbytes
        return by_bytes.most_common(1)[0][0] if by_bytes else "float32"

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` in its own dtype (bfloat16 as ml_dtypes.bfloat16)."""
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors)
        from safetensors import SafetensorError, safe_open

        info = self.tensors[name]
        try:
            with safe_open(str(info.file), framework="numpy") as handle:
                array: np.ndarray = handle.get_tensor(info.key)
        except (OSError, SafetensorError) as err:  # the file changed since it was opened
            raise CheckpointError(f"{info.file}: cannot read {name}: {err}") from None
        if tuple(array.shape) != info.shape:
            raise CheckpointError(f"{info.file}: {name} changed while it was read")
        return array


@dataclass(frozen=True)
class Verbatim:
    """A parameter whose bytes, in the dtype being written, are byte ranges of checkpoint
    files as they stand (a tensor, rows of a fused one, or one file range per expert of a
    stacked one): :meth:`copy_to` copies them file to file in the kernel
    (``os.copy_file_range``), never through this process's memory. safetensors, ONNX
    ``raw_data`` and numpy's ``tobytes`` on the hosts tfgraph runs on are all little-endian,
    row-major: the bytes are the same."""

    shape: tuple[int, ...]
    dtype: str
    ranges: tuple[tuple[Path, int, int], ...]  # (file, offset, length)

    @property
    def nbytes(self) -> int:
        return sum(length for _, _, length in self.ranges)

    def copy_to(self, out: BinaryIO) -> None:
        """Append the bytes to ``out`` (a file opened for writing, at its end)."""
        out.flush()
        fd = out.fileno()
        for path, offset, length in self.ranges:
            with open(path, "rb") as source:
                done = 0
                while done < length:
                    try:
                        n = os.copy_file_range(source.fileno(), fd, length - done,
                                               offset + done)
                    except (AttributeError, OSError):  # not Linux, or not between these files
                        n = os.write(fd, os.pread(source.fileno(),
                                                  min(length - done, 1 << 24), offset + done))
                    if n == 0:
                        raise CheckpointError(f"{path}: ended early (changed while read)")
                    done += n
        out.seek(0, os.SEEK_END)  # the file object's position follows the descriptor's


def _weights_file(folder: Path, name: str, indexed: bool) -> Path:
    """The weights file ``name`` of ``folder`` (tfgraph.hf.files.inside). When the index named
    it, the index is what is wrong (a path, a link out of the folder, a missing shard), so the
    message names the index and the shard."""
    try:
        return inside(folder, name, "shard" if indexed else "weights file")
    except SpecError as err:
        if not indexed:
            raise
        raise CheckpointError(f"{folder / INDEX_NAME}: {err.message}") from None


def _index(folder: Path) -> dict[str, list[str] | None]:
    """Shard file name -> the tensors the index puts in it."""
    data = read_json(inside(folder, INDEX_NAME, "index"), INDEX_MAX_BYTES, INDEX_NAME)
    where = folder / INDEX_NAME
    weight_map: Any = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{where}: weight_map must map tensor names to shard files")
    shards: dict[str, list[str] | None] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str):
            raise CheckpointError(f"{where}: weight_map.{tensor} must be a file name")
        listed = shards.setdefault(shard, [])
        assert listed is not None
        listed.append(tensor)
    for shard in shards:
        if not shard.endswith(".safetensors"):
            raise CheckpointError(f"{where}: shard {shard!r} is not a .safetensors file")
    return shards


def _header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of one safetensors file, checked by the safetensors package."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            start, spans = _data_offsets(path)  # after safetensors has checked the header
            out = {}
            for name in handle.keys():
                part = handle.get_slice(name)
                code = part.get_dtype()
                out[name] = TensorInfo(path, DTYPES.get(code, code), tuple(part.get_shape()),
                                       start + spans[name], name)
            return out
    except SafetensorError as err:
        raise CheckpointError(f"{path}: not a valid safetensors file: {err}") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read: {err.strerror or err}") from None


def _data_offsets(path: Path) -> tuple[int, dict[str, int]]:
    """Where the data starts and each tensor's offset in it (safetensors README, "Format":
    an 8-byte little-endian header length, the JSON header, then the data). Called only for
    a file the safetensors package has opened, so the header is known to be sound."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return 8 + length, {name: int(entry["data_offsets"][0]) for name, entry in header.items()
                        if name != "__metadata__"}
