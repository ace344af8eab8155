"""``tfgraph.io``: outputs appear whole or not at all, and a failed write keeps the old file;
interrupted writes (SIGINT, SIGTERM) leave no temporary file, and a killed writer's temporaries
are removed by the next write of the same target, and only those."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfgraph.errors import TfgraphError
from tfgraph.io import atomic_path, atomic_write, remove_stale_temps, temp_pattern


def test_writes_text_and_bytes(tmp_path: Path) -> None:
    with atomic_write(tmp_path / "a.txt") as f:
        f.write("hello")
    with atomic_write(tmp_path / "b.bin", "wb") as f:
        f.write(b"\x00\x01")
    assert (tmp_path / "a.txt").read_text() == "hello"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.bin"]


def test_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as f:
            f.write("half of the new")
            raise RuntimeError("exporter failed")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["model.onnx"]


def test_failure_without_an_old_file_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(tmp_path / "out.svg") as tmp:
            tmp.write_text("<svg")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_atomic_path_keeps_the_suffix_for_format_sniffing_writers(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "w.safetensors") as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".safetensors"
        tmp.write_bytes(b"x")
    assert (tmp_path / "w.safetensors").read_bytes() == b"x"


def test_new_files_get_umask_permissions_and_old_files_keep_theirs(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "new.txt") as f:
            f.write("x")
        assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o644
        old = tmp_path / "old.txt"
        old.write_text("x")
        old.chmod(0o600)
        with atomic_write(old) as f:
            f.write("y")
        assert stat.S_IMODE(old.stat().st_mode) == 0o600
    finally:
        os.umask(umask)


def test_bad_targets_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(TfgraphError, match="is a directory"):
        with atomic_write(tmp_path):
            pass
    with pytest.raises(TfgraphError, match="does not exist"):
        with atomic_write(tmp_path / "no" / "such" / "dir.txt"):
            pass
    with pytest.raises(ValueError):
        with atomic_write(tmp_path / "x", mode="a"):
            pass


# ---- interrupted writes (SIGINT, SIGTERM) -----------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp(\..*)?")  # the documented .NAME.XXXXXXXX.tmp.SUFFIX


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TEMP_NAME.fullmatch(p.name))


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    """Run ``code`` in a child Python; returns once it printed its "ready" line."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"child did not get ready: {line!r} {proc.communicate()[1]}")
    return proc


def _interrupt(proc: subprocess.Popen[str], signum: int) -> tuple[int, str]:
    """Send ``signum`` and wait for the child. Under heavy load a signal was seen to go
    unanswered once in many runs (the child still asleep a minute later); it is sent again
    every 10 s, which a child that handles the first one never sees."""
    for _ in range(6):
        proc.send_signal(signum)
        try:
            _, err = proc.communicate(timeout=10)
            return proc.returncode, err
        except subprocess.TimeoutExpired:
            continue
    proc.kill()
    raise AssertionError(f"the child ignored signal {signum} for a minute")


# Children start with Python's own SIGINT handler even when the test run itself was started
# in the background (where the shell makes them inherit SIGINT ignored).
BLOCKED_IN_ATOMIC_PATH = """
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    from tfgraph.io import atomic_path, atomic_write, remove_stale_temps, temp_pattern
    target, how = sys.argv[1], sys.argv[2]
    if how == "path":
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half of the new file")
            print("ready", flush=True)
            time.sleep(120)
    else:
        with atomic_write(target, "wb") as f:
            f.write(b"half of the new file")
            f.flush()
            print("ready", flush=True)
            time.sleep(120)
"""

SIGNALS = [(signal.SIGINT, (-signal.SIGINT, 1, 130)), (signal.SIGTERM, (143,))]


@pytest.mark.parametrize("how", ["path", "write"])
@pytest.mark.parametrize("signum, codes", SIGNALS, ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("old", [True, False], ids=["old-file", "no-old-file"])
def test_signal_during_a_write_removes_the_temporary_and_keeps_the_old_file(
        tmp_path: Path, how: str, signum: int, codes: tuple[int, ...], old: bool) -> None:
    """Catches: the signal handlers not installed (SIGTERM's default action kills the process
    before any cleanup), installed but not removing the file, or the old file replaced by
    the partial one."""
    target = tmp_path / "model.onnx"
    if old:
        target.write_bytes(b"the old model")
    proc = _start(BLOCKED_IN_ATOMIC_PATH, str(target), how)
    # The write is really in progress: its temporary file, of the documented pattern, exists.
    assert len(_temps(tmp_path)) == 1
    assert temp_pattern(target).fullmatch(_temps(tmp_path)[0])
    code, err = _interrupt(proc, signum)
    assert code in codes, (code, err)
    assert _temps(tmp_path) == []
    if old:
        assert target.read_bytes() == b"the old model"
        assert os.listdir(tmp_path) == ["model.onnx"]
    else:
        assert os.listdir(tmp_path) == []


BLOCKED_IN_BUILD = """
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    from tfgraph.exporters.onnx import model as onnx_model
    from tfgraph.exporters.onnx import writer as onnx_writer
    from tfgraph.cli import main

    out, external = sys.argv[1], sys.argv[2] == "external"
    if external:
        onnx_model.EXTERNAL_DATA_THRESHOLD = 0
    name = "_write_external" if external else "_append_initializer"
    real = getattr(onnx_writer, name)
    calls = []

    def slow(*args):
        real(*args)
        calls.append(1)
        if len(calls) == 2:  # some weights are written: the file is half done
            print("ready", flush=True)
            time.sleep(120)

    setattr(onnx_writer, name, slow)
    main(["build", "specs/tiny.yaml", "--to", "onnx", "-o", out])
"""


@pytest.mark.parametrize("external", [False, True], ids=["one-file", "external-data"])
@pytest.mark.parametrize("signum, codes", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_interrupted_onnx_build_leaves_no_temporary_and_keeps_the_old_model(
        tmp_path: Path, external: bool, signum: int, codes: tuple[int, ...]) -> None:
    """``tfgraph build --to onnx`` interrupted half way through the weights, through the
    CLI's own error handling (click turns KeyboardInterrupt into "Aborted!"). With external
    data two temporary files are open at once (weights and model): both go."""
    target = tmp_path / "tiny.onnx"
    target.write_bytes(b"the old model")
    proc = _start(BLOCKED_IN_BUILD, str(target), "external" if external else "single")
    assert len(_temps(tmp_path)) == (2 if external else 1)
    code, err = _interrupt(proc, signum)
    assert code in codes, (code, err)
    assert "Traceback" not in err
    assert _temps(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["tiny.onnx"]
    assert target.read_bytes() == b"the old model"


# ---- stale temporary files of killed writers -----------------------------------------------------


def test_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """SIGKILL leaves the temporary file behind (nothing can run): the next write of the same
    target removes it. Catches a cleanup that is documented but never called, or one that
    only knows today's random names."""
    target = tmp_path / "model.onnx"
    proc = _start(BLOCKED_IN_ATOMIC_PATH, str(target), "path")
    proc.kill()
    proc.wait(timeout=60)
    left = _temps(tmp_path)
    assert len(left) == 1  # what a killed process leaves
    with atomic_write(target) as f:
        f.write("new")
    assert os.listdir(tmp_path) == ["model.onnx"] and target.read_text() == "new"


def test_only_the_targets_own_unlocked_temporaries_are_removed(tmp_path: Path) -> None:
    """Catches: a pattern that is too wide (other targets' temporaries, names one character
    off, a regex built from an unescaped file name), or a cleanup that follows symbolic links
    or removes directories."""
    target = tmp_path / "a+b(1).onnx"  # regex metacharacters in the name
    stale = [".a+b(1).onnx.abcd1234.tmp.onnx", ".a+b(1).onnx.0a_z9x8y.tmp.onnx"]
    kept = [
        ".aab(1).onnx.abcd1234.tmp.onnx",  # '+' taken as a regex quantifier would match this
        ".a+b(1).onnx.abcd123.tmp.onnx",  # seven characters
        ".a+b(1).onnx.abcd12345.tmp.onnx",  # nine
        ".a+b(1).onnx.ABCD1234.tmp.onnx",  # upper case
        ".a+b(1).onnx.abcd1234.tmp.onnx.keep",  # something else that starts the same
        "a+b(1).onnx.abcd1234.tmp.onnx",  # no leading dot
        ".other.onnx.abcd1234.tmp.onnx",  # another target's temporary
        ".a+b(1).onnx.abcd1234.tmp.data",  # the same target with another suffix
        "unrelated.txt",
    ]
    for name in stale + kept:
        (tmp_path / name).write_text("x")
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("precious")
    link = tmp_path / ".a+b(1).onnx.linklink.tmp.onnx"
    link.symlink_to(outside)
    folder = tmp_path / ".a+b(1).onnx.dirdir00.tmp.onnx"
    folder.mkdir()
    removed = remove_stale_temps(target)
    assert sorted(p.name for p in removed) == sorted(stale)
    for name in kept:
        assert (tmp_path / name).read_text() == "x", name
    assert link.is_symlink() and outside.read_text() == "precious" and folder.is_dir()
    # A write goes through the same cleanup (nothing left to remove now).
    with atomic_write(target) as f:
        f.write("new")
    assert sorted(os.listdir(tmp_path)) == sorted(
        [target.name, *kept, outside.name, link.name, folder.name])


def test_a_temporary_of_another_user_is_left_alone(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A file named like a temporary of the target but owned by another user was not
    created by this user's writes: not removed (simulated: this process's user id changes)."""
    import tfgraph.io as io_module

    target = tmp_path / "model.onnx"
    other = tmp_path / ".model.onnx.abcd1234.tmp.onnx"
    other.write_text("theirs")
    uid = os.lstat(other).st_uid
    monkeypatch.setattr(io_module.os, "geteuid", lambda: uid + 1)
    assert remove_stale_temps(target) == []
    assert other.read_text() == "theirs"
    monkeypatch.undo()
    assert remove_stale_temps(target) == [other]


HOLD_LOCK = """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("ready", flush=True)
    time.sleep(120)
"""


def test_a_temporary_locked_by_a_live_writer_is_left_alone(tmp_path: Path) -> None:
    """Two processes writing the same target: the second must not delete the first one's
    file (it holds an flock on it while writing). Catches a cleanup that ignores locks."""
    target = tmp_path / "model.onnx"
    busy = tmp_path / ".model.onnx.busy0000.tmp.onnx"
    stale = tmp_path / ".model.onnx.dead0000.tmp.onnx"
    stale.write_text("x")
    proc = _start(HOLD_LOCK, str(busy))
    try:
        with atomic_write(target) as f:
            f.write("new")
        assert busy.exists() and not stale.exists()
    finally:
        proc.kill()
        proc.wait(timeout=60)
    # Once the writer is gone its lock is released and the file is stale.
    assert [p.name for p in remove_stale_temps(target)] == [busy.name]


def test_a_new_temporary_unlinked_before_its_lock_is_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race between creating a temporary and locking it: another process's cleanup sees
    an unlocked file of the pattern and removes it. Simulated by removing the file at the
    moment the writer locks it. Catches a writer that keeps the lock on the removed file:
    what it then writes by name is a new, unlocked file, which the next cleanup (another
    writer of the same target starting) deletes under it, and the final rename fails."""
    import tfgraph.io as io

    real = io._lock
    raced: list[str] = []

    def lock_after_a_rival_cleanup(fd: int) -> bool:
        if not raced:
            path = os.readlink(f"/proc/self/fd/{fd}")
            raced.append(path)
            os.unlink(path)
        return real(fd)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name an open file")
    monkeypatch.setattr(io, "_lock", lock_after_a_rival_cleanup)
    target = tmp_path / "out.txt"
    with atomic_write(target) as f:
        f.write("complete")
        # Another writer of the same target starts now: our file must look busy to it.
        assert remove_stale_temps(target) == []
    assert raced and target.read_text() == "complete"
    assert os.listdir(tmp_path) == ["out.txt"]
