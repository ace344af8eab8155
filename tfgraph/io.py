"""Atomic output files (design §6): a failed write leaves no partial file and keeps the old one.

Write through :func:`atomic_write` (a file object) or :func:`atomic_path` (a temporary path, for
libraries that insist on writing a path themselves, e.g. ``onnx.save`` or ``safetensors``).
Both write a temporary file next to the target and ``os.replace`` it over the target only when
the block finishes without an exception.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tfgraph.errors import TfgraphError


def _target(path: str | os.PathLike[str]) -> Path:
    """Check ``path`` can be an output file, with a clear error when it cannot."""
    target = Path(path)
    if target.is_dir():
        raise TfgraphError(f"{target}: is a directory; give a file name")
    if not target.parent.is_dir():
        raise TfgraphError(f"{target}: directory {target.parent} does not exist")
    return target


def check_output(path: str | os.PathLike[str]) -> Path:
    """Refuse (exit 2) an output path that cannot be written, before any work is done."""
    return _target(path)


def available_memory() -> int | None:
    """Bytes of memory the kernel says a new allocation can still get (Linux), else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"


def check_capacity(target: str | os.PathLike[str], disk_bytes: int, memory_bytes: int) -> None:
    """Refuse (exit 2) a write that cannot succeed: ``disk_bytes`` more than the free space
    next to ``target``, or ``memory_bytes`` (held at once while writing) more than the memory
    available. Better one clear line now than minutes of work ending in a full disk or the
    out-of-memory killer. Unknown figures (no such directory, no /proc) are not checked."""
    target = Path(target)
    try:
        free = shutil.disk_usage(target.parent).free
    except OSError:
        free = None
    if free is not None and disk_bytes > free:
        raise TfgraphError(f"{target}: needs {_gb(disk_bytes)} of disk, only {_gb(free)} free "
                           f"in {target.parent}")
    memory = available_memory()
    if memory is not None and memory_bytes > memory:
        raise TfgraphError(f"{target}: needs {_gb(memory_bytes)} of memory to write, only "
                           f"{_gb(memory)} available")


def _mode_for(target: Path) -> int:
    """Keep an existing file's permissions; new files get the usual 0666 & ~umask."""
    try:
        return target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; on success it replaces ``path``.

    The temporary name keeps the target's suffix, so writers that pick a format from the
    extension still work. On an exception the temporary file is removed and re-raised.
    """
    target = _target(path)
    try:
        fd, tmp_name = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name}.", suffix=f".tmp{target.suffix}"
        )
    except OSError as exc:
        raise TfgraphError(f"{target}: cannot write: {exc.strerror or exc}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8"
) -> Iterator[IO[Any]]:
    """Open a temporary file for writing (``mode`` "w" or "wb"); on success it replaces ``path``."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', not {mode!r}")
    with atomic_path(path) as tmp:
        kwargs: dict[str, Any] = {"encoding": encoding} if mode == "w" else {}
        with open(tmp, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            # The data must be on disk before the rename makes it the visible file.
            os.fsync(handle.fileno())
