"""``-o newdir/file`` creates the missing folders and says so (issue 28, item 4); a command
that fails after its checks leaves no folder it created behind; a file in the way is one line,
exit 2. Library writes (``atomic_write``) still want an existing folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "specs" / "tiny.yaml")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tfgraph", *args], capture_output=True,
                          text=True, timeout=300)


def test_build_creates_the_missing_folders_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "model.onnx"
    result = cli("build", TINY, "--to", "onnx", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.is_file()
    assert result.stderr == f"note: created directory {out.parent}\n"


def test_compare_and_import_outputs_create_folders_too(tmp_path: Path) -> None:
    out = tmp_path / "reports" / "c.json"
    result = cli("compare", TINY, str(ROOT / "specs" / "tiny-llama.yaml"), "--json", "-o",
                 str(out), "--seq", "16")
    assert result.returncode == 0 and out.is_file(), result.stderr
    assert "created directory" in result.stderr


def test_a_failing_command_removes_the_folders_it_created(tmp_path: Path) -> None:
    # the weights file does not exist: refused after -o was checked (and its folder made)
    out = tmp_path / "gone" / "twice" / "model.onnx"
    result = cli("build", TINY, "--to", "onnx", "-o", str(out), "--weights",
                 str(tmp_path / "missing.safetensors"))
    assert result.returncode == 2
    assert list(tmp_path.iterdir()) == []

    # refused after the folder was made: still one line, the folder's note being said only
    # once a command succeeds (it was said first, a second line)
    result = cli("build", str(ROOT / "specs" / "tiny-bert.yaml"), "--to", "onnx", "--kv-cache",
                 "--genai-provider", "cpu", "-o", str(out))
    assert result.returncode == 2
    assert result.stderr == ("--genai-provider: tiny-bert: its masked model has no KV cache "
                             "(an encoder): onnxruntime-genai drives decoders\n")
    assert list(tmp_path.iterdir()) == []


def test_a_file_in_the_way_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("mine")
    result = cli("build", TINY, "--to", "onnx", "-o", str(tmp_path / "file" / "m.onnx"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert (tmp_path / "file").read_text() == "mine"


def test_a_dot_dot_after_a_missing_folder_is_one_line_and_makes_nothing(tmp_path: Path
                                                                      ) -> None:
    """``-o new/../m.onnx``: mkdir -p would make ``new`` only to step out of it (and a failed
    mkdir used to leave it behind): refused before any folder is made."""
    result = cli("build", TINY, "--to", "onnx", "-o", str(tmp_path / "new" / ".." / "m.onnx"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "'..' after it names no folder" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_library_writes_still_want_an_existing_folder(tmp_path: Path) -> None:
    import pytest

    from tfgraph.errors import TfgraphError
    from tfgraph.io import atomic_write

    with pytest.raises(TfgraphError, match="does not exist"):
        with atomic_write(tmp_path / "nope" / "x.txt") as handle:
            handle.write("x")
    assert list(tmp_path.iterdir()) == []


def test_draw_and_folder_builds_create_the_missing_folders_too(tmp_path: Path) -> None:
    """Every command's -o creates its missing folders (README, "Exit status"): draw and the
    folder targets too, and a folder build that fails removes the folders it made."""
    dot = tmp_path / "nd4" / "a.dot"
    result = cli("draw", TINY, "-o", str(dot))
    assert result.returncode == 0 and dot.is_file(), result.stderr
    assert result.stderr == f"note: created directory {dot.parent}\n"
    for to in ("torch", "hf"):
        out = tmp_path / f"nd-{to}" / "deeper" / "good"
        result = cli("build", str(ROOT / "specs" / "tiny-llama.yaml"), "--to", to, "-o",
                     str(out))
        assert result.returncode == 0, result.stderr
        assert (out / ".tfgraph-output").is_file()
        assert result.stderr == f"note: created directory {out.parent}\n"
    out = tmp_path / "gone" / "model"
    result = cli("build", TINY, "--to", "torch", "-o", str(out), "--weights",
                 str(tmp_path / "missing.safetensors"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "gone").exists()
    result = cli("build", TINY, "--to", "hf", "-o", str(out))  # refused after compiling
    assert result.returncode == 2 and "no Hugging Face family" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "gone").exists()
