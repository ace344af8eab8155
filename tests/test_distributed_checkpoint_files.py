"""examples/train_distributed.py's checkpoint folders are user files: ``--resume`` reads a
folder without running code from it (DCP would unpickle its .metadata and its non-tensor
entries with plain pickle), and ``--save`` writes only into a new folder, a folder without
DCP's files, or a checkpoint --save wrote. Anything else: one line, exit 2, nothing run or
overwritten. One process (--strategy none), in this process through the example's main."""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path, PosixPath
from typing import Any

import pytest
import torch
from distributed_support import load_example

from tfgraph.exporters.torch.checkpoint_reader import CheckpointRefused, read_metadata

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--spec", str(ROOT / "specs" / "tiny-llama.yaml"), "--strategy", "none",
        "--batch", "2", "--seq", "8"]


class _Touch:
    """Unpickled, it creates ``path``: the witness that a file's code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (os.system, (f"touch {self.path}",))


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if not line.startswith(("note:", "step"))]
    assert len(errors) == 1 and errors[0].startswith("error: "), err
    return errors[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint --save wrote after 1 step, in a folder that held a file of the user's."""
    folder = tmp_path_factory.mktemp("ckpt") / "run"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    example = load_example()
    assert example.main([*BASE, "--steps", "1", "--save", str(folder)]) == 0
    return folder


def test_a_genuine_checkpoint_resumes_and_is_saved_over(saved: Path, tmp_path: Path) -> None:
    """The checkpoint --save wrote resumes (the new reader reads everything DCP wrote) and
    --save writes over it; the user's file beside it is kept."""
    example = load_example()
    again = tmp_path / "again"
    example.main([*BASE, "--steps", "1", "--save", str(again)])  # a copy to write over
    result = example.train(example.parse_args([*BASE, "--steps", "2", "--resume", str(again),
                                               "--save", str(again)]))
    assert result["start_step"] == 1 and len(result["losses"]) == 1
    assert json.loads((again / "train_state.json").read_text()) == {"step": 2}
    assert (saved / "notes.txt").read_text() == "mine"


def test_a_metadata_that_runs_code_is_refused(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder, witness = tmp_path / "ck", tmp_path / "PWNED"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(_Touch(witness)))
    (folder / "train_state.json").write_text('{"step": 0}')
    assert load_example().main([*BASE, "--steps", "2", "--resume", str(folder)]) == 2
    line = _one_error_line(capsys)
    assert f"{folder / '.metadata'}: refers to posix.system" in line, line
    assert not witness.exists()


def test_an_entry_that_runs_code_is_refused(saved: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A genuine checkpoint whose optimizer learning rate (a non-tensor entry, which DCP
    reads with torch.load(weights_only=False)) is replaced by a pickle that runs code."""
    folder, witness = tmp_path / "ck", tmp_path / "PWNED"
    folder.mkdir()
    for file in saved.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # the test's own file
    shard = folder / "__0_0.distcp"
    offset = shard.stat().st_size
    with open(shard, "ab") as handle:
        torch.save(_Touch(witness), handle)
    [key] = [k for k in metadata.storage_data if k.fqn == "optim.param_groups.0.lr"]
    info = metadata.storage_data[key]
    info.offset, info.length = offset, shard.stat().st_size - offset
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    assert load_example().main([*BASE, "--steps", "2", "--resume", str(folder)]) == 2
    line = _one_error_line(capsys)
    assert f"--resume {folder}: entry optim.param_groups.0.lr: not a plain value" in line, line
    assert not witness.exists()


@pytest.mark.parametrize("payload, says", [
    # GLOBAL Metadata, state (None, {"version": "x"}), BUILD: setattr on torch's class
    (b"ctorch.distributed.checkpoint.metadata\nMetadata\n(N}S'version'\nS'x'\nstb.",
     "sets attributes of the class Metadata"),
    (pickle.dumps({"not": "metadata"}), "holds a dict, not a torch.distributed.checkpoint"),
    (b"\x80\x04truncated", "not a torch.distributed.checkpoint .metadata"),
])
def test_metadata_that_is_not_dcp_records_is_refused(tmp_path: Path, payload: bytes,
                                                     says: str) -> None:
    from torch.distributed.checkpoint.metadata import Metadata

    file = tmp_path / ".metadata"
    file.write_bytes(payload)
    with pytest.raises(CheckpointRefused, match=says):
        read_metadata(file)
    assert Metadata.version is None  # the class is as torch defines it


# BUILD on what an allowed global gives rather than on a record: _get_layout's cache (torch.load
# of a sparse tensor looks its layout up there) and an enum member's value are torch's own
_POISON_LAYOUTS = (b"ctorch.serialization\n_get_layout\n(dS'cache'\n(dS'torch.strided'\n"
                   b"S'POISON'\nssb.")
_POISON_ENUM = (b"ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n(I0\ntR"
                b"(dS'_value_'\nI99\nsb.")


@pytest.mark.parametrize("payload, says", [
    (_POISON_LAYOUTS, "sets attributes of the function torch.serialization._get_layout"),
    (_POISON_ENUM, "sets attributes of a _MEM_FORMAT_ENCODING"),
])
def test_metadata_that_changes_torchs_own_objects_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], payload: bytes, says: str) -> None:
    """Refused in one line, exit 2, and torch is left as it was: a sparse tensor still
    round-trips through torch.load(weights_only=True)."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    get_layout: Any = torch.serialization._get_layout
    cache, member = get_layout.cache, _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
    before = dict(cache)
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / ".metadata").write_bytes(payload)
    (folder / "train_state.json").write_text('{"step": 0}')
    try:
        assert load_example().main([*BASE, "--steps", "2", "--resume", str(folder)]) == 2
        assert get_layout.cache is cache and cache == before
        assert member.value == 0 and _MEM_FORMAT_ENCODING(0) is member
        sparse, buffer = torch.eye(3).to_sparse(), io.BytesIO()
        torch.save(sparse, buffer)
        buffer.seek(0)
        torch.testing.assert_close(torch.load(buffer, weights_only=True), sparse)
        line = _one_error_line(capsys)
        assert f"{folder / '.metadata'}: {says}; a torch.distributed" in line, line
    finally:  # without the check, keep the rest of the session's torch whole
        get_layout.cache = cache
        member._value_ = 0


def test_a_checkpoint_written_under_python_313_is_read(saved: Path, tmp_path: Path) -> None:
    """Python 3.13 pickles a PosixPath (the checkpoint_id FileSystemWriter stores) as
    pathlib._local.PosixPath: the genuine .metadata, written as 3.13's pickler writes it,
    reads back equal."""
    genuine = pickle.loads((saved / ".metadata").read_bytes())  # the test's own file
    assert isinstance(genuine.storage_meta.checkpoint_id, PosixPath)

    class Python313(pickle._Pickler):  # type: ignore[name-defined]  # pure-Python pickler
        def save_global(self, obj: object, name: str | None = None) -> None:
            if obj is not PosixPath:
                super().save_global(obj, name)
                return
            # what save_global writes for a class whose __module__ is pathlib._local
            self.save("pathlib._local")
            self.save("PosixPath")
            self.write(pickle.STACK_GLOBAL)
            self.memoize(obj)

    buffer = io.BytesIO()
    Python313(buffer, protocol=4).dump(genuine)  # 3.13's default protocol
    data = buffer.getvalue()
    assert b"pathlib._local" in data and b"\x07pathlib\x94" not in data
    file = tmp_path / ".metadata"
    file.write_bytes(data)
    metadata = read_metadata(file)
    assert metadata.storage_meta == genuine.storage_meta
    assert metadata.storage_meta.checkpoint_id == saved  # type: ignore[union-attr]
    assert metadata.state_dict_metadata == genuine.state_dict_metadata
    assert metadata.storage_data == genuine.storage_data


def test_an_entry_outside_the_folder_is_refused(saved: Path, tmp_path: Path) -> None:
    metadata = pickle.loads((saved / ".metadata").read_bytes())
    next(iter(metadata.storage_data.values())).relative_path = "../elsewhere.distcp"
    file = tmp_path / ".metadata"
    file.write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointRefused, match="stored in '../elsewhere.distcp'"):
        read_metadata(file)


@pytest.mark.parametrize("name", [".metadata", "train_state.json", "__0_0.distcp"])
def test_save_does_not_overwrite_checkpoint_files_it_did_not_write(
        tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / name).write_text("mine")
    assert load_example().main([*BASE, "--steps", "1", "--save", str(folder)]) == 2
    line = _one_error_line(capsys)
    assert f"--save {folder}: its {name} is not from a checkpoint --save wrote" in line, line
    assert sorted(os.listdir(folder)) == [name] and (folder / name).read_text() == "mine"


def test_save_onto_a_file_is_refused(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "out"
    file.write_text("mine")
    assert load_example().main([*BASE, "--steps", "1", "--save", str(file)]) == 2
    assert f"--save {file}: exists and is not a folder" in _one_error_line(capsys)
    assert file.read_text() == "mine"


def test_a_deeply_nested_train_state_is_one_line(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / ".metadata").write_bytes(b"")
    (folder / "train_state.json").write_text("[" * 200_000)
    assert load_example().main([*BASE, "--steps", "1", "--resume", str(folder)]) == 2
    assert "unreadable train_state.json (nested too deeply)" in _one_error_line(capsys)
