"""Writing a ``.safetensors`` file one tensor at a time, in bounded memory.

The safetensors package writes a file from a dict holding every tensor (``save_file``): a
model converted from a checkpoint would be held whole. The format is simple enough to stream
(safetensors README, "Format"): 8 bytes, the little-endian length N of a JSON header; the N
header bytes, ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}``, padded with spaces to a multiple of 8 (as the package pads it); then the
tensors' bytes back to back, little-endian, in offset order. Every name, dtype and shape is
known before any value is read, so the header goes first and each tensor follows as it
arrives. Files are written atomically (tfgraph.io); tests read them back with the
safetensors package.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.exporters.onnx.tensors import Value, cast_value, numpy_dtype, write_bytes
from tfgraph.io import atomic_path

CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


@dataclass(frozen=True)
class Entry:
    """One tensor of the file: its name, tfgraph dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return numpy_dtype(self.dtype).itemsize * math.prod(self.shape)


def header(entries: Sequence[Entry], metadata: dict[str, str] | None = None) -> bytes:
    """The length prefix and padded JSON header of a file holding ``entries`` in order."""
    table: dict[str, object] = {}
    if metadata:
        table["__metadata__"] = dict(metadata)
    offset = 0
    for e in entries:
        table[e.name] = {"dtype": CODES[e.dtype], "shape": list(e.shape),
                         "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    text = json.dumps(table, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_safetensors(target: Path, entries: Sequence[Entry],
                      values: Iterable[tuple[str, Value]],
                      metadata: dict[str, str] | None = None,
                      progress: Callable[[int], None] | None = None) -> Path:
    """Write ``values`` ((name, array) in ``entries`` order, any float dtype, or bytes
    copied from a file already in the entry's dtype) as ``entries`` say, casting each
    array to its entry's dtype; atomically. ``progress`` gets each tensor's bytes."""
    with atomic_path(target) as tmp, open(tmp, "wb") as out:
        out.write(header(entries, metadata))
        it = iter(values)
        for e in entries:
            name, value = next(it)
            if name != e.name or tuple(value.shape) != e.shape:
                raise TfgraphError(f"{target}: expected {e.name} {list(e.shape)}, got {name} "
                                   f"{list(value.shape)}")
            array = cast_value(value, e.dtype, e.name)
            write_bytes(out, array)
            if progress:
                progress(array.nbytes)
        out.flush()
        os.fsync(out.fileno())
    return target
