"""A folder that appears whole or not at all (``--to torch`` and ``--to hf`` outputs).

Everything is written into a temporary sibling directory, which then replaces the target with
renames: a failed or interrupted build leaves the old folder as it was and no partial one. The
target must be new, empty, or hold only names this kind of folder writes; and once the new
folder is staged, each file in the target must be one the previous build recorded writing
(unchanged since, :data:`MARKER`) or one this build writes with the same bytes. Anything else
(a tokenizer.json the user added) is refused by name rather than deleted.
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path

from tfgraph.errors import TfgraphError


MARKER = ".tfgraph-output"
"""A file in every folder tfgraph builds: a later build may replace only such a folder (or an
empty one), never one of the same file names that tfgraph did not write. It records the files
the build wrote, each with its size, modification time and SHA-256 (:func:`_record`): a file
there that is not recorded, or was changed since, is the user's (:func:`_check_replaceable`).
The digest vouches for a file whose modification time alone changed (the folder copied with
``cp -r``, restored from a tar). Written empty first (a killed build's staging is told from a
folder of the user's by it), filled last. An empty one is an earlier tfgraph's, which recorded
nothing; one of [size, mtime_ns] pairs (before digests) vouches by size and time only."""

MAX_MARKER_BYTES = 1 << 20
"""A record lists a few dozen files (about 150 bytes each); a larger mark is not read."""

_CHUNK = 1 << 20
"""Files are digested a MiB at a time: a weights file is never read into memory whole."""


def check_target(out_dir: Path, names: Collection[str], kind: str) -> None:
    """Refuse ``out_dir`` unless it is new, empty or holds only ``names`` (a ``kind``)."""
    if not out_dir.parent.is_dir():
        raise TfgraphError(f"{out_dir}: directory {out_dir.parent} does not exist")
    from tfgraph.io import check_not_input

    check_not_input(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise TfgraphError(f"{out_dir}: exists and is not a directory; this target writes a "
                           "folder")
    if out_dir.is_dir():
        present = [p.name for p in out_dir.iterdir()]
        foreign = sorted(n for n in present if n not in names and n != "__pycache__"
                         and n != MARKER)
        if foreign:
            raise TfgraphError(f"{out_dir}: not a {kind} (has {', '.join(foreign[:3])}"
                               f"{', ...' if len(foreign) > 3 else ''}); choose a new or empty "
                               "directory")
        if present and MARKER not in present:
            # The right names, but not written by tfgraph (a downloaded checkpoint, a
            # hand-made folder): replacing it would lose files tfgraph did not write.
            raise TfgraphError(f"{out_dir}: a folder tfgraph did not write (no {MARKER}); "
                               "choose a new or empty directory")


@contextlib.contextmanager
def staged_folder(out_dir: Path, names: Collection[str], kind: str) -> Iterator[Path]:
    """Yield a temporary folder to fill; on success it replaces ``out_dir``."""
    remove_stale_stages(out_dir, names)
    check_target(out_dir, names, kind)
    try:
        stage = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    except OSError as exc:
        raise TfgraphError(f"{out_dir}: cannot write: {exc.strerror or exc}") from None
    lock = _locked(stage)  # held while we write: another build's clean-up leaves it alone
    try:
        # Marked from the start, not at the end: a build killed while writing leaves a stage
        # the next build can tell from a folder of the user's of the same name.
        (stage / MARKER).touch()
        yield stage
        _record(stage)
        _check_replaceable(out_dir, stage, kind)
        umask = _umask()
        for path in stage.iterdir():  # on disk before the rename makes the folder visible
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
            os.chmod(path, 0o666 & ~umask)
        os.chmod(stage, 0o777 & ~umask)
        _swap_in(stage, out_dir)
    except OSError as exc:
        shutil.rmtree(stage, ignore_errors=True)
        raise TfgraphError(f"{out_dir}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            os.close(lock)


def _record(stage: Path) -> None:
    """Fill ``stage``'s MARKER with the files written: name -> [size, mtime_ns, sha256 hex].
    Renames keep all three, so the folder swapped in still matches (chmod and fsync change
    neither); a copy keeps size and digest."""
    wrote: dict[str, list[int | str]] = {}
    for path in sorted(stage.iterdir()):
        info = path.lstat()
        if path.name != MARKER and stat.S_ISREG(info.st_mode):
            digest = _digest(path)
            if digest is None:
                raise OSError(f"cannot read back {path.name}")
            wrote[path.name] = [info.st_size, info.st_mtime_ns, digest]
    (stage / MARKER).write_text(json.dumps({"tfgraph_wrote": wrote}, indent=1) + "\n",
                                encoding="utf-8")


Recorded = tuple[int, int, str | None]
"""What a mark records of a file: size, mtime_ns and its SHA-256 (None in a mark written
before digests)."""


def _recorded(out_dir: Path) -> dict[str, Recorded] | None:
    """What the MARKER in ``out_dir`` records (name -> :data:`Recorded`); None for an empty
    mark (an earlier tfgraph's, recording nothing) and {} for one that cannot be read."""
    try:
        with open(out_dir / MARKER, "rb") as handle:
            data = handle.read(MAX_MARKER_BYTES + 1)
    except OSError:
        return {}
    if not data:
        return None
    try:
        wrote = json.loads(data.decode("utf-8"))["tfgraph_wrote"]
        return {name: entry for name, entry in
                ((name, _entry(value)) for name, value in wrote.items())
                if isinstance(name, str) and entry is not None}
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return {}  # damaged, or too large: it vouches for no file


def _entry(value: object) -> Recorded | None:
    """One file's record in a mark ([size, mtime_ns] or [size, mtime_ns, sha256 hex]);
    None for anything else (it vouches for nothing)."""
    if not isinstance(value, list) or len(value) not in (2, 3):
        return None
    size, mtime = value[0], value[1]
    digest = value[2] if len(value) == 3 else None
    if type(size) is not int or type(mtime) is not int:
        return None
    if len(value) == 3 and not (isinstance(digest, str) and len(digest) == 64):
        return None
    return size, mtime, digest


def _check_replaceable(out_dir: Path, stage: Path, kind: str) -> None:
    """Refuse, naming them, the files in ``out_dir`` that swapping ``stage`` in would lose:
    those the previous build did not record writing (or that changed since: their size or
    content differ), unless ``stage`` holds the same bytes under that name. An empty
    (earlier tfgraph's) mark vouches for the names this build writes again."""
    if not out_dir.is_dir():
        return
    recorded = _recorded(out_dir)
    lost = []
    for path in sorted(out_dir.iterdir()):
        name = path.name
        if name in (MARKER, "__pycache__"):  # the mark; model.py's bytecode, rebuilt
            continue
        try:
            info = path.lstat()
        except OSError:
            continue  # gone meanwhile: nothing to lose
        regular = stat.S_ISREG(info.st_mode)
        new = stage / name
        if recorded is None and new.is_file():
            continue
        if regular and recorded and name in recorded and _unchanged(path, info, recorded[name]):
            continue  # as tfgraph wrote it
        if regular and new.is_file() and _same_bytes(path, new):
            continue  # the same bytes again
        lost.append(name)
    if lost:
        shown = ", ".join(lost[:3]) + (", ..." if len(lost) > 3 else "")
        raise TfgraphError(f"{out_dir}: {shown}: not written by tfgraph (or changed since); "
                           f"rebuilding this {kind} would replace or remove them: move them "
                           "away or use another directory")


def _unchanged(path: Path, info: os.stat_result, record: Recorded) -> bool:
    """Whether ``path`` (``info`` its lstat) is the file ``record`` describes: the same size
    and modification time, or (the folder copied: a new time) the same size and digest. The
    digest is read only then, so a rebuild in place reads nothing back."""
    size, mtime, digest = record
    if info.st_size != size:
        return False
    if info.st_mtime_ns == mtime:
        return True
    return digest is not None and _digest(path) == digest


def _digest(path: Path) -> str | None:
    """SHA-256 of ``path`` as hex, read a chunk at a time; None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return None  # unreadable: vouched for by nothing
    return digest.hexdigest()


def _same_bytes(a: Path, b: Path) -> bool:
    try:
        return filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False  # unreadable: not known to be the same, so kept


def _swap_in(stage: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by ``stage`` with renames; the old folder is removed afterwards.
    A process killed between the two renames leaves ``.NAME.old-*`` and no ``NAME``: the
    next build of the same target puts it back first (:func:`remove_stale_stages`)."""
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())):
        # rename(2) replaces an empty directory in one step: no .old-* (it would carry no
        # mark, so a killed build's one could never be told from a folder of the user's)
        os.replace(stage, out_dir)
        return
    old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
    os.rmdir(old)  # only the unique name is wanted
    lock = _locked(out_dir)  # follows the folder through the rename
    try:
        os.replace(out_dir, old)
        try:
            os.replace(stage, out_dir)
        except BaseException:
            with contextlib.suppress(OSError):
                os.replace(old, out_dir)  # put the previous folder back
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if lock is not None:
            os.close(lock)


def _locked(folder: Path) -> int | None:
    """An open descriptor of ``folder`` holding an exclusive lock, or None when it cannot be
    locked: None too when another process holds it (then ``folder`` is in use)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                     | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (ImportError, OSError):
        os.close(fd)
        return None
    return fd


def remove_stale_stages(out_dir: Path, names: Collection[str]) -> None:
    """Clean up after a build of ``out_dir`` that was killed (SIGKILL, power cut): remove
    its ``.NAME.tmp-*`` staging folders and, when ``NAME`` is missing, rename its
    ``.NAME.old-*`` back (killed between the two renames), else remove it. Only folders of
    exactly these names that are provably tfgraph's are touched: they hold the MARKER and
    nothing but ``names`` (what this kind of folder writes), and no running build holds them
    locked. Anything else of such a name (a folder of the user's) is left as it is."""
    pattern = re.compile(re.escape(f".{out_dir.name}.") + r"(tmp|old)-[a-z0-9_]{8}")
    try:
        entries = sorted(os.listdir(out_dir.parent))
    except OSError:
        return
    for name in entries:
        match = pattern.fullmatch(name)
        if match is None:
            continue
        path = out_dir.parent / name
        if path.is_symlink() or not path.is_dir():
            continue
        fd = _locked(path)
        if fd is None:
            continue
        try:
            if not _is_ours(path, names):
                continue
            if match.group(1) == "old" and not os.path.lexists(out_dir):
                os.replace(path, out_dir)
            else:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass
        finally:
            os.close(fd)


def _is_ours(stage: Path, names: Collection[str]) -> bool:
    """Whether ``stage`` is a folder tfgraph staged: the MARKER (written first, see
    :func:`staged_folder`) and only names this kind of folder writes, all regular files."""
    try:
        with os.scandir(stage) as entries:
            listed = [(entry.name, entry.is_file(follow_symlinks=False))
                      for _, entry in zip(range(len(names) + 3), entries)]
    except OSError:
        return False
    allowed = set(names) | {MARKER, "__pycache__"}
    return (MARKER, True) in listed and len(listed) <= len(names) + 2 and all(
        name in allowed and (is_file or name == "__pycache__") for name, is_file in listed)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
