"""benchmarks/gpu.py's figures from given numbers (no timing here): the goal pairs timed
several times in turns and reported as medians with their spread, the goal lines from those
medians, and ``--steps profile``'s summary of a profiler trace and its line without CUDA; a
repeat's tokens against the first run's; a failed build, repeat, close or bandwidth measurement
as one line, the rest going on. The script itself runs on a lent GPU machine; what these check
decides what its lines say."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu  # noqa: E402
import gpu_profile  # noqa: E402

FUSED_GRAPH = "tfgraph ONNX fused attention + CUDA graph"
GENAI = "onnxruntime-genai (own model, CUDA)"


def repeated(side: str, rates: list[float], log: list[str],
             tokens: list[list[list[int]]] | None = None) -> gpu.Row:
    """A row timed once at ``rates[0]`` whose ``again`` hands out the other rates in order
    (with ``tokens``' in order, else the first run's tokens), writing its side into ``log``
    at each repeat and at its close."""
    row = gpu.Row(side, 1, rates[0], [[1, 2]], "compile 1.0 s apart")
    left = iter(zip(rates[1:], tokens or [[[1, 2]]] * len(rates[1:])))

    def again() -> tuple[float, list[list[int]]]:
        log.append(side)
        return next(left)

    row.again = again
    row.close = lambda: log.append(f"close {side}")
    return row


def test_a_pair_is_timed_in_turns_and_reported_as_medians() -> None:
    log: list[str] = []
    ours = repeated(FUSED_GRAPH, [439.1, 465.3, 450.0], log)
    theirs = repeated(GENAI, [377.5, 320.2, 340.0], log)
    gpu.run_again([ours, theirs])
    assert log == [FUSED_GRAPH, GENAI, FUSED_GRAPH, GENAI, f"close {FUSED_GRAPH}",
                   f"close {GENAI}"]
    assert ours.tokens_per_s == 450.0 and theirs.tokens_per_s == 340.0
    assert ours.note == "median of 3 runs (439.1-465.3 tokens/s); compile 1.0 s apart"
    assert ours.again is None and ours.close is None  # the model let go
    lines = [line for line in gpu.goal_lines([ours, theirs]) if "not measured" not in line]
    assert lines == [f"goal batch 1: {FUSED_GRAPH} / {GENAI} = 1.32x (goal >= 1.4x: MISSED; "
                     "medians of 3 runs in turns, each turn's ratio 1.16-1.45x)"]


def test_a_failed_repeat_keeps_the_runs_so_far() -> None:
    log: list[str] = []
    row = repeated("tfgraph torch compiled", [100.0, 300.0], log)  # no third rate: it fails
    gpu.run_again([row])
    assert row.rates == [100.0, 300.0] and row.tokens_per_s == 200.0
    assert row.note.startswith("median of 2 runs (100.0-300.0 tokens/s); compile 1.0 s apart; "
                               "repeat 3 failed: StopIteration")
    assert log[-1] == "close tfgraph torch compiled"


def test_a_side_timed_once_against_a_repeated_peer_says_so() -> None:
    log: list[str] = []
    peer = repeated(GENAI, [377.5, 320.2, 340.0], log)
    gpu.run_again([peer])
    once = gpu.Row("tfgraph ONNX (cuda)", 1, 408.0, None)
    line = gpu.goal_lines([once, peer])[0]
    assert line == (f"goal batch 1: tfgraph ONNX (cuda) / {GENAI} = 1.20x (goal >= 1.4x: "
                    "MISSED; one run against the median of 3)")
    assert gpu.goal_lines([peer]) == [f"goal batch 1: tfgraph ONNX (cuda) / {GENAI}: not "
                                      "measured (tfgraph ONNX (cuda) did not run)",
                                      f"goal batch 1: tfgraph ONNX fused attention (cuda) / "
                                      f"{GENAI}: not measured (tfgraph ONNX fused attention "
                                      "(cuda) did not run)",
                                      f"goal batch 1: {FUSED_GRAPH} / {GENAI}: not measured "
                                      f"({FUSED_GRAPH} did not run)"]


def test_the_repeated_sides_are_the_goal_pairs() -> None:
    goals = {(side, peer) for side, peer, _ in gpu.GOALS}
    assert set(gpu.REPEATED) <= goals and len(gpu.REPEATED) == 2
    assert gpu.repeats("transformers static cache") and not gpu.repeats("transformers eager")


def test_profile_without_cuda_is_one_line() -> None:
    said: list[str] = []
    lines = gpu_profile.profile_lines(Path("missing.onnx"), Path("missing"), [5, 6], False,
                                      said.append)
    assert lines == said and len(lines) == 1 and "needs CUDA" in lines[0]


def test_profile_step_runs_apart_and_says_its_failures(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu.py runs the profile in a process of its own (a crash or hang in CUPTI must not
    take the closing block or the slice's time): its lines come back, a failure is one."""
    fused, genai = tmp_path / "model.onnx", tmp_path / "genai"
    # here torch has no CUDA: the process says so, as gpu.py would on a CUDA machine
    (line,) = gpu.profile_step(fused, tmp_path, [5, 6], True)
    assert "needs CUDA" in line
    assert gpu.profile_step(fused, tmp_path, [5, 6], False) == [line]
    (line,) = gpu.profile_step(fused, tmp_path, [], True)  # no prompt: it fails
    assert line.startswith("profile: its process failed (exit 1): ValueError: "), line
    monkeypatch.setattr(gpu, "PROFILE_LIMIT", 0.05)
    (line,) = gpu.profile_step(fused, tmp_path, [5, 6], True)
    assert line == "profile: its process failed (no end in 0.05 s, stopped)", line
    assert not genai.exists()


def test_profile_summary_of_a_trace() -> None:
    def kernel(name: str, dur: float, cat: str = "kernel") -> dict[str, object]:
        return {"ph": "X", "cat": cat, "name": name, "dur": dur}

    long_name = "void onnxruntime::cuda::GroupQueryAttention<half, 128>(" + "x" * 80
    events = ([kernel("gemv", 20.0)] * 64 + [kernel(long_name, 50.0)] * 32
              + [kernel("Memcpy DtoH", 4.0, "gpu_memcpy")] * 32
              + [kernel("cudaLaunchKernel", 3.0, "cuda_runtime")] * 96
              + [{"ph": "f", "cat": "kernel", "name": "flow"}])
    lines = gpu_profile.summary("side", events, 32, 32 * 2.0e-3, 32 * 2.5e-3)
    # per token: kernels 2 x 20 + 50 = 90 us, copies 4 us; wall 2 ms unwatched
    assert lines[0] == ("  side: wall 2.000 ms/token (2.500 profiled); device 0.094 ms/token "
                        "(kernels 0.090, copies 0.004); host gap 1.906 ms/token; 3.0 "
                        "kernels/token")
    header, first, second = lines[1:]
    assert "calls" in header and "us/call" in header
    assert first.split()[-3:] == ["32", "1600.0", "50.00"]
    assert first.strip().startswith(long_name[:gpu_profile.NAME]) and long_name not in first
    assert second.split() == ["gemv", "64", "1280.0", "20.00"]


def test_profile_says_when_it_saw_no_kernels() -> None:
    lines = gpu_profile.summary("graph", [], 32, 0.064, 0.07)
    assert "0.0 kernels/token" in lines[0] and "saw no kernels" in lines[1]


def test_a_repeat_that_decoded_other_tokens_says_so() -> None:
    log: list[str] = []
    row = repeated("tfgraph torch compiled", [100.0, 300.0, 200.0], log,
                   [[[1, 2]], [[1, 3]]])  # the third run's tokens differ from the first's
    gpu.run_again([row])
    assert row.note == ("median of 3 runs (100.0-300.0 tokens/s); compile 1.0 s apart; "
                        "repeat 3: other tokens")


def test_each_repeatable_side_hands_back_its_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``again`` (tfgraph's loop, transformers' generate, onnxruntime-genai's generator)
    returns the repeat's tokens beside its rate, which run_again compares with the first
    run's."""
    import torch

    torch.set_num_threads(1)
    prompts = [[5, 6, 7], [8, 9, 10]]
    row = gpu.tfgraph_side(str(ROOT / "specs" / "tiny-llama.yaml"), prompts, 4, True,
                           backend="torch", provider="cpu")
    rate, tokens = row.again()
    assert rate > 0 and tokens == row.tokens and len(tokens) == 2
    row.close()

    class Model:  # transformers' generate: greedy here, the prompt then 7s
        def generate(self, ids: torch.Tensor, max_new_tokens: int, **_: object) -> torch.Tensor:
            return torch.cat([ids, torch.full((ids.shape[0], max_new_tokens), 7)], 1)

    row = gpu.hf_side(Model(), prompts, 4, "cpu", True)
    assert row.again()[1] == row.tokens == [[7] * 4] * 2

    class Generator:  # onnxruntime-genai's: 4 new tokens, the third generator's differ
        def __init__(self, model: Any, params: object) -> None:
            model.runs += 1
            self.run, self.new = model.runs, list[int]()

        def append_tokens(self, ids: object) -> None: ...

        def is_done(self) -> bool:
            return len(self.new) >= 4

        def generate_next_token(self) -> None:
            self.new.append(9 if self.run == 3 else 0)

        def get_sequence(self, i: int) -> list[int]:
            return [1] * gpu.PROMPT_LEN + self.new

    class Params:
        def __init__(self, model: object) -> None: ...

        def set_search_options(self, **_: object) -> None: ...

    class Model2:
        runs = 0

        def __init__(self, path: str) -> None: ...

    fake = types.SimpleNamespace(Model=Model2, GeneratorParams=Params, Generator=Generator)
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", fake)
    row = gpu.genai_run(Path("genai"), prompts, 4, True)  # runs 1 (warm-up) and 2 (timed)
    gpu.run_again([row])  # runs 3 (other tokens) and 4
    assert row.tokens == [[0] * 4] * 2 and "repeat 2: other tokens" in row.note, row.note
    assert "repeat 3" not in row.note


def test_a_close_that_fails_keeps_the_runs_and_closes_the_rest() -> None:
    log: list[str] = []
    ours = repeated(FUSED_GRAPH, [439.1, 465.3, 450.0], log)
    theirs = repeated(GENAI, [377.5, 320.2, 340.0], log)

    def broken() -> None:
        raise RuntimeError("CUDA error: an illegal memory access")

    ours.close = broken
    gpu.run_again([ours, theirs])
    assert ours.tokens_per_s == 450.0 and ours.close is None
    assert ours.note.endswith("closing failed: RuntimeError: CUDA error: an illegal memory "
                              "access"), ours.note
    assert theirs.tokens_per_s == 340.0 and log[-1] == f"close {GENAI}"


def test_repeats_that_fail_outside_a_run_are_one_line(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    log: list[str] = []
    row = repeated(GENAI, [377.5, 320.2, 340.0], log)

    def broken(rows: list[gpu.Row]) -> None:
        raise MemoryError("out of host memory")

    monkeypatch.setattr(gpu, "run_again", broken)
    gpu.repeat_rows([row])
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"repeats of {GENAI}: failed: MemoryError: out of host memory"
    assert row.tokens_per_s == 377.5 and row.again is None and len(said) == 2  # and its row
    assert log == [f"close {GENAI}"]  # let go all the same
    assert "repeats failed: MemoryError" in said[1]


def test_a_failed_bandwidth_measurement_keeps_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(cuda: bool) -> tuple[float, str]:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    monkeypatch.setattr(gpu, "device_bandwidth", broken)
    floor, line = gpu.floor_line(2_200_000_000, True)
    assert floor is None and line == ("bandwidth floor (batch 1): not measured: RuntimeError: "
                                      "CUDA out of memory. Tried to allocate 2.00 GiB")
    rows = [gpu.Row("transformers eager", 1, 40.0, [[1, 2]]), gpu.Row(GENAI, 1, 320.0, [[1, 3]])]
    assert gpu.table(rows, floor) == ["batch 1: transformers eager: 40.0 tokens/s",
                                      f"batch 1: {GENAI}: 320.0 tokens/s, 1/2 tokens = "
                                      "transformers eager"]
    monkeypatch.setattr(gpu, "device_bandwidth", lambda cuda: (2.2e12, "amax"))
    assert gpu.floor_line(2_200_000_000, True)[0] == pytest.approx(1000.0)


def test_a_failed_tfgraph_command_is_an_exception_not_an_exit(tmp_path: Path) -> None:
    with pytest.raises(gpu.CliFailed) as failed:
        gpu.tfgraph_cli("build", str(tmp_path / "missing.yaml"), "--to", "hf", "-o",
                        str(tmp_path / "out"))
    line = gpu.one_line(failed.value)
    assert line.startswith("tfgraph build failed: ") and "\n" not in line, line
    assert len(line) > len("tfgraph build failed: ")  # the command's own last line


def test_a_check_whose_build_fails_is_one_line_and_the_rest_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: str) -> str:
        raise gpu.CliFailed(["python", "-m", "tfgraph", *args], "Traceback\nerror: no CUDA\n")

    monkeypatch.setattr(gpu, "tfgraph_cli", broken)
    lines = gpu.cuda_checks(tmp_path, False)
    assert lines == [f"run --check, base.yaml {dtype} on cpu: its build failed: tfgraph build "
                     "failed: error: no CUDA" for dtype in ("float32", "float16")]
    with pytest.raises(gpu.CliFailed):  # caught by main's Exception, as other failures
        gpu.fused_check(tmp_path, False)
    monkeypatch.setattr(gpu, "main", lambda: broken("build"))
    with pytest.raises(SystemExit, match="tfgraph build failed:"):  # uncaught: the run ends
        gpu.entry()
