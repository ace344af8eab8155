"""KV-cache decoding: tfgraph generate vs transformers' generate and onnxruntime-genai.

    python benchmarks/decode.py [--quick] [--skip-peer] [--repeat 5]

Same weights everywhere: the random Llama folder of benchmarks/hf_folders.py (200.8M params,
d 1024, 12 layers, GQA 16:4, ffn 2816, vocab 32000, float32; cached under benchmarks/.cache/).
Batch 1, one 16-token prompt, 64 new tokens, greedy, EOS ignored. Sides, all in this run:

- transformers ``model.generate`` (torch eager, its KV cache; benchmarks/decode_sides.py);
- onnxruntime-genai 0.18 ``og.Generator`` on its own builder's model and on tfgraph's
  ``build --kv-cache`` models, written out and fused (their genai_config.json; the fused
  one's shares past/present buffers), each at onnxruntime-genai's default
  session options and with ``intra_op_num_threads`` = the cores (benchmarks/decode_genai.py,
  a worker in the peer venv of benchmarks/genai_peer.py);
- tfgraph: ``tfgraph.generate(DIR, backend="onnx")`` and ``backend="torch"`` (KV cache), the
  onnx one also on one thread, and ``cache=False`` (full recomputation each step); and the
  ``build --kv-cache --fused-attention`` model of the folder (onnxruntime's
  GroupQueryAttention, shared past/present buffers: "tfgraph onnx, fused attention");
- batch 8 (eight 16-token prompts): tfgraph onnx (both builds) and transformers.

Timing: one definition for all (benchmarks/decode_timing.py): decode tokens/s over the
interval from each row's first token to its last. Rounds alternate the sides' order so
background load hits all alike; medians are printed. Then: do all sides produce the same
tokens; ratios against the issue's goals (tfgraph onnx decode >= 1.0x transformers, >= 1.4x
onnxruntime-genai, within 10% of the memory-bandwidth floor; prefill <= 1.0x transformers');
how a tfgraph step splits between the model call and the loop around it. The closing block is
what to paste into benchmarks/RESULTS.md. Exit status 1 when a tfgraph side's tokens differ
from transformers'.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import bandwidth
import hf_folders  # benchmarks/ is sys.path[0] when run as a script
from decode_genai import GenaiWorker
from decode_report import Report
from decode_sides import HfSide, TfgraphSide, prompts_for
from decode_timing import Timing
from genai_peer import builder_command, builder_env, venv_python
from hf_build import describe
from machine import load_average

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
PROMPT_LEN, NEW_TOKENS, BATCH = 16, 64, 8

Side = Callable[[list[list[int]], int], Timing]


def eos_ids(folder: Path) -> frozenset[int]:
    """The folder's EOS ids (config.json), which every side here ignores."""
    eos = json.loads((folder / "config.json").read_text()).get("eos_token_id")
    return frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])


def build_models(folder: Path, work: Path, peer: Path | None) -> dict[str, Path]:
    """tfgraph's KV-cache model (with genai_config.json) and, with a peer, the peer builder's
    model: folders that ``og.Model`` loads."""
    out = {"tfgraph": work / "tfgraph", "tfgraph-fused": work / "tfgraph-fused"}
    for key, flags in (("tfgraph", []), ("tfgraph-fused", ["--fused-attention"])):
        out[key].mkdir()
        cmd = [sys.executable, "-m", "tfgraph", "build", str(folder), "--to", "onnx",
               "--kv-cache", *flags, "-o", str(out[key] / "model.onnx")]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        print(f"  {done.stdout.strip()}", flush=True)
    if peer is not None:
        out["genai"] = work / "genai"
        log = work / "genai-builder.log"
        with open(log, "wb") as sink:
            built = subprocess.run(builder_command(peer, folder, out["genai"], work / "gcache"),
                                   stdout=sink, stderr=subprocess.STDOUT, env=builder_env(peer))
        if built.returncode:
            sys.exit(f"onnxruntime-genai's builder failed; see {log}")
        print(f"  onnxruntime-genai's builder wrote {out['genai']}", flush=True)
    return out


def genai_sides(peer: Path, models: dict[str, Path], work: Path, prompts: list[list[int]],
                workers: list[GenaiWorker]) -> dict[str, tuple[Side, list[list[int]]]]:
    """onnxruntime-genai on its builder's model and on tfgraph's two builds, at its default
    session options and on every core; the workers started are appended to ``workers``."""
    sides: dict[str, tuple[Side, list[list[int]]]] = {}
    for model, name in (("genai", "own model"), ("tfgraph", "tfgraph's model"),
                        ("tfgraph-fused", "tfgraph's fused model")):
        for threads in (None, os.cpu_count() or 1):
            label = f"onnxruntime-genai, {name}, " + (
                f"{threads} threads" if threads else "default threads")
            log = work / f"worker-{len(workers)}.log"
            workers.append(GenaiWorker(peer, models[model], threads, log, builder_env(peer)))
            sides[label] = (workers[-1].run, prompts)
    return sides


def rounds(sides: dict[str, tuple[Side, list[list[int]]]], repeat: int, new_tokens: int,
           report: Report, array_bytes: int) -> None:
    """A warm-up run of each side, then ``repeat`` rounds, the order rotated each round, each
    after a bandwidth measurement (this VM's two-core read rate changes from minute to minute,
    so the floor is measured beside the runs it bounds)."""
    for label, (side, prompts) in sides.items():
        side(prompts, min(4, new_tokens))
    labels = list(sides)
    for i in range(repeat):
        report.bandwidths.append(bandwidth.measure(array_bytes, repeats=3))
        order = labels[i % len(labels):] + labels[:i % len(labels)]
        if i % 2:
            order.reverse()
        for label in order:
            side, prompts = sides[label]
            report.add(label, side(prompts, new_tokens))
        bw = report.bandwidths[-1]
        print(f" round {i + 1}/{repeat} ({load_average()}; read {bw.one_thread / 1e9:.1f} GB/s "
              f"one thread, {bw.all_cores / 1e9:.1f} GB/s {bw.threads} threads): " + ", ".join(
            f"{label} {report.runs[label][-1].decode_tokens_per_s:.1f}" for label in labels),
            flush=True)


def alone(label: str, side: TfgraphSide, prompts: list[list[int]], runs: int, new_tokens: int,
          report: Report) -> None:
    """A side measured after the rounds, on its own (a warm-up run, then ``runs``)."""
    side.run(prompts, min(2, new_tokens))
    for _ in range(runs):
        report.add(label, side.run(prompts, new_tokens))
    print(f" {label}: {report.runs[label][-1].decode_tokens_per_s:.2f} tokens/s", flush=True)
    side.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny Llama folder: a smoke run")
    parser.add_argument("--skip-peer", action="store_true",
                        help="no onnxruntime-genai (no peer venv, no peer builds)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="alternating rounds (default 5, 1 with --quick)")
    args = parser.parse_args()
    repeat = args.repeat or (1 if args.quick else 5)
    spec = hf_folders.specs(args.quick)["llama"]
    CACHE.mkdir(exist_ok=True)
    folder = hf_folders.folder(spec, CACHE / "hf")
    peer = None if args.skip_peer else venv_python(CACHE)
    start_load = load_average()
    print(describe(spec, folder), flush=True)
    array_bytes = 1 << (27 if args.quick else 30)
    one = prompts_for(spec.vocab_size, 1, PROMPT_LEN)
    batch = prompts_for(spec.vocab_size, BATCH, PROMPT_LEN)
    report = Report(folder, NEW_TOKENS, PROMPT_LEN, BATCH, eos_ids(folder))
    workers: list[GenaiWorker] = []
    with tempfile.TemporaryDirectory(prefix="decode-", dir=CACHE) as tmp:
        models = build_models(folder, Path(tmp), peer)
        hf = HfSide(folder)
        onnx = TfgraphSide(folder, batch, "onnx")
        # the same weights built with --fused-attention (GroupQueryAttention, shared buffers)
        fused = TfgraphSide(models["tfgraph-fused"] / "model.onnx", batch, "onnx")
        torch_side = TfgraphSide(folder, batch, "torch")
        report.runs_on.update({
            "transformers generate": f"torch eager, {hf.threads} threads",
            "tfgraph onnx": f"{onnx.runs_on}; onnxruntime's default threads (one per core)",
            "tfgraph torch": f"{torch_side.runs_on}, {hf.threads} threads"})
        sides: dict[str, tuple[Side, list[list[int]]]] = {
            "transformers generate": (hf.run, one), "tfgraph onnx": (onnx.run, one),
            "tfgraph onnx, fused attention": (fused.run, one),
            "tfgraph torch": (torch_side.run, one)}
        if peer is not None:
            sides.update(genai_sides(peer, models, Path(tmp), one, workers))
            report.runs_on["onnxruntime-genai"] = (
                "0.18 (its onnxruntime, CPU); default threads: its session defaults, one "
                "intra-op thread (its process gains one thread when 2 are asked for)")
        sides[f"transformers generate, batch {BATCH}"] = (hf.run, batch)
        sides[f"tfgraph onnx, batch {BATCH}"] = (onnx.run, batch)
        sides[f"tfgraph onnx, fused attention, batch {BATCH}"] = (fused.run, batch)
        try:
            rounds(sides, repeat, NEW_TOKENS, report, array_bytes)
        finally:
            for worker in workers:
                worker.close()
        onnx.close()
        fused.close()
        torch_side.close()
        del hf, onnx, fused, torch_side, sides
        alone("tfgraph onnx, 1 thread", TfgraphSide(folder, one, "onnx", threads=1), one,
              repeat, NEW_TOKENS, report)
        alone("tfgraph onnx, no cache", TfgraphSide(folder, one, "onnx", cache=False), one,
              1, NEW_TOKENS, report)
    header = [f"$ python benchmarks/decode.py{' --quick' if args.quick else ''}"
              f"{' --skip-peer' if args.skip_peer else ''}",
              f"{os.cpu_count()} CPUs ({platform.machine()}), {start_load} at the start, "
              f"{load_average()} at the end; median of {repeat} alternating round(s)",
              f"{describe(spec, folder)}"]
    lines, ok = report.lines()
    print("\n--- summary (for benchmarks/RESULTS.md) ---")
    print("```\n" + "\n".join(header + lines) + "\n```")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
