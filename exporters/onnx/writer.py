"""Writing an ONNX model file whose weights are streamed, one parameter at a time.

``onnx.save`` would need the whole model, weights included, as one protobuf message in memory
plus its serialized copy (twice the weights), and protobuf refuses messages over 2 GiB. Here the
model is serialized without its initializers, and each parameter is appended to the file as it
arrives, its bytes written straight from the array's memory. The framing that makes this a
valid ``ModelProto`` is explained below. Models whose weights pass protobuf's limit keep them in
a side file (ONNX "external data") instead.

Every file is written through ``tfgraph.io.atomic_path``: no partial file is ever visible under
the target's name, an old file survives a failure, and an interrupted write (Ctrl-C, SIGTERM)
removes its temporary files.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto

from tfgraph.errors import TfgraphError
from tfgraph.exporters.onnx.tensors import Value, cast_value, tensor_header, write_bytes
from tfgraph.io import after_publish, atomic_path, check_not_input, remove_stale_temps
from tfgraph.terminal import printable, short_path

# (name, dtype, float32 value) of each parameter, in the order they become initializers.
Values = Iterable[tuple[str, str, Value]]
Progress = Callable[[int], None] | None

# ---- protobuf framing ------------------------------------------------------------------------
#
# The file is ``bytes(model without initializers)`` followed by one chunk per parameter, each
# chunk itself an encoded ``ModelProto`` holding nothing but ``graph.initializer = [tensor]``.
# That this parses as the model with all its initializers follows from the protobuf wire
# format, as the Protocol Buffers documentation's "Encoding" page
# (protobuf.dev/programming-guides/encoding) describes it:
#
# - "Message Structure": an encoded message is a sequence of records, each a tag followed by a
#   value; the tag is the varint ``(field_number << 3) | wire_type``.
# - "Base 128 Varints": an unsigned integer in groups of 7 bits, least significant group first,
#   each byte's high bit set when more bytes follow (``_varint``).
# - "Length-Delimited Records": wire type 2 (LEN), used by strings, bytes and embedded
#   messages, is the tag, the payload's length as a varint, then the payload
#   (``_field_header`` writes the first two).
# - "Last One Wins": when a non-repeated embedded message field occurs more than once, parsers
#   merge the occurrences (as ``MergeFrom``: repeated fields are concatenated), so parsing the
#   concatenation of two encoded messages equals parsing both and merging them.
#
# Hence each chunk merges into the model's ``graph`` and appends one entry to its repeated
# ``initializer`` field, in file order. One chunk, with the field numbers of onnx.proto (the
# ONNX repository's schema; tests check them against onnx's own descriptors):
#
#   tag(ModelProto.graph = 7, LEN)         varint(len(graph record below))
#     tag(GraphProto.initializer = 5, LEN)   varint(len(tensor below))
#       TensorProto name, data_type, dims       (serialized by protobuf: ``tensor_header``)
#       tag(TensorProto.raw_data = 9, LEN)      varint(nbytes), then the array's nbytes
#
# Every length is known before the raw bytes are written (header size + nbytes), which is what
# lets the array's memory go to the file without being copied into a message first. raw_data
# is little-endian, as ONNX specifies and as onnx itself assumes of its hosts.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
_LEN = 2  # wire type of length-delimited records


def _varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf Base 128 varint."""
    if n < 0:
        raise ValueError(f"varint of a negative number {n}")
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field_header(number: int, length: int) -> bytes:
    """The tag and length of a length-delimited record of field ``number``."""
    return _varint(number << 3 | _LEN) + _varint(length)


def _append_initializer(out: BinaryIO, header: TensorProto, array: Value) -> None:
    """Append ``header`` with ``array``'s bytes as raw_data as one initializer chunk."""
    nbytes = array.nbytes
    tensor = header.SerializeToString() + _field_header(_TENSOR_RAW_DATA, nbytes)
    graph = _field_header(_GRAPH_INITIALIZER, len(tensor) + nbytes) + tensor
    out.write(_field_header(_MODEL_GRAPH, len(graph) + nbytes) + graph)
    write_bytes(out, array)


# ---- external data ---------------------------------------------------------------------------

EXTERNAL_ALIGNMENT = 4096  # page-aligned offsets let runtimes mmap each tensor


def _write_external(tensor: TensorProto, array: Value, data: BinaryIO,
                    location: str) -> None:
    """Append ``array``'s bytes to the open data file and point ``tensor`` at them (the keys
    of ONNX's external data: location relative to the model, offset, length)."""
    offset = data.tell()
    pad = -offset % EXTERNAL_ALIGNMENT
    if pad:
        data.write(b"\0" * pad)
        offset += pad
    write_bytes(data, array)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(array.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


# ---- files -----------------------------------------------------------------------------------


def external_data_path(target: Path) -> Path:
    """Where a model's external weights go: ``<target>.data`` next to it."""
    return target.with_name(target.name + ".data")


@contextlib.contextmanager
def _write_errors(target: Path) -> Iterator[None]:
    """A full disk or a vanished directory is the user's to fix: one line, exit 2."""
    try:
        yield
    except OSError as err:
        raise TfgraphError(f"{printable(str(target))}: cannot write: "
                           f"{err.strerror or err}") from None


MAX_MODEL_READ = 64 * 1024 * 1024
"""Bytes of an existing model file read to learn whether ``<target>.data`` is its weights
file. A model keeping its weights outside holds only the graph and the tensors' headers (a
few MB for hundreds of layers); a bigger file keeps its weights inside, so no ``.data`` file
is its own (reading it whole would cost minutes for nothing)."""


def _names_its_data(target: Path, data_name: str) -> bool:
    """Whether ``target`` is a model tfgraph wrote whose initializers keep their bytes in the
    file ``data_name`` beside it (ONNX external data: the ``location`` key). Only the model's
    own protobuf is parsed, never the data file, and only when it is at most MAX_MODEL_READ."""
    try:
        info = os.stat(target)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MODEL_READ:
            return False
        model = onnx.load_model(str(target), load_external_data=False)
    except Exception:  # noqa: BLE001 - anything unreadable is not a model of ours
        return False
    if model.producer_name != "tfgraph":
        return False
    return any(t.data_location == TensorProto.EXTERNAL
               and any(e.key == "location" and e.value == data_name for e in t.external_data)
               for t in model.graph.initializer)


def check_data_file(target: str | os.PathLike[str]) -> tuple[int, int] | None:
    """Refuse (exit 2) a ``<target>.data`` that writing ``target`` would replace or remove
    but that is not the weights file of the tfgraph model at ``target`` now (a file of the
    user's that happens to have the name, or an input of this command), before any work.
    Returns the (device, inode) of the old model's weights file, which a rebuild may
    replace or remove, or None when there is none."""
    target = Path(target)
    data = external_data_path(target)
    try:
        info = os.lstat(data)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TfgraphError(f"{short_path(data)}: cannot read: {exc.strerror or exc}") from None
    check_not_input(data)
    if stat.S_ISREG(info.st_mode) and _names_its_data(target, data.name):
        return info.st_dev, info.st_ino
    raise TfgraphError(f"{short_path(data)}: exists and is not the weights file of a tfgraph "
                       f"model {short_path(target.name, 60)}; tfgraph does not replace or "
                       "remove files it did not write: remove it or write to another name")


def write_model(model: onnx.ModelProto, values: Values, target: Path, external: bool = False,
                progress: Progress = None) -> Path:
    """Write ``model`` (no initializers yet) with ``values`` as its initializers to ``target``.

    ``external``: the weights go to ``<target>.data`` (page-aligned) and the model points at
    them. ``progress`` is called with the bytes of each parameter written. An existing
    ``<target>.data`` is replaced (external) or removed (single file: nothing would point at
    it) only when it is the weights file of the tfgraph model being replaced; anything else
    of that name is refused before a byte is written (:func:`check_data_file`).
    """
    data_target = external_data_path(target)
    old_data = check_data_file(target)
    if not external:
        remove_stale_temps(data_target)  # left by an earlier external build that was killed
        with atomic_path(target) as tmp, _write_errors(target), open(tmp, "wb") as out:
            out.write(model.SerializeToString())  # everything but the weights
            for name, dtype, value in values:
                array = cast_value(value, dtype, name)
                _append_initializer(out, tensor_header(name, array, dtype), array)
                if progress:
                    progress(array.nbytes)
            out.flush()
            os.fsync(out.fileno())
        # The model just replaced kept its weights in <target>.data; nothing points at that
        # file any more, and leaving it would sit next to the new model as if it belonged to
        # it (once the new model is in place: see tfgraph.io.publish_together). Only that very
        # file goes: one put there since the check above is left alone.
        def remove_old_data() -> None:
            with contextlib.suppress(FileNotFoundError):
                info = os.lstat(data_target)
                if (info.st_dev, info.st_ino) == old_data and stat.S_ISREG(info.st_mode):
                    data_target.unlink()

        if old_data is not None:
            after_publish(remove_old_data)
        return target
    with atomic_path(data_target) as tmp_data, atomic_path(target) as tmp_model, \
            _write_errors(target):
        with open(tmp_data, "wb") as data:
            for name, dtype, value in values:
                array = cast_value(value, dtype, name)
                header = tensor_header(name, array, dtype)
                _write_external(header, array, data, data_target.name)
                model.graph.initializer.append(header)
                if progress:
                    progress(array.nbytes)
            data.flush()
            os.fsync(data.fileno())
        with open(tmp_model, "wb") as out:
            out.write(model.SerializeToString())
            out.flush()
            os.fsync(out.fileno())
    return target
