"""Issue 27: one output discipline (nothing lost, nothing left behind), regular-file checks
on inputs, and one signal policy; every reproduction runs the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_support import refused, tfgraph

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "specs" / "tiny-decoder.yaml")




@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama folder with a tokenizer.json and a generation_config.json."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("folder") / "tiny"
    transformers.LlamaForCausalLM(config).eval().save_pretrained(root)
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(60)} | {"<unk>": 60}
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(root / "tokenizer.json"))
    return root


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_output_inside_the_input_folder_is_refused(folder: Path) -> None:
    before = snapshot(folder)
    result = tfgraph("build", str(folder), "--to", "onnx", "-o",
                     str(folder / "model.safetensors"))
    refused(result, "model.safetensors", "input")
    assert snapshot(folder) == before


def test_output_that_is_the_spec_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_bytes(Path(TINY).read_bytes())
    refused(tfgraph("build", str(spec), "--to", "json", "-o", str(spec)), "input")
    assert spec.read_bytes() == Path(TINY).read_bytes()


def test_foreign_side_file_is_not_overwritten(folder: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "tokenizer.json").write_text("mine\n")
    result = tfgraph("build", str(folder), "--to", "onnx", "-o", str(victim / "model.onnx"))
    refused(result, "tokenizer.json")
    assert (victim / "tokenizer.json").read_text() == "mine\n"
    assert sorted(p.name for p in victim.iterdir()) == ["tokenizer.json"]


def test_rebuild_beside_its_own_side_files(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.onnx"
    for _ in range(2):  # the second build finds the same files: nothing foreign
        result = tfgraph("build", str(folder), "--to", "onnx", "-o", str(out))
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "generation_config.json", "model.onnx", "tokenizer.json"]


@pytest.mark.parametrize("args", [("build", TINY, "--to", "json"), ("import",)])
def test_a_fifo_as_output_stays_a_fifo(tmp_path: Path, args: tuple[str, ...],
                                       folder: Path) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    if args == ("import",):
        args = ("import", str(folder / "config.json"))
    refused(tfgraph(*args, "-o", str(fifo)), "FIFO")
    assert fifo.is_fifo()


def test_a_char_device_as_output_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "null.json"
    link.symlink_to("/dev/null")
    refused(tfgraph("build", TINY, "--to", "json", "-o", str(link)), "character device")
    assert Path("/dev/null").is_char_device()


@pytest.mark.parametrize("command", ["validate", "report"])
def test_a_fifo_as_spec_does_not_hang(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    refused(tfgraph(command, str(fifo), timeout=60), "regular file")


def test_a_fifo_as_weights_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "w.safetensors"
    os.mkfifo(fifo)
    refused(tfgraph("build", TINY, "--to", "onnx", "--weights", str(fifo), "-o",
                    str(tmp_path / "m.onnx"), timeout=120), "FIFO")


def test_stale_staging_folders_are_cleaned_and_old_restored(tmp_path: Path) -> None:
    out = tmp_path / "model"
    (tmp_path / ".model.tmp-abcd1234").mkdir()  # a killed build's: marked from the start
    (tmp_path / ".model.tmp-abcd1234" / ".tfgraph-output").touch()
    (tmp_path / ".model.tmp-abcd1234" / "model.py").write_text("half")
    old = tmp_path / ".model.old-efgh5678"  # killed between the two renames
    result = tfgraph("build", TINY, "--to", "torch", "-o", str(out))
    assert result.returncode == 0, result.stderr
    first = snapshot(out)
    os.replace(out, old)
    (tmp_path / ".other.tmp-abcd1234").mkdir()  # another target's: not ours to remove
    result = tfgraph("build", TINY, "--to", "torch", "-o", str(out), "--seed", "1")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-abcd1234", "model"]
    assert snapshot(out) != first  # the restored folder was then rebuilt


def test_folders_of_the_users_with_a_staging_name_are_left_alone(tmp_path: Path) -> None:
    """Only staging tfgraph provably wrote (its mark, no other names than it writes) is
    removed or put back: a folder of the user's named like one stays as it was."""
    tmp, old = tmp_path / ".m.tmp-abcdefgh", tmp_path / ".m.old-abcdefgh"
    tmp.mkdir()
    (tmp / "thesis.tex").write_text("x\n")
    old.mkdir()
    (old / "data.csv").write_text("y\n")
    marked = tmp_path / ".m.tmp-12345678"  # the mark, but a name tfgraph never writes there
    marked.mkdir()
    (marked / ".tfgraph-output").touch()
    (marked / "notes.txt").write_text("z\n")
    result = tfgraph("build", TINY, "--to", "torch", "-o", str(tmp_path / "m"))
    assert result.returncode == 0, result.stderr
    assert (tmp / "thesis.tex").read_text() == "x\n"
    assert (old / "data.csv").read_text() == "y\n"
    assert (marked / "notes.txt").read_text() == "z\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.old-abcdefgh", ".m.tmp-12345678",
                                                          ".m.tmp-abcdefgh", "m"]
    assert (tmp_path / "m" / ".tfgraph-output").is_file()


def test_side_files_and_model_are_published_together(folder: Path, tmp_path: Path) -> None:
    """A failure after the model is written (here: a side file refused mid-way by a FIFO of
    its name created after the checks) leaves neither the model nor any side file."""
    from tfgraph import io

    calls: list[str] = []
    out = tmp_path / "m.onnx"
    with pytest.raises(RuntimeError):
        with io.publish_together():
            for name in ("m.onnx", "tokenizer.json"):
                with io.atomic_write(tmp_path / name) as handle:
                    handle.write("x")
                calls.append(name)
            raise RuntimeError("disk full")
    assert calls == ["m.onnx", "tokenizer.json"]
    assert list(tmp_path.iterdir()) == []
    with io.publish_together():
        with io.atomic_write(out) as handle:
            handle.write("x")
        assert not out.exists()
    assert out.read_text() == "x"


def test_disk_full_on_stdout_is_one_line() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "tfgraph", "report", TINY],
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("args", [["--help"], ["-V"], ["--version"], ["compare", "--help"]])
def test_disk_full_on_eager_options_is_one_line(args: list[str]) -> None:
    """The group's own eager options (--help, --version) write before any command is invoked:
    a stdout that cannot be written is one line and exit 2 there too (README, "Exit status")."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "tfgraph", *args],
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr == "tfgraph: No space left on device\n"


def wait_for_signal_policy(pid: int) -> None:
    """Until the CLI catches SIGTERM (its signal policy is installed: the command runs)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            time.sleep(0.5)  # no /proc: give the imports time
            return
        caught = int(next(line.split()[1] for line in status.splitlines()
                          if line.startswith("SigCgt:")), 16)
        if caught >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_build_is_one_line_and_leaves_nothing(tmp_path: Path, sig: int,
                                                                folder: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "tfgraph", "build", str(folder), "--to",
                             "torch", "-o", str(out / "model")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_signal_policy(proc.pid)
    proc.send_signal(sig)
    _stdout, stderr = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the build finished before the signal")
    assert proc.returncode == 128 + sig, (proc.returncode, stderr)
    assert stderr.strip().splitlines() == [
        "tfgraph: interrupted" if sig == signal.SIGINT else "tfgraph: terminated"], stderr
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_first_second_is_one_line(tmp_path: Path, sig: int) -> None:
    """While the program is still importing (pydantic, sympy): no traceback either."""
    program = Path(sys.executable).parent / "tfgraph"
    if not program.exists():
        pytest.skip("no tfgraph console script next to this Python")
    proc = subprocess.Popen([str(program), "build", TINY, "--to", "json", "-o",
                             str(tmp_path / "g.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_signal_policy(proc.pid)
    proc.send_signal(sig)
    _stdout, stderr = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the build finished before the signal")
    assert proc.returncode == 128 + sig, (proc.returncode, stderr)
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_disk_full_while_writing_side_files_leaves_nothing(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC after the model was written, while its tokenizer files are: neither appears."""
    import errno

    from click.testing import CliRunner

    import tfgraph.hf.tokenizer
    from tfgraph.cli import main

    def full(files: list[Path], target: Path, *token_ids: object) -> list[Path]:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tfgraph.hf.tokenizer, "copy_files", full)
    result = CliRunner().invoke(main, ["build", str(folder), "--to", "onnx", "-o",
                                       str(tmp_path / "model.onnx")])
    assert result.exit_code == 2, result.output
    assert "No space left on device" in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("to", ["torch", "hf"])
def test_a_folder_tfgraph_did_not_write_is_not_replaced(folder: Path, tmp_path: Path,
                                                        to: str) -> None:
    """A downloaded checkpoint with exactly the names a build writes stays as it was."""
    victim = tmp_path / "victim"
    victim.mkdir()
    name = "model.py" if to == "torch" else "config.json"
    (victim / name).write_text("mine\n")
    refused(tfgraph("build", TINY, "--to", to, "-o", str(victim)), "did not write")
    assert sorted(p.name for p in victim.iterdir()) == [name]
    fresh = tmp_path / "fresh"
    for _ in range(2):  # its own folder: rebuilt in place
        result = tfgraph("build", TINY, "--to", to, "-o", str(fresh))
        assert result.returncode == 0, result.stderr


SIGNAL_AFTER_WROTE = """
import os, signal, sys
import click
from tfgraph.cli import main

echo = click.echo

def echo_then_signal(message=None, *args, **kwargs):
    echo(message, *args, **kwargs)
    if str(message).startswith("wrote "):  # the moment after the command claims success
        os.kill(os.getpid(), int(sys.argv[1]))

click.echo = echo_then_signal
main.main(args=sys.argv[2:], prog_name="tfgraph")
"""


SIGNAL_AT_SHUTDOWN = """
import os, signal, sys
from tfgraph.cli import main


class SignalAtTeardown:
    # a module global: deleted as the interpreter tears the modules down, after it has put
    # Python signal handlers back to the default
    def __del__(self, kill=os.kill, pid=os.getpid(), sig=int(sys.argv[1])):
        kill(pid, sig)


keep = SignalAtTeardown()
sys.argv = ["tfgraph", *sys.argv[2:]]  # the program itself, as its console script runs it
main.main(args=sys.argv[1:], prog_name="tfgraph")
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_interpreter_exits_after_wrote_still_exits_0(
        tmp_path: Path, sig: int) -> None:
    """After "wrote", the program ignores SIGINT and SIGTERM at the operating system's level,
    so the interpreter's teardown (where Python-level handlers are gone) cannot turn a
    success into 130 or 143."""
    result = subprocess.run([sys.executable, "-c", SIGNAL_AT_SHUTDOWN, str(int(sig)), "build",
                             TINY, "--to", "json", "-o", "g.json"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert "wrote" in result.stdout and (tmp_path / "g.json").is_file()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("command", [("build", TINY, "--to", "json", "-o", "g.json"),
                                     ("compare", TINY, TINY, "--plot", "p.svg")])
def test_a_signal_after_wrote_still_exits_0(tmp_path: Path, sig: int,
                                            command: tuple[str, ...]) -> None:
    """The rule: "wrote ..." is printed once the output is published, and from then on the
    command has succeeded (exit 0); a signal just after it used to end it with 143."""
    if command[0] == "compare":
        pytest.importorskip("matplotlib")
    result = subprocess.run([sys.executable, "-c", SIGNAL_AFTER_WROTE, str(int(sig)),
                             *command], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert "wrote" in result.stdout and "interrupted" not in result.stderr \
        and "terminated" not in result.stderr, result.stderr
    assert (tmp_path / command[-1]).is_file()


def test_an_output_hard_linked_to_the_input_is_refused(tmp_path: Path) -> None:
    """A hard link is the same file under another name: refused like the file itself."""
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(Path(TINY).read_bytes())
    link = tmp_path / "graph.json"
    os.link(spec, link)
    refused(tfgraph("build", str(spec), "--to", "json", "-o", str(link)), "graph.json",
            "spec.yaml", "hard link")
    assert spec.read_bytes() == link.read_bytes() == Path(TINY).read_bytes()
    assert os.stat(spec).st_ino == os.stat(link).st_ino


def test_an_output_folder_holding_a_hard_linked_input_is_refused(tmp_path: Path) -> None:
    """--weights w.safetensors is a hard link to the weights of the folder being rebuilt."""
    out = tmp_path / "out"
    assert tfgraph("build", TINY, "--to", "torch", "-o", str(out)).returncode == 0
    weights = tmp_path / "w.safetensors"
    os.link(out / "weights.safetensors", weights)
    before = snapshot(out)
    refused(tfgraph("build", TINY, "--to", "torch", "--weights", str(weights), "-o", str(out)),
            "out", "w.safetensors", "hard link")
    assert snapshot(out) == before


def no_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling fails the test: the output must be refused before it."""
    import tfgraph
    import tfgraph.compiler

    def compile_spec(*args: object, **kwargs: object) -> None:
        raise AssertionError("compiled before the output was checked")

    monkeypatch.setattr(tfgraph.compiler, "compile", compile_spec)
    monkeypatch.setattr(tfgraph, "compile", compile_spec)


@pytest.mark.parametrize("command, output, words", [
    (("build", "SPEC", "--to", "json"), "SPEC", ("is the input",)),
    (("build", "SPEC", "--to", "svg"), "fifo.svg", ("FIFO",)),
    (("build", "SPEC", "--to", "dot"), "folder.dot", ("is a directory",)),
    (("build", "SPEC", "--to", "torch"), "victim", ("not a tfgraph torch folder",)),
    (("build", "SPEC", "--to", "hf"), "checkpoint", ("did not write",)),
    (("draw", "SPEC"), "fifo.svg", ("FIFO",)),
    (("compare", "SPEC", "SPEC"), "SPEC", ("is the input",)),
])
def test_outputs_are_checked_before_compiling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              command: tuple[str, ...], output: str,
                                              words: tuple[str, ...]) -> None:
    from click.testing import CliRunner

    from tfgraph.cli import main

    spec = tmp_path / "spec.yaml"
    spec.write_bytes(Path(TINY).read_bytes())
    os.mkfifo(tmp_path / "fifo.svg")
    (tmp_path / "folder.dot").mkdir()
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "notes.txt").write_text("mine\n")
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "config.json").write_text("{}\n")
    no_compiling(monkeypatch)
    args = [str(spec) if a == "SPEC" else a for a in command]
    target = str(spec) if output == "SPEC" else str(tmp_path / output)
    result = CliRunner().invoke(main, [*args, "-o", target])
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in result.output, result.output
    assert spec.read_bytes() == Path(TINY).read_bytes()


@pytest.mark.parametrize("to", ["json", "torch"])
def test_an_unwritable_folder_is_refused_before_compiling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str) -> None:
    """A folder without write permission (simulated: root may write anywhere)."""
    from click.testing import CliRunner

    from tfgraph.cli import main

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access

    def access(path: object, mode: int, **kwargs: object) -> bool:
        if Path(str(path)) == locked and mode & os.W_OK:
            return False
        return real_access(path, mode, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", access)
    no_compiling(monkeypatch)
    result = CliRunner().invoke(main, ["build", TINY, "--to", to, "-o", str(locked / "out")])
    assert result.exit_code == 2 and "permission denied" in result.output, result.output
    assert list(locked.iterdir()) == []


def test_the_cli_in_process_gives_the_signals_back(tmp_path: Path) -> None:
    """After a command called in process (CliRunner) ends, this process's handlers are its
    own again: nothing ignored that programs it starts later would inherit."""
    from click.testing import CliRunner

    from tfgraph.cli import main

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    result = CliRunner().invoke(main, ["build", TINY, "--to", "json", "-o",
                                       str(tmp_path / "g.json")])
    assert result.exit_code == 0, result.output
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_data_file_tfgraph_did_not_write_is_left_alone(folder: Path, tmp_path: Path) -> None:
    """``-o X.onnx`` never removes or replaces an ``X.onnx.data`` that is not the weights
    file of the tfgraph model at X.onnx: a file of the user's, the spec, the --weights."""
    mine = tmp_path / "m.onnx.data"
    mine.write_text("MINE\n")
    refused(tfgraph("build", TINY, "--to", "onnx", "-o", str(tmp_path / "m.onnx")),
            "m.onnx.data", "not the weights file")
    spec = tmp_path / "s.onnx.data"
    spec.write_bytes(Path(TINY).read_bytes())
    refused(tfgraph("build", str(spec), "--to", "onnx", "-o", str(tmp_path / "s.onnx")),
            "s.onnx.data", "is the input")
    weights = tmp_path / "w.onnx.data"
    weights.write_bytes((folder / "model.safetensors").read_bytes())
    refused(tfgraph("build", str(folder), "--to", "onnx", "--weights", str(weights), "-o",
                    str(tmp_path / "w.onnx")), "w.onnx.data", "is the input")
    # a single-file model of tfgraph's at m.onnx does not make the .data beside it its own
    result = tfgraph("build", TINY, "--to", "onnx", "-o", str(tmp_path / "other.onnx"))
    assert result.returncode == 0, result.stderr
    os.replace(tmp_path / "other.onnx", tmp_path / "m.onnx")
    refused(tfgraph("build", TINY, "--to", "onnx", "-o", str(tmp_path / "m.onnx")),
            "not the weights file")
    assert mine.read_text() == "MINE\n"
    assert spec.read_bytes() == Path(TINY).read_bytes()
    assert weights.read_bytes() == (folder / "model.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data",
                                                          "s.onnx.data", "w.onnx.data"]


USER_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                   "chat_template.jinja", "tokenizer.model", "special_tokens_map.json")


@pytest.mark.parametrize("to", ["torch", "hf"])
def test_a_rebuild_keeps_files_the_user_added_to_its_folder(tmp_path: Path, to: str) -> None:
    """Files added to a folder tfgraph built (names such a folder may hold, but this build
    does not write and the last one did not) are refused by name; the folder stays as it
    was. Once they are moved away the rebuild goes through."""
    out = tmp_path / "out"
    spec = str(ROOT / "specs" / "tiny-llama.yaml")
    assert tfgraph("build", spec, "--to", to, "-o", str(out)).returncode == 0
    for name in USER_SIDE_FILES:
        (out / name).write_text("mine\n")
    before = snapshot(out) | {".tfgraph-output": (out / ".tfgraph-output").read_bytes()}
    line = refused(tfgraph("build", spec, "--to", to, "-o", str(out), "--seed", "1"),
                   "chat_template.jinja, generation_config.json, special_tokens_map.json",
                   "not written by tfgraph")
    assert str(out) in line
    assert snapshot(out) | {".tfgraph-output": (out / ".tfgraph-output").read_bytes()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging left
    for name in USER_SIDE_FILES:
        (out / name).unlink()
    result = tfgraph("build", spec, "--to", to, "-o", str(out), "--seed", "1")
    assert result.returncode == 0, result.stderr


def test_files_tfgraph_wrote_last_time_are_replaced_or_removed(folder: Path,
                                                               tmp_path: Path) -> None:
    """Side files the previous build wrote (recorded in its mark) go when the next build
    does not write them; one the user changed since is refused by name; a file of the
    user's that this build writes with the same bytes is kept."""
    out = tmp_path / "out"
    assert tfgraph("build", str(folder), "--to", "torch", "-o", str(out)).returncode == 0
    assert (out / "tokenizer.json").is_file()
    (out / "tokenizer.json").write_bytes((out / "tokenizer.json").read_bytes() + b" ")
    refused(tfgraph("build", TINY, "--to", "torch", "-o", str(out)), "tokenizer.json")
    assert (out / "tokenizer.json").read_bytes().endswith(b" ")
    (out / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    result = tfgraph("build", str(folder), "--to", "torch", "-o", str(out), "--seed", "1")
    assert result.returncode == 0, result.stderr  # the same bytes: nothing lost
    result = tfgraph("build", TINY, "--to", "torch", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        ".tfgraph-output", "model.py", "spec.yaml", "weights.safetensors"]


def _copied(src: Path, dst: Path) -> Path:
    """``src`` copied as ``cp -r`` or a tar restore leaves it: the same bytes, each file with
    another modification time (set to 2000-01-01, so that it differs for certain)."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    for path in dst.iterdir():
        os.utime(path, ns=(946_684_800 * 10**9, 946_684_800 * 10**9))
    return dst


def test_a_copied_folder_is_rebuilt_in_place(tmp_path: Path) -> None:
    """The mark records each file's digest beside its size and modification time: a folder
    tfgraph built, copied (new modification times), is rebuilt in place; a file edited in
    the copy (same size, other bytes) is still refused by name and kept."""
    spec = str(ROOT / "specs" / "tiny-llama.yaml")
    out = tmp_path / "out"
    assert tfgraph("build", spec, "--to", "torch", "-o", str(out)).returncode == 0
    copy = _copied(out, tmp_path / "copy")
    result = tfgraph("build", spec, "--to", "torch", "-o", str(copy), "--seed", "1")
    assert result.returncode == 0, result.stderr
    new = copy / "weights.safetensors"
    assert new.read_bytes() != (out / "weights.safetensors").read_bytes()  # replaced
    edited = _copied(out, tmp_path / "edited") / "weights.safetensors"
    data = bytearray(edited.read_bytes())
    data[-1] ^= 1
    edited.write_bytes(data)
    refused(tfgraph("build", spec, "--to", "torch", "-o", str(edited.parent), "--seed", "1"),
            "weights.safetensors: not written by tfgraph")
    assert edited.read_bytes() == data


def test_a_mark_without_digests_vouches_by_size_and_time(tmp_path: Path) -> None:
    """A mark of [size, mtime_ns] pairs (tfgraph before digests) vouches for a file as it
    did: unchanged size and modification time; a copied folder's files it cannot vouch for."""
    spec = str(ROOT / "specs" / "tiny-llama.yaml")
    out = tmp_path / "out"
    assert tfgraph("build", spec, "--to", "torch", "-o", str(out)).returncode == 0
    mark = out / ".tfgraph-output"
    wrote = json.loads(mark.read_text())["tfgraph_wrote"]
    legacy = {"tfgraph_wrote": {name: entry[:2] for name, entry in wrote.items()}}
    mark.write_text(json.dumps(legacy))
    copy = _copied(out, tmp_path / "copy")
    refused(tfgraph("build", spec, "--to", "torch", "-o", str(copy), "--seed", "1"),
            "weights.safetensors: not written by tfgraph")
    result = tfgraph("build", spec, "--to", "torch", "-o", str(out), "--seed", "1")
    assert result.returncode == 0, result.stderr


def test_an_earlier_tfgraphs_empty_mark_vouches_only_for_the_names_rebuilt(
        tmp_path: Path) -> None:
    """An empty .tfgraph-output (tfgraph before marks recorded files): the files this build
    writes again replace theirs; any other file is refused by name."""
    out = tmp_path / "out"
    assert tfgraph("build", TINY, "--to", "torch", "-o", str(out)).returncode == 0
    (out / ".tfgraph-output").write_bytes(b"")
    (out / "tokenizer.json").write_text("mine\n")
    refused(tfgraph("build", TINY, "--to", "torch", "-o", str(out), "--seed", "1"),
            "tokenizer.json")
    assert (out / "tokenizer.json").read_text() == "mine\n"
    (out / "tokenizer.json").unlink()
    result = tfgraph("build", TINY, "--to", "torch", "-o", str(out), "--seed", "1")
    assert result.returncode == 0, result.stderr
    assert (out / ".tfgraph-output").stat().st_size > 0  # it records now
