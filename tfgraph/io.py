"""Atomic output files (design §6): a failed write leaves no partial file and keeps the old one.

Write through :func:`atomic_write` (a file object) or :func:`atomic_path` (a temporary path, for
libraries that insist on writing a path themselves, e.g. ``onnx.save`` or ``safetensors``).
Both write a temporary file next to the target and ``os.replace`` it over the target only when
the block finishes without an exception.
"""

from __future__ import annotations

import contextlib
import os
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
        kwargs = {"encoding": encoding} if mode == "w" else {}
        with open(tmp, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            # The data must be on disk before the rename makes it the visible file.
            os.fsync(handle.fileno())
