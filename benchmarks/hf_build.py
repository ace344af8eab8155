"""A Hugging Face folder to ONNX: ``tfgraph build DIR`` vs onnxruntime-genai's model builder.

    python benchmarks/hf_build.py [--quick] [--skip-peer] [--repeat 3]

The workload is a folder as downloaded from the hub (benchmarks/hf_folders.py makes it with
transformers, random weights, cached under benchmarks/.cache/): a 200.8M-parameter Llama
(d 1024, 12 layers, 16/4 heads, ffn 2816, vocab 32000, untied head; 803 MB of float32
safetensors) plus a word-level ``tokenizer.json``. Both sides turn it into an fp32 ONNX model
for onnxruntime on the CPU, each as a fresh process, timed as what a user waits for:

- the named peer: ``python -m onnxruntime_genai.models.builder -i DIR -o OUT -p fp32 -e cpu``
  (onnxruntime-genai 0.18.0, in a venv of its own: benchmarks/genai_peer.py);
- tfgraph: ``python -m tfgraph build DIR --to onnx -o OUT/model.onnx``, and ``--to torch``.

Each process is measured alone: wall time around ``fork`` .. ``os.wait4``, and peak RSS from
the rusage ``wait4`` returns (``ru_maxrss``, KiB on Linux). A small launcher process does the
fork and the wait (see LAUNCHER: a child's ru_maxrss starts at its forking parent's peak, and
this process grows to GBs). The figure is the largest peak of the process and of any child it
waited for, not their sum. The builder's one child is a short ``git rev-parse`` run while
the builder waits (its figure starts at the builder's peak at that moment, so it cannot raise
the maximum); tfgraph's build spawns none. Runs alternate sides round by round
so background load hits both alike; medians are printed with the ratios against the goals
(tfgraph >= 3x faster, <= 0.5x the peer's peak RSS).

Then both ONNX models run in onnxruntime (the project venv's) on the same token ids, the
peer's with its KV-cache inputs at past length 0, and their logits are compared with each
other and with transformers' own model loaded from the folder. Last, tfgraph builds a
Mixtral-style MoE folder and a T5 folder, checked against transformers the same way; the peer
is tried once on each and its error line reported (it builds neither).

The closing block is what to paste into benchmarks/RESULTS.md. Exit status 1 when a tfgraph
build fails or its logits disagree with transformers'.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import hf_folders  # benchmarks/ is sys.path[0] when run as a script
from genai_peer import builder_command, builder_env, venv_python
from hf_logits import compare_onnx, torch_folder_line
from machine import load_average

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
SPEED_GOAL = 3.0  # peer time / tfgraph time, at least
RSS_GOAL = 0.5  # tfgraph peak RSS / peer peak RSS, at most
MIB = 1024 * 1024


# Forks and waits for the measured command from a process that is itself small. ru_maxrss
# is kept across exec: a child forked (or vforked, as subprocess does) by this benchmark would
# start with this process's own high-water mark (GBs, after transformers and onnxruntime have
# run here), and every command would report at least that. Started with -I -S, the launcher
# holds a few MB, printed as the floor of the figure.
LAUNCHER = """
import os, sys, time
result, argv = sys.argv[1], sys.argv[2:]
with open("/proc/self/status") as status:
    floor = next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
with open(result, "w") as out:
    out.write(f"{wall} {usage.ru_maxrss} {os.waitstatus_to_exitcode(status)} {floor}")
"""


@dataclass(frozen=True)
class Run:
    """One process: wall seconds, peak RSS in bytes, exit status and its last output line."""

    wall: float
    peak_rss: int
    rc: int
    last_line: str
    floor: int  # bytes: the launcher's own peak when it forked, which peak_rss cannot go under


def measure(cmd: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> Run:
    """Run ``cmd`` to completion under the launcher; stdout and stderr go to ``log`` (a file,
    not a pipe that nobody reads while the launcher blocks in wait4)."""
    result = log.with_suffix(".rusage")
    with open(log, "wb") as sink:
        launcher = subprocess.run([sys.executable, "-I", "-S", "-c", LAUNCHER, str(result), *cmd],
                                  cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    if launcher.returncode:
        sys.exit(f"the launcher failed ({launcher.returncode}) on {' '.join(cmd)}; see {log}")
    wall, maxrss_kib, rc, floor_kib = result.read_text().split()
    return Run(float(wall), int(maxrss_kib) * 1024, int(rc), _last_line(log),
               int(floor_kib) * 1024)


def _last_line(log: Path) -> str:
    """The last meaningful line of a log: an exception or error line, progress bars skipped."""
    text = log.read_text(errors="replace").replace("\r", "\n")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line.lower()]
    return (errors or lines or [""])[-1][:300]


class Bench:
    """The work folder, the two sides' command lines and the runs so far."""

    def __init__(self, work: Path, peer_python: Path | None) -> None:
        self.work = work
        self.peer_python = peer_python
        self.runs: dict[str, list[Run]] = {}
        self.failed = False  # a tfgraph build failed, or its logits disagree

    def out(self, label: str) -> Path:
        """A fresh, empty output folder for one run (the previous run's output removed)."""
        path = self.work / label.replace(" ", "_")
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def tfgraph(self, label: str, folder: Path, to: str) -> Run:
        out = self.out(label)
        target = out / "model.onnx" if to == "onnx" else out / "torch"
        cmd = [sys.executable, "-m", "tfgraph", "build", str(folder), "--to", to, "-o",
               str(target)]
        return self._record(label, measure(cmd, self.work, out.with_suffix(".log")))

    def peer(self, label: str, folder: Path) -> Run:
        assert self.peer_python is not None
        out = self.out(label)
        cmd = builder_command(self.peer_python, folder, out, self.work / "genai-cache")
        run = measure(cmd, self.work, out.with_suffix(".log"), builder_env(self.peer_python))
        return self._record(label, run)

    def _record(self, label: str, run: Run) -> Run:
        self.runs.setdefault(label, []).append(run)
        self.failed |= run.rc != 0 and label.startswith("tfgraph")
        status = "ok" if run.rc == 0 else f"exit {run.rc}: {run.last_line}"
        print(f"  {label:37} {run.wall:7.2f} s  {run.peak_rss / MIB:8.1f} MiB  {status}",
              flush=True)
        return run

    def floor(self) -> int:
        """The largest launcher peak under any run: no figure here can be below it."""
        return max((r.floor for runs in self.runs.values() for r in runs), default=0)

    def median(self, label: str) -> tuple[float, float] | None:
        """Median wall seconds and peak RSS bytes of the label's successful runs."""
        ok = [r for r in self.runs.get(label, []) if r.rc == 0]
        if not ok:
            return None
        return (statistics.median(r.wall for r in ok),
                statistics.median(r.peak_rss for r in ok))


def describe(spec: hf_folders.FolderSpec, folder: Path) -> str:
    """One line naming the folder's model: parameters, sizes, bytes on disk."""
    c = spec.config
    if spec.encoder_decoder:
        shape = (f"d {c['d_model']}, {c['num_layers']}+{c['num_layers']} layers, "
                 f"{c['num_heads']} heads, ffn {c['d_ff']}")
    else:
        shape = (f"d {c['hidden_size']}, {c['num_hidden_layers']} layers, "
                 f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads, "
                 f"ffn {c['intermediate_size']}")
        if "num_local_experts" in c:
            shape += f" x {c['num_local_experts']} experts top-{c['num_experts_per_tok']}"
    params = hf_folders.param_count(folder)
    return (f"{spec.model_class} {params / 1e6:.1f}M ({shape}, vocab {c['vocab_size']}), "
            f"{hf_folders.weights_bytes(folder) / 1e6:.1f} MB float32 safetensors")


def llama_rounds(bench: Bench, folder: Path, repeat: int) -> None:
    """Alternate the sides, round by round (peer first in even rounds, last in odd ones)."""
    for i in range(repeat):
        print(f" round {i + 1}/{repeat}", flush=True)
        steps = [lambda: bench.tfgraph("tfgraph build --to onnx", folder, "onnx"),
                 lambda: bench.tfgraph("tfgraph build --to torch", folder, "torch")]
        if bench.peer_python is not None:
            peer = lambda: bench.peer("onnxruntime-genai builder", folder)  # noqa: E731
            steps = [peer, *steps] if i % 2 == 0 else [*steps, peer]
        for step in steps:
            step()


def ratio_lines(bench: Bench) -> list[str]:
    """The table of medians and the two ratios against the goals."""
    peer = bench.median("onnxruntime-genai builder")
    lines = [f"  {'':34} {'wall s':>8} {'peak RSS':>12}"]
    for label in ("onnxruntime-genai builder", "tfgraph build --to onnx",
                  "tfgraph build --to torch"):
        med = bench.median(label)
        if label not in bench.runs:
            continue
        if med is None:
            lines.append(f"  {label:34} failed: {bench.runs[label][-1].last_line}")
            continue
        times = ", ".join(f"{r.wall:.2f}" if r.rc == 0 else f"{r.wall:.2f} (failed)"
                          for r in bench.runs[label])
        line = f"  {label:34} {med[0]:8.2f} {med[1] / MIB:8.1f} MiB  (runs {times})"
        if peer is not None and label == "tfgraph build --to onnx":  # the goals
            speed, rss = peer[0] / med[0], med[1] / peer[1]
            line += (f"\n  {'':34} {speed:.2f}x faster (goal >= {SPEED_GOAL:g}x: "
                     f"{'met' if speed >= SPEED_GOAL else 'NOT met'}), "
                     f"{rss:.2f}x the peer's peak RSS (goal <= {RSS_GOAL:g}x: "
                     f"{'met' if rss <= RSS_GOAL else 'NOT met'})")
        elif peer is not None and label.startswith("tfgraph"):  # for information: no goal
            # (about 1.4 s of it is importing torch: model.py is rendered from torch kernels)
            line += (f"\n  {'':34} {peer[0] / med[0]:.2f}x faster, {med[1] / peer[1]:.2f}x the "
                     "peer's peak RSS (a PyTorch folder; the goals are for ONNX)")
        lines.append(line)
    return lines


def unsupported(bench: Bench, spec: hf_folders.FolderSpec, folder: Path) -> list[str]:
    """tfgraph's build of a folder the peer cannot build; the peer tried once."""
    print(f" {spec.name}: {describe(spec, folder)}", flush=True)
    lines = [f"{describe(spec, folder)}:"]
    label = f"tfgraph build --to onnx ({spec.name})"
    run = bench.tfgraph(label, folder, "onnx")
    if run.rc == 0:
        lines.append(f"  {'tfgraph build --to onnx':34} {run.wall:8.2f} {run.peak_rss / MIB:8.1f}"
                     " MiB")
        check = compare_onnx(folder, spec.encoder_decoder,
                             {"tfgraph": bench.work / label.replace(" ", "_") / "model.onnx"})
        lines += [f"  {line}" for line in check.lines]
        bench.failed |= not check.ok
    else:
        lines.append(f"  tfgraph build --to onnx failed: {run.last_line}")
        bench.failed = True
    if bench.peer_python is not None:
        peer = bench.peer(f"onnxruntime-genai builder ({spec.name})", folder)
        error = peer.last_line.replace(str(folder), "DIR")
        outcome = (f"exit {peer.rc}: {error}" if peer.rc else
                   f"built it ({peer.wall:.2f} s, {peer.peak_rss / MIB:.1f} MiB)")
        lines.append(f"  onnxruntime-genai builder: {outcome}")
    shutil.rmtree(bench.work / label.replace(" ", "_"), ignore_errors=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny folders: a smoke run")
    parser.add_argument("--skip-peer", action="store_true",
                        help="tfgraph only: no peer venv, no peer runs")
    parser.add_argument("--repeat", type=int, default=None,
                        help="rounds on the Llama folder (default 3, 1 with --quick)")
    args = parser.parse_args()
    repeat = args.repeat or (1 if args.quick else 3)
    specs = hf_folders.specs(args.quick)
    CACHE.mkdir(exist_ok=True)
    folders = {name: hf_folders.folder(spec, CACHE / "hf") for name, spec in specs.items()}
    peer_python = None if args.skip_peer else venv_python(CACHE)
    start_load = load_average()
    with tempfile.TemporaryDirectory(prefix="hf_build-", dir=CACHE) as tmp:
        bench = Bench(Path(tmp), peer_python)
        llama = folders["llama"]
        print(f"{describe(specs['llama'], llama)}", flush=True)
        llama_rounds(bench, llama, repeat)
        outputs = {"tfgraph": bench.work / "tfgraph_build_--to_onnx" / "model.onnx"}
        if peer_python is not None:
            outputs["onnxruntime-genai"] = bench.work / "onnxruntime-genai_builder" / "model.onnx"
        check = compare_onnx(llama, False, {k: v for k, v in outputs.items() if v.exists()})
        bench.failed |= bench.median("tfgraph build --to onnx") is None or not check.ok
        torch_dir = bench.work / "tfgraph_build_--to_torch" / "torch"
        if torch_dir.exists():
            line, same = torch_folder_line(llama, torch_dir)
            check.lines.append(line)
            bench.failed |= not same
        else:
            check.lines.append("--to torch: no folder to check (its last build failed)")
            bench.failed = True
        outputs["torch"] = torch_dir
        for label in list(outputs):
            shutil.rmtree(outputs[label].parent, ignore_errors=True)
        others = [unsupported(bench, specs[name], folders[name]) for name in ("mixtral", "t5")]
    summary = [f"$ python benchmarks/hf_build.py{' --quick' if args.quick else ''}"
               f"{' --skip-peer' if args.skip_peer else ''}",
               f"{os.cpu_count()} CPUs ({platform.machine()}), {start_load} at the start, "
               f"{load_average()} at the end; median of {repeat} alternating round(s); "
               f"peak RSS by wait4 (floor {bench.floor() / MIB:.1f} MiB: the launcher's own)",
               f"{describe(specs['llama'], llama)}:",
               *ratio_lines(bench), *[f"  {line}" for line in check.lines]]
    for lines in others:
        summary += lines
    print("\n--- summary (for benchmarks/RESULTS.md) ---")
    print("```\n" + "\n".join(summary) + "\n```")
    sys.exit(1 if bench.failed else 0)


if __name__ == "__main__":
    main()
