"""Atomic output files: a failed write leaves no partial file and keeps the old one.

Write through :func:`atomic_write` (a file object) or :func:`atomic_path` (a temporary path, for
libraries that insist on writing a path themselves, e.g. ``onnx.save`` or ``safetensors``).
Both write a temporary file next to the target, named ``.NAME.XXXXXXXX.tmp.SUFFIX`` (eight
random lowercase letters or digits), and ``os.replace`` it over the target only when the block
finishes without an exception.

The temporary file does not outlive the write:

- An exception in the block removes it, and so do Ctrl-C (SIGINT) and SIGTERM: while a block
  runs in the main thread, handlers for both signals remove the temporary files first, then
  raise ``KeyboardInterrupt`` (SIGINT) or ``SystemExit(143)`` (SIGTERM; 128 + the signal's
  number is the shells' convention for "ended by a signal"), so ``finally`` blocks still run.
  The previous handlers are restored when the block ends. A signal the process ignores stays
  ignored, and a handler installed by someone else (a notebook kernel's) is called instead:
  if it raises, the block unwinds and removes its file; if it returns, the write goes on.
- A process killed outright (SIGKILL, the out-of-memory killer, a power cut) cannot clean up,
  so the next write of the same target removes the temporary files of exactly that target's
  pattern that no process is still writing: each writer holds an exclusive ``flock`` on its
  temporary file for as long as it writes it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shutil
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Any

from tfgraph.errors import TfgraphError
from tfgraph.terminal import short_path

try:
    import fcntl
except ImportError:  # not POSIX: no locks; an open file cannot be removed there anyway
    fcntl = None  # type: ignore[assignment]


# ---- inputs and outputs ----------------------------------------------------------------------
#
# One discipline for every writer: an output is a regular file (or, for folder targets, a
# directory) or does not exist yet; it is never an input of the same command nor inside one;
# and nothing is written until every input has been read through these checks.

_inputs: dict[Path, bool] = {}  # resolved input path -> is a directory
_input_files: dict[tuple[int, int], Path] = {}  # (device, inode) of input files -> path
_linked_inputs = False  # some input file has other hard links (outputs' folders are searched)
_tracking = False  # inputs are recorded while a command of the CLI runs (tfgraph.cli)

MAX_FOLDER_FILES = 10_000
"""Files of an input folder whose identities are noted, and of an output folder searched for
a hard link to an input: bounded work on a hostile folder (model folders hold a few dozen)."""


def _resolved(path: str | os.PathLike[str]) -> Path:
    try:
        return Path(os.path.realpath(path))
    except (OSError, ValueError):
        return Path(os.path.abspath(path))


def note_input(path: str | os.PathLike[str]) -> None:
    """Record ``path`` as an input of this command: outputs may not be it nor lie inside it."""
    if not _tracking:
        return
    resolved = _resolved(path)
    _inputs[resolved] = os.path.isdir(resolved)
    # A hard link is another name of the same file: inputs are also known by identity, a
    # folder's by the files directly in it (a model folder is flat).
    files = _folder_files(resolved) if _inputs[resolved] else [resolved]
    for file in files:
        _note_identity(file)


def _note_identity(file: Path) -> None:
    global _linked_inputs
    try:
        info = os.stat(file)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode):
        _input_files.setdefault((info.st_dev, info.st_ino), file)
        _linked_inputs = _linked_inputs or info.st_nlink > 1


def _folder_files(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as entries:
            return [Path(entry.path) for _, entry in zip(range(MAX_FOLDER_FILES), entries)]
    except OSError:
        return []


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISREG(info.st_mode) else None


def track_inputs(on: bool = True) -> None:
    """Start (or stop) recording inputs for a new command, with none recorded yet. The CLI
    turns this on; library calls (load_spec then a write) are not a command's inputs."""
    global _tracking, _linked_inputs
    _tracking = on
    _inputs.clear()
    _input_files.clear()
    _linked_inputs = False


def check_not_input(target: str | os.PathLike[str]) -> None:
    """Refuse (exit 2) an output that is an input of this command or lies inside one."""
    resolved = _resolved(target)
    for source, is_dir in _inputs.items():
        if resolved == source or (is_dir and source in resolved.parents):
            what = "is" if resolved == source else "is inside"
            # Two paths in one line: each keeps its end, the line stays under ~300.
            raise TfgraphError(f"{short_path(target, 110)}: {what} the input "
                               f"{short_path(source, 110)}; write the output elsewhere")
        if source.parent != source and resolved in source.parents and os.path.isdir(resolved):
            raise TfgraphError(f"{short_path(target, 110)}: holds the input "
                               f"{short_path(source, 110)}; write the output elsewhere")
    _check_not_linked(Path(target), resolved)


def _check_not_linked(target: Path, resolved: Path) -> None:
    """Refuse an output that is a hard link to an input file, or an output folder holding
    one: the same file under another name."""
    source = _input_files.get(_identity(resolved) or (-1, -1))
    if source is not None:
        raise TfgraphError(f"{short_path(target, 110)}: is the input {short_path(source, 110)} "
                           "(a hard link to it); write the output elsewhere")
    if not (_linked_inputs and resolved.is_dir()):
        return
    for count, file in enumerate(resolved.rglob("*")):
        if count >= MAX_FOLDER_FILES:
            return
        source = _input_files.get(_identity(file) or (-1, -1))
        if source is not None:
            raise TfgraphError(f"{short_path(target, 110)}: holds the input "
                               f"{short_path(source, 110)} (as {short_path(file.name, 60)}, a "
                               "hard link); write the output elsewhere")


def check_input_file(path: str | os.PathLike[str], what: str = "file") -> Path:
    """Refuse (exit 2) an input that is not a regular file before opening it: a FIFO or a
    terminal would block ``open`` or ``read`` forever, a device never ends."""
    file = Path(path)
    try:
        mode = os.stat(file).st_mode
    except FileNotFoundError:
        raise TfgraphError(f"{short_path(file)}: no such {what}") from None
    except OSError as exc:
        raise TfgraphError(f"{short_path(file)}: cannot read: "
                           f"{exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise TfgraphError(f"{short_path(file)}: is a directory, not a {what}")
    if not stat.S_ISREG(mode):
        raise TfgraphError(f"{short_path(file)}: is {_kind(mode)}, not a regular {what}")
    note_input(file)
    return file


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def check_output_node(target: str | os.PathLike[str], directory: bool = False) -> None:
    """Refuse an existing output that is not a regular file (or a directory, for folder
    targets): replacing a device, a FIFO or a socket by a file is never what was meant."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TfgraphError(f"{short_path(target)}: cannot write: "
                           f"{exc.strerror or exc}") from None
    if stat.S_ISREG(mode) or (directory and stat.S_ISDIR(mode)):
        return
    if stat.S_ISDIR(mode):
        raise TfgraphError(f"{short_path(target)}: is a directory; give a file name")
    raise TfgraphError(f"{short_path(target)}: is {_kind(mode)}; tfgraph writes only "
                       "regular files (give a file name)")


_CREATED: list[Path] = []
"""Folders this process created above its outputs, outermost first (``make_parents``)."""


def _remove_created_if_empty() -> None:
    """At exit: the folders created for outputs that were never written (the command failed
    after its checks) go again, innermost first; a folder holding anything stays."""
    for folder in reversed(_CREATED):
        with contextlib.suppress(OSError):
            folder.rmdir()


def make_parents(target: Path) -> None:
    """Create the missing folders above an output, as ``mkdir -p`` does, and say so on
    stderr (``-o newdir/model.onnx``); a command that fails before writing there removes
    them at exit. Refused when an existing ancestor is not a directory."""
    missing: list[Path] = []
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    if not missing:
        return
    if not parent.is_dir():
        raise TfgraphError(f"{short_path(target)}: {short_path(parent)} is not a "
                           "directory")
    dots = next((m for m in missing if m.name in ("..", ".")), None)
    if dots is not None:  # "new/../x": mkdir -p would make "new" only to step out of it
        raise TfgraphError(f"{short_path(target)}: {short_path(dots.parent)} does not "
                           f"exist, so {dots.name!r} after it names no folder; give the path "
                           "without it")
    try:
        target.parent.mkdir(parents=True)
    except OSError as exc:
        for made in missing:  # deepest first: what this call made before it failed
            with contextlib.suppress(OSError):
                made.rmdir()
        raise TfgraphError(f"{short_path(target)}: cannot create directory "
                           f"{short_path(target.parent)}: {exc.strerror or exc}") from None
    if not _CREATED:
        atexit.register(_remove_created_if_empty)
    _CREATED.extend(reversed(missing))
    # said when the command succeeds (tfgraph.cli_support.say_done): a refusal after this
    # stays one line, and the folder goes again at exit
    _NOTES.append(f"note: created directory {short_path(target.parent)}")


_NOTES: list[str] = []
"""Notes about folders made for outputs, printed once the command has succeeded."""


def take_notes() -> list[str]:
    """The notes of folders made since the last call (``make_parents``), once."""
    notes = list(_NOTES)
    _NOTES.clear()
    return notes


def _target(path: str | os.PathLike[str], create: bool = False) -> Path:
    """Check ``path`` can be an output file, with a clear error when it cannot; with
    ``create`` the missing folders above it are made (``make_parents``), else they are an
    error (a library write: the caller names an existing folder)."""
    target = Path(path)
    if target.is_dir():
        raise TfgraphError(f"{short_path(target)}: is a directory; give a file name")
    check_output_node(target)
    check_not_input(target)
    if create:
        make_parents(target)
    elif not target.parent.is_dir():
        raise TfgraphError(f"{short_path(target)}: directory "
                           f"{short_path(target.parent)} does not exist")
    return target


def check_output(path: str | os.PathLike[str], create: bool = True) -> Path:
    """Refuse (exit 2) an output path that cannot be written, before any work is done; the
    commands' ``-o newdir/file`` creates ``newdir`` (said on stderr; ``create=False``: a
    missing folder is refused instead)."""
    target = _target(path, create=create)
    check_writable(target)
    return target


def check_writable(target: str | os.PathLike[str]) -> None:
    """Refuse (exit 2) an output whose folder this process may not write in (the output is
    written there first, then renamed over the target)."""
    folder = Path(target).parent
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise TfgraphError(f"{short_path(target)}: cannot write in {short_path(folder)} "
                           "(permission denied)")
    if not folder.is_dir():
        return
    # os.access says yes to root everywhere, and nothing of a folder like /proc or a
    # read-only mount: create (and remove) the temporary file the write will use.
    try:
        fd, probe = _create_temp(Path(target))
    except OSError as exc:
        raise TfgraphError(f"{short_path(target)}: cannot write: "
                           f"{exc.strerror or exc}") from None
    with contextlib.suppress(OSError):
        probe.unlink()
    os.close(fd)


def available_memory() -> int | None:
    """Bytes a new allocation can still get (Linux), else None: the kernel's ``MemAvailable``,
    or less where this process's memory cgroup (a container's limit) leaves less."""
    found = [n for n in (_meminfo_available(), cgroup_available()) if n is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


UNLIMITED = 1 << 60
"""cgroup v1 writes "no limit" as a page-rounded 2^63 - 1; any limit past 2^60 is none."""


def cgroup_available(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup"
                     ) -> int | None:
    """Bytes this process's memory cgroup can still charge: its limit less its usage, with the
    inactive page cache (which the kernel reclaims before it kills) counted as free, as the
    kubelet's working set does; the tightest over the cgroup and its parents. cgroup v2:
    ``memory.max`` / ``memory.current`` / ``memory.stat`` ``inactive_file``; v1:
    ``memory.limit_in_bytes`` / ``memory.usage_in_bytes`` / ``total_inactive_file``. None
    without a limit or a readable cgroup."""
    base = Path(root)
    if (base / "memory" / "memory.limit_in_bytes").exists():  # v1, the container's own view
        return _cgroup_room(base / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
                            "total_inactive_file")
    try:
        own = next(line[3:].strip() for line in Path(membership).read_text(
            encoding="ascii").splitlines() if line.startswith("0::"))
    except (OSError, ValueError, StopIteration):
        own = "/"
    folder = (base / own.lstrip("/")).resolve()
    if folder != base.resolve() and base.resolve() not in folder.parents:
        folder = base.resolve()  # a path outside the hierarchy: its root only
    rooms = []
    while True:  # a parent's limit binds too
        room = _cgroup_room(folder, "memory.max", "memory.current", "inactive_file")
        if room is not None:
            rooms.append(room)
        if folder == base.resolve() or folder.parent == folder:
            break
        folder = folder.parent
    return min(rooms) if rooms else None


def _cgroup_room(folder: Path, limit_file: str, usage_file: str, inactive_key: str
                 ) -> int | None:
    try:
        limit_text = (folder / limit_file).read_text(encoding="ascii").strip()
        if limit_text == "max" or int(limit_text) >= UNLIMITED:
            return None
        usage = int((folder / usage_file).read_text(encoding="ascii").strip())
        inactive = 0
        for line in (folder / "memory.stat").read_text(encoding="ascii").splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
        return max(int(limit_text) - usage + inactive, 0)
    except (OSError, ValueError):
        return None


def _gb(n: int) -> str:
    """Bytes in the unit that shows them (never "0.0 GB" for a few megabytes)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,} bytes"


def check_capacity(target: str | os.PathLike[str], disk_bytes: int, memory_bytes: int) -> None:
    """Refuse (exit 2) a write that cannot succeed: ``disk_bytes`` more than the free space
    next to ``target``, or ``memory_bytes`` (held at once while writing) more than the memory
    available. Better one clear line now than minutes of work ending in a full disk or the
    out-of-memory killer. Unknown figures (no such directory, no /proc) are not checked."""
    target = Path(target)
    shown = short_path(target)
    try:
        free = shutil.disk_usage(target.parent).free
    except OSError:
        free = None
    if free is not None and disk_bytes > free:
        raise TfgraphError(f"{shown}: needs {_gb(disk_bytes)} of disk, only {_gb(free)} free "
                           f"in {short_path(target.parent)}")
    memory = available_memory()
    if memory is not None and memory_bytes > memory:
        raise TfgraphError(f"{shown}: needs {_gb(memory_bytes)} of memory to write, only "
                           f"{_gb(memory)} available")


def _mode_for(target: Path) -> int:
    """Keep an existing file's permissions; new files get the usual 0666 & ~umask."""
    try:
        return target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


# ---- temporary files ------------------------------------------------------------------------


def _temp_affixes(target: Path) -> tuple[str, str]:
    return f".{target.name}.", f".tmp{target.suffix}"


def temp_pattern(target: str | os.PathLike[str]) -> re.Pattern[str]:
    """The names of ``target``'s temporary files (match with ``fullmatch``). Eight characters
    of ``[a-z0-9_]`` also covers the names of tempfile.mkstemp, which earlier versions used."""
    prefix, suffix = _temp_affixes(Path(target))
    return re.compile(re.escape(prefix) + "[a-z0-9_]{8}" + re.escape(suffix))


def _lock(fd: int) -> bool:
    """Take an exclusive lock on ``fd`` without waiting: False when another process holds it."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a file system without locks: nothing to learn
        return True
    return True


def _owned(info: os.stat_result) -> bool:
    """Whether this process's user owns the file (always, where there are no user ids)."""
    geteuid = getattr(os, "geteuid", None)
    return geteuid is None or info.st_uid == geteuid()


def remove_stale_temps(target: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files a killed write of ``target`` left behind; returns them.

    Only regular files in ``target``'s directory whose whole name matches
    :func:`temp_pattern` are candidates, and of those only the ones this user owns (a writer
    creates its file as itself: a file of another user's of such a name is not a temporary
    of ours) and no process holds locked (a write of the same target in progress elsewhere
    keeps its file). A file cannot carry a mark as folders do (.tfgraph-output), and its
    mode changes to the target's just before it is renamed, so name, owner and lock are what
    recognizes one. Failures to remove are ignored: this is housekeeping, never a reason for
    the write itself to fail.
    """
    target = Path(target)
    pattern = temp_pattern(target)
    removed: list[Path] = []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return removed
    for name in names:
        if not pattern.fullmatch(name):
            continue
        path = target.parent / name
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode) or not _owned(info):
                continue
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            if _lock(fd):
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _is_at(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except OSError:
        return False


def _create_temp(target: Path) -> tuple[int, Path]:
    """Create and lock a new temporary file next to ``target``: (open descriptor, path)."""
    prefix, suffix = _temp_affixes(target)
    for _ in range(100):
        path = target.parent / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        # Between the open and the lock, another process's remove_stale_temps can take the
        # (not yet locked) file for a stale one and unlink it. We would hold the lock of a
        # file with no name while the caller writes a new, unlocked one at the path, which
        # the next cleanup deletes under it (the rename then fails). Keep the file only if
        # the path still names it; otherwise try another name.
        if _lock(fd) and _is_at(fd, path):
            return fd, path
        os.close(fd)
    raise FileExistsError(f"no free temporary name next to {target}")


# ---- signals --------------------------------------------------------------------------------

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_live: dict[Path, None] = {}  # temporary files of the main thread's blocks, in order
_previous: dict[int, Any] = {}  # handlers ours replaced, while any block runs
_depth = 0  # nesting of the main thread's atomic_path blocks


def _remove_live() -> None:
    for path in list(_live):
        with contextlib.suppress(OSError):
            path.unlink()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get(signum)
    if callable(previous) and previous is not signal.default_int_handler:
        # Someone else's policy decides: if their handler raises, the blocks unwind and
        # remove their files; if it returns, the write goes on.
        previous(signum, frame)
        return
    _remove_live()  # first, so that nothing later (a second signal) can keep them
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _signals_remove(path: Path) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM remove ``path`` (main thread only: Python
    runs signal handlers there, and only there can they be installed)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth == 0:
        for sig in _SIGNALS:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN or current is None:  # ignored, or not set by Python
                continue
            _previous[sig] = current
            signal.signal(sig, _on_signal)
    _depth += 1
    _live[path] = None
    try:
        yield
    finally:
        _live.pop(path, None)
        _depth -= 1
        if _depth == 0:
            for signum, handler in _previous.items():
                signal.signal(signum, handler)
            _previous.clear()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; on success it replaces ``path``.

    The temporary name keeps the target's suffix, so writers that pick a format from the
    extension still work. On an exception or an interrupting signal the temporary file is
    removed (see the module's documentation); stale temporary files of the same target left
    by a killed process are removed first.
    """
    target = _target(path)
    remove_stale_temps(target)
    try:
        fd, tmp = _create_temp(target)
    except OSError as exc:
        raise TfgraphError(f"{short_path(target)}: cannot write: "
                           f"{exc.strerror or exc}") from None
    group = _group
    try:
        with _signals_remove(tmp):
            yield tmp
            os.chmod(tmp, _mode_for(target))
            if group is not None:  # published with the rest of the group
                group.append((tmp, target, fd))
                return
            os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    finally:
        if group is None or not any(entry[2] == fd for entry in group):
            os.close(fd)  # releases the lock, once the file is in place or gone


_group: list[tuple[Path, Path, int]] | None = None
_after: list[Callable[[], None]] = []
_undo: list[Callable[[], None]] = []


def unless_published(action: Callable[[], None]) -> None:
    """Run ``action`` if the enclosing :func:`publish_together` block fails after this point
    (a folder made for files that will never be published goes again); outside such a
    block the files are already in place and nothing is run."""
    if _group is not None:
        _undo.append(action)


def after_publish(action: Callable[[], None]) -> None:
    """Run ``action`` once the files written so far are in place: now, or at the end of the
    enclosing :func:`publish_together` block (not at all when that block fails)."""
    if _group is None:
        action()
    else:
        _after.append(action)


@contextlib.contextmanager
def publish_together() -> Iterator[None]:
    """Every :func:`atomic_path` inside the block is written to its temporary file only; the
    files replace their targets together when the block ends without an exception, so a
    failure (a full disk while writing the third file) leaves none of them changed. A nested
    block joins the outer one."""
    global _group
    if _group is not None:
        yield
        return
    pending: list[tuple[Path, Path, int]] = []
    _group = pending
    _after.clear()
    _undo.clear()
    try:
        yield
        for tmp, target, _fd in pending:
            os.replace(tmp, target)
        for action in list(_after):
            action()
    except BaseException:
        for tmp, _target_path, _fd in pending:
            with contextlib.suppress(OSError):
                tmp.unlink()
        for undo in reversed(_undo):  # after the files they held are gone
            with contextlib.suppress(OSError):
                undo()
        raise
    finally:
        _group = None
        _after.clear()
        _undo.clear()
        for _tmp, _target_path, fd in pending:
            with contextlib.suppress(OSError):
                os.close(fd)


def check_side_file(target: str | os.PathLike[str], data: bytes) -> bool:
    """Whether side file ``target`` (a tokenizer file, a generation config written next to a
    model) must be written: False when it already holds exactly ``data``. A file of that name
    with other content is not tfgraph's to replace: refused (exit 2), naming it."""
    path = Path(target)
    check_output_node(path)
    check_not_input(path)
    try:
        with open(path, "rb") as handle:
            existing = handle.read(len(data) + 1)
    except FileNotFoundError:
        return True
    except OSError as exc:
        raise TfgraphError(f"{short_path(path)}: cannot read: "
                           f"{exc.strerror or exc}") from None
    if existing == data:
        return False
    raise TfgraphError(f"{short_path(path)}: exists with other content, and tfgraph "
                       "does not replace files it did not write; remove it or write to "
                       "another directory")


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
