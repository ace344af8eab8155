"""Reading a sharded training checkpoint (``torch.distributed.checkpoint``, DCP) without
running code from it.

DCP's own reader runs whatever a crafted folder holds: ``FileSystemReader.read_metadata``
unpickles ``.metadata`` with ``pickle.load``, and ``DefaultLoadPlanner.load_bytes`` reads
every non-tensor entry (the optimizer's ``param_groups``: floats, tuples, booleans) with
``torch.load(weights_only=False)``. :class:`SafeReader` unpickles ``.metadata`` through an
unpickler that builds only the classes DCP's metadata is made of
(torch/distributed/checkpoint/metadata.py and filesystem.py's ``_StorageInfo``), and
:class:`SafePlanner` reads the non-tensor entries with ``weights_only=True`` (plain Python
values); tensors DCP already reads with ``weights_only=True``. Anything else is refused with
a :class:`CheckpointRefused` naming the file, before it is built.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path, PosixPath, PurePath
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata, ChunkStorageMetadata, Metadata, MetadataIndex, StorageMeta,
    TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import ReadItem

from tfgraph.errors import TfgraphError

MAX_METADATA_BYTES = 256 << 20
"""A ``.metadata`` holds one small record per tensor (about 200 bytes): 256 MiB is millions
of tensors; a larger file is not read into memory."""

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED: frozenset[tuple[str, str]] = frozenset({
    # the records DCP pickles (metadata.py): Metadata and the per-entry descriptions in it
    (_DCP_METADATA, "Metadata"), (_DCP_METADATA, "TensorStorageMetadata"),
    (_DCP_METADATA, "TensorProperties"), (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
    (_DCP_METADATA, "ChunkStorageMetadata"), (_DCP_METADATA, "BytesStorageMetadata"),
    (_DCP_METADATA, "MetadataIndex"), (_DCP_METADATA, "StorageMeta"),
    # FileSystemWriter's storage_data: where each entry lies (file, offset, length)
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    # the values in them: shapes, layouts (pickled by name), the checkpoint_id a Path
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
    # Python 3.13 moved the concrete paths to pathlib._local (pathlib re-exports them):
    # FileSystemWriter's checkpoint_id (always a Path: FileSystem.init_path) pickles by
    # that name there. Only PosixPath: DCP writes a WindowsPath on Windows only, which
    # cannot be made on POSIX (torch's own reader fails on it too); no pure paths.
    ("pathlib._local", "PosixPath"),
})
"""(module, name) pairs a genuine ``.metadata`` refers to; dtypes (``torch.float32`` ...)
are allowed too (:func:`_allowed`)."""

_RECORDS: frozenset[type] = frozenset({
    Metadata, TensorStorageMetadata, TensorProperties, ChunkStorageMetadata,
    BytesStorageMetadata, MetadataIndex, StorageMeta, _StorageInfo,
})
"""The classes whose instances a genuine ``.metadata`` sets state on (BUILD): DCP's
dataclasses, made afresh by the unpickler. Never the other allowed globals or what they
return (the function ``_get_layout``, whose ``cache`` attribute torch.load reads; the enum
members of ``_MEM_FORMAT_ENCODING``; ``torch.Size``; paths; dtypes): their state is torch's
for the rest of the process."""


class CheckpointRefused(TfgraphError):
    """A checkpoint folder holds something this reader will not build or read."""


def _allowed(module: str, name: str) -> bool:
    if (module, name) in _ALLOWED:
        return True
    # a dtype pickles as the global torch.<name> (torch.dtype.__reduce__ returns its name)
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


def _described(target: Any) -> str:
    """Names what a BUILD would change, without calling its own code (repr, str)."""
    if isinstance(target, type):
        return f"the class {target.__name__}"
    kind = type(target).__name__
    name = getattr(target, "__qualname__", None) if callable(target) else None
    module = getattr(target, "__module__", None) if callable(target) else None
    if isinstance(name, str) and isinstance(module, str):
        return f"the {kind} {module}.{name}"
    return f"a {kind}"


class _MetadataUnpickler(pickle._Unpickler):
    """Builds only the classes of :data:`_ALLOWED` (and dtypes); pickle's own types (dict,
    list, tuple, str, numbers) need no global. Python's own unpickler (not the C one) so that
    BUILD can be checked too: it is allowed on instances of :data:`_RECORDS` only."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: io.BytesIO, where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module, name):
            raise CheckpointRefused(f"{self.where}: refers to {module}.{name}, which a "
                                    "torch.distributed.checkpoint .metadata does not hold; "
                                    "not unpickled (it could run code)")
        if module == "pathlib._local":  # 3.13's name of pathlib.PosixPath; 3.10-3.12 lack it
            return PosixPath
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointRefused(f"{self.where}: a persistent reference; a "
                                "torch.distributed.checkpoint .metadata has none")

    def _load_build(self) -> None:
        # the stack holds [..., object, state]: DCP's records set state on their own fresh
        # instances only; on anything else (a class, the function _get_layout, an enum
        # member) BUILD would change torch's state for the rest of the process
        stack: list[Any] = self.stack  # type: ignore[attr-defined]  # pickle's, undeclared
        if len(stack) >= 2 and type(stack[-2]) not in _RECORDS:
            raise CheckpointRefused(f"{self.where}: sets attributes of {_described(stack[-2])}"
                                    "; a torch.distributed.checkpoint .metadata sets those "
                                    "of its records only")
        pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]

    dispatch[pickle.BUILD[0]] = _load_build  # type: ignore[assignment]


def read_metadata(file: Path) -> Metadata:
    """The DCP metadata in ``file``, unpickled with only DCP's own classes; a
    :class:`CheckpointRefused` line naming ``file`` for anything else, a damaged file, or an
    entry stored outside the folder."""
    where = os.fspath(file)
    try:
        if file.stat().st_size > MAX_METADATA_BYTES:
            raise CheckpointRefused(f"{where}: larger than {MAX_METADATA_BYTES >> 20} MiB; "
                                    "not a checkpoint's .metadata")
        data = file.read_bytes()
    except OSError as err:
        raise CheckpointRefused(f"{where}: cannot read: {err.strerror or err}") from None
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data), where).load()
    except CheckpointRefused:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, RuntimeError, RecursionError, MemoryError) as err:
        # the classes allowed run only their constructors and __setstate__: a damaged
        # file fails in them or in pickle, never in code of its choosing
        detail = " ".join(str(err).split())[:160] or type(err).__name__
        raise CheckpointRefused(f"{where}: not a torch.distributed.checkpoint .metadata "
                                f"({detail})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointRefused(f"{where}: holds a {type(metadata).__name__}, not a "
                                "torch.distributed.checkpoint Metadata")
    for info in (metadata.storage_data or {}).values():
        # FileSystemWriter names its files __<rank>_<n>.distcp beside .metadata: a path
        # with a folder in it would read a file outside the checkpoint into the model
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or PurePath(name).name != name or name in ("", ".", ".."):
            raise CheckpointRefused(f"{where}: an entry is stored in {name!r}, not in a file "
                                    "of the checkpoint's folder")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file-system reader, its ``.metadata`` read by :func:`read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        # as FileSystemReader.read_metadata: a load id on the storage meta
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor entries as plain values only, and
    refusing a checkpoint with entries the state dict has no place for (DCP's own planner
    refuses only missing ones: a deeper model's checkpoint loaded silently into a shallower
    one, its extra layers dropped)."""

    def create_local_plan(self) -> Any:
        extra = sorted(set(self.metadata.state_dict_metadata) - set(self.state_dict)) \
            if self.metadata is not None else []
        if extra:
            raise CheckpointRefused(f"does not load into this model: {len(extra)} saved "
                                    f"entries it has no place for (first {extra[0]})")
        return super().create_local_plan()

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            first = (str(err).strip().splitlines() or [""])[0][:160]
            raise CheckpointRefused(f"entry {fqn}: not a plain value; not loaded (it could "
                                    f"run code): {first}") from None
        # where DefaultLoadPlanner.load_bytes puts it: the nested state dict when the plan
        # was flattened, else the flat one
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
