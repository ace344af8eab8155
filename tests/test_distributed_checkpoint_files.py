"""examples/train_distributed.py's checkpoint folders are user files: ``--resume`` reads a
folder without running code from it (DCP would unpickle its .metadata and its non-tensor
entries with plain pickle), and ``--save`` writes only into a new folder, a folder without
DCP's files, or a checkpoint --save wrote. Anything else: one line, exit 2, nothing run or
overwritten. One process (--strategy none), in this process through the example's main."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

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
