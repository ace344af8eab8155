"""Where a decode step's time goes in onnxruntime, per operator type, for KV-cache ONNX models.

    python benchmarks/decode_profile.py MODEL.onnx [MODEL.onnx ...] [--threads 2] [--steps 63]

Each model (tfgraph's ``build --kv-cache`` model, or onnxruntime-genai's builder's model: both
take ``input_ids``, ``attention_mask``, ``past_key_values.{i}.key|value`` and return
``present.{i}.*``) runs in this venv's onnxruntime on the CPU: a 16-token prefill, then
``--steps`` one-token steps feeding each step's present back as the next past, the way
``tfgraph generate`` and ``og.Generator`` drive them. Printed per model:

- ms per step of ``session.run`` alone (profiling off), the figure to compare;
- with onnxruntime's profiler on (which slows every node a little): the decode steps' kernel
  time per operator type, the sum over nodes, and what of the step is outside the kernels
  (the executor's scheduling, allocation and copying of inputs and outputs).

benchmarks/decode.py measures the sides; this file explains one against another. Running
both models in one onnxruntime separates what the graph costs from what the runtime does.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

PROMPT_LEN = 16
TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
         "tensor(float16)": np.float16}


def session(model: Path, threads: int, profile_dir: str | None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(profile_dir, "decode")
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def head_size(model: Path, dim: Any) -> int:
    """The past's last dimension: fixed in the model, else genai_config.json's head_size
    (onnxruntime-genai's builder leaves it symbolic)."""
    if isinstance(dim, int):
        return dim
    config = json.loads((model.parent / "genai_config.json").read_text())
    return int(config["model"]["decoder"]["head_size"])


def decode(sess: Any, model: Path, steps: int) -> list[float]:
    """Prefill, then ``steps`` steps; returns the seconds of each step's ``session.run``."""
    inputs = {i.name: i for i in sess.get_inputs()}
    outputs = [o.name for o in sess.get_outputs()]
    past = {name: np.zeros((1, int(i.shape[1]), 0, head_size(model, i.shape[3])),
                           TYPES[i.type])
            for name, i in inputs.items() if name.startswith("past_key_values.")}
    ids = np.arange(3, 3 + PROMPT_LEN, dtype=np.int64)[None, :]
    total, seconds = 0, []
    for step in range(steps + 1):
        new = ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total + new), np.int64),
                 "position_ids": np.arange(total, total + new, dtype=np.int64)[None, :], **past}
        feeds = {k: v.astype(TYPES[inputs[k].type]) for k, v in feeds.items() if k in inputs}
        start = time.perf_counter()
        out = dict(zip(outputs, sess.run(None, feeds)))
        if step:
            seconds.append(time.perf_counter() - start)
        past = {f"past_key_values.{k[len('present.'):]}": v for k, v in out.items()
                if k.startswith("present.")}
        total += new
        ids = np.argmax(out["logits"][:, -1], axis=-1).astype(np.int64)[:, None]
    return seconds


def kernel_times(trace: str) -> tuple[dict[str, float], float, int, int]:
    """(kernel µs per op type, run µs, runs, kernels run) summed over the decode steps (the
    runs after the first, the prefill) of an onnxruntime profile."""
    events = json.loads(Path(trace).read_text())
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    decode_runs = runs[1:]
    per_type: dict[str, float] = defaultdict(float)
    count = 0
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if any(a <= e["ts"] <= b for a, b in decode_runs):
            per_type[e["args"]["op_name"]] += e["dur"]
            count += 1
    return dict(per_type), float(sum(b - a for a, b in decode_runs)), len(decode_runs), count


def report(model: Path, threads: int, steps: int) -> list[str]:
    plain = decode(session(model, threads, None), model, steps)
    with tempfile.TemporaryDirectory() as tmp:
        sess = session(model, threads, tmp)
        decode(sess, model, steps)
        per_type, run_us, runs, count = kernel_times(sess.end_profiling())
    kernels = sum(per_type.values())
    lines = [f"{model}: {len(sess.get_inputs())} inputs, {threads} threads",
             f"  session.run {1e3 * float(np.median(plain)):.2f} ms/step (median of {steps}, "
             "profiling off)",
             f"  profiled: {run_us / runs / 1e3:.2f} ms/step, {count // runs} kernels "
             f"{kernels / runs / 1e3:.2f} ms, outside kernels {(run_us - kernels) / runs / 1e3:.2f}"
             " ms"]
    for op, us in sorted(per_type.items(), key=lambda kv: -kv[1])[:12]:
        lines.append(f"    {op:36} {us / runs / 1e3:7.3f} ms/step  {100 * us / kernels:5.1f}%")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--steps", type=int, default=63)
    args = parser.parse_args()
    for model in args.models:
        print("\n".join(report(model, args.threads, args.steps)), flush=True)


if __name__ == "__main__":
    main()
