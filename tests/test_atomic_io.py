"""``tfgraph.io``: outputs appear whole or not at all, and a failed write keeps the old file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tfgraph.errors import TfgraphError
from tfgraph.io import atomic_path, atomic_write


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
