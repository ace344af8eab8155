"""benchmarks/gpu.py ``--steps profile`` (ONNX part): where a batch-1 decode step's time goes
on the GPU, kernels against the host's share.

Three sides, each its own model or session, one at a time: tfgraph's fused-attention model
(``build --kv-cache --fused-attention``) without a CUDA graph, the same model with its decode
step captured as one (``cuda_graph=True``), and onnxruntime-genai's generator on its own
builder's model (what gpu.py's decode step built into ``--work``/genai). Each prefills a
16-token prompt with buffers sized for the decode benchmark's 256 new tokens, steps ahead so
that the measured steps sit around the middle of that run, times :data:`STEPS` decode steps
with nothing watching, then :data:`STEPS` more under ``torch.profiler.profile(activities=[CPU,
CUDA])``: CUPTI records every kernel the process launches, onnxruntime's included. Printed per
side: wall time per token (unwatched, and under the profiler), the summed device time of the
kernels and of the copies/memsets per token, the host's gap (unwatched wall - device), the
kernel count per token, and the top kernels by total device time.

Without CUDA, one line says so; a side that fails (or a profiler that cannot start) is one
line, and the others go on. gpu.py runs it in a process of its own, after its closing block,
under a time limit: a crash or hang in the profiler (CUPTI) costs neither the block nor more
than that limit of device time.

    python benchmarks/gpu_profile.py FUSED.onnx GENAI_DIR --prompt-ids 5,17,42,...
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

STEPS = 32  # decode steps measured per side (unwatched, then again profiled)
NEW = 256  # the decode benchmark's new tokens: the buffers' size and the middle of the run
TOP = 12  # kernels listed per side
NAME = 60  # characters of a kernel's name shown
DEVICE_CATS = {"kernel": "kernels", "gpu_memcpy": "copies", "gpu_memset": "copies"}

Step = Callable[[], None]


def profile_lines(fused_path: Path, genai_dir: Path, prompt: list[int], cuda: bool,
                  say: Callable[[str], None]) -> list[str]:
    """The profile's lines (each also passed to ``say`` as it comes)."""
    if not cuda:
        line = ("profile: skipped, it needs CUDA (torch.profiler's CUDA activity, CUPTI, "
                "records the device's kernels)")
        say(line)
        return [line]
    try:
        import torch
        from torch.profiler import ProfilerActivity, supported_activities

        if ProfilerActivity.CUDA not in supported_activities():
            raise RuntimeError("this torch's profiler has no CUDA activity (no CUPTI/kineto)")
        # (CUPTI initialised before any CUDA graph is captured: torch's workaround for
        # pytorch/pytorch#75504, a no-op where it is not needed)
        torch.cuda.init()
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            pass
    except Exception as err:  # noqa: BLE001 - said in one line, gpu.py goes on
        line = f"profile: the profiler cannot start: {one_line(err)}"
        say(line)
        return [line]
    # the profiled steps centred in the decode benchmark's run: ``skip`` steps ahead, then
    # STEPS timed unwatched, then STEPS profiled
    skip = NEW // 2 - STEPS // 2 - STEPS
    first = len(prompt) + skip + STEPS  # the position the first profiled step writes
    lines = [f"profile (batch 1, {len(prompt)}-token prompt, buffers for {NEW} new tokens; "
             f"{skip} steps ahead, {STEPS} timed unwatched, then {STEPS} profiled at "
             f"positions {first}-{first + STEPS - 1}; torch.profiler with CUPTI):"]
    say(lines[0])
    sides: list[tuple[str, Callable[[], tuple[Step, Callable[[], None]]]]] = [
        ("tfgraph ONNX fused attention (no CUDA graph)",
         lambda: tfgraph_stepper(fused_path, prompt, False)),
        ("tfgraph ONNX fused attention + CUDA graph",
         lambda: tfgraph_stepper(fused_path, prompt, True)),
        ("onnxruntime-genai (own model, CUDA)", lambda: genai_stepper(genai_dir, prompt)),
    ]
    for name, open_side in sides:
        try:
            step, close = open_side()
            try:
                got = profile_side(name, step, skip, genai_dir.parent / "profile")
            finally:
                close()
        except Exception as err:  # noqa: BLE001 - one side's failure, the others go on
            got = [f"  {name}: failed: {one_line(err)}"]
        for line in got:
            say(line)
        lines += got
    return lines


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}"


def tfgraph_stepper(fused_path: Path, prompt: list[int], cuda_graph: bool,
                    provider: str = "cuda") -> tuple[Step, Callable[[], None]]:
    """tfgraph's fused stepper on the CUDA provider (``provider``), prepared as
    ``tfgraph.generate`` prepares it (``cuda_graph``: the decode step captured here) and prefilled: a greedy decode step,
    and what closes it."""
    from tfgraph.commands.generate_api import prepare, warm_up
    from tfgraph.generation.loop import left_pad

    ready = prepare(str(fused_path), [prompt], provider=provider, eos_token_id=None,
                    cuda_graph=cuda_graph)
    try:
        warm_up(ready, NEW)
        stepper = ready.opened.stepper
        ids, lengths = left_pad([np.asarray(prompt, np.int64)])
        logits = [stepper.prefill(ids, lengths)]
    except BaseException:
        ready.opened.close()
        raise

    def step() -> None:  # the decoding loop's greedy step: argmax on the host, one step
        logits[0] = stepper.step(np.asarray(logits[0]).argmax(-1).astype(np.int64))

    return step, ready.opened.close


def genai_stepper(model_dir: Path, prompt: list[int]) -> tuple[Step, Callable[[], None]]:
    """onnxruntime-genai's generator on its own model, prompt appended (the prefill) and its
    first token taken: ``generate_next_token``, one decode step each."""
    if not (model_dir / "genai_config.json").is_file():
        raise FileNotFoundError(f"no model in {model_dir} (gpu.py's decode step builds it)")
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + NEW, min_length=len(prompt) + NEW,
                              do_sample=False, batch_size=1)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([prompt], np.int32))
    gen.generate_next_token()  # the prompt's token (from the prefill's logits)
    held = [model, params, gen]

    def close() -> None:
        held.clear()

    return gen.generate_next_token, close


def profile_side(name: str, step: Step, skip: int, folder: Path) -> list[str]:
    """Run ``skip`` steps, time :data:`STEPS` unwatched and :data:`STEPS` under the profiler;
    the side's lines (its trace is left in ``folder``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(skip):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    torch.cuda.synchronize()
    plain = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        watched = time.perf_counter() - start
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / ("".join(c if c.isalnum() else "-" for c in name).strip("-") + ".json")
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text()).get("traceEvents", [])
    return summary(name, events, STEPS, plain, watched)


def summary(name: str, events: Iterable[dict[str, Any]], steps: int, plain_s: float,
            watched_s: float) -> list[str]:
    """A side's lines from a Chrome trace's events (``cat`` "kernel", "gpu_memcpy",
    "gpu_memset": device activity, ``dur`` in microseconds; the rest is the host's): per
    token over ``steps`` tokens, the wall times given in seconds."""
    total = {"kernels": 0.0, "copies": 0.0}
    count = {"kernels": 0, "copies": 0}
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in events:
        kind = DEVICE_CATS.get(str(event.get("cat", "")).lower())
        if kind is None or event.get("ph", "X") != "X":
            continue
        dur = float(event.get("dur", 0.0))
        total[kind] += dur
        count[kind] += 1
        if kind == "kernels":
            entry = by_name[str(event.get("name", "?"))]
            entry[0] += 1
            entry[1] += dur
    per = 1e3 / steps  # ms per token from seconds over the steps
    device_ms = (total["kernels"] + total["copies"]) / 1e3 / steps
    lines = [f"  {name}: wall {plain_s * per:.3f} ms/token ({watched_s * per:.3f} profiled); "
             f"device {device_ms:.3f} ms/token (kernels {total['kernels'] / 1e3 / steps:.3f}, "
             f"copies {total['copies'] / 1e3 / steps:.3f}); host gap "
             f"{plain_s * per - device_ms:.3f} ms/token; {count['kernels'] / steps:.1f} "
             f"kernels/token"]
    if not count["kernels"]:
        lines.append("    the profiler saw no kernels (a CUDA graph's replays hidden from "
                     "CUPTI?)")
        return lines
    lines.append(f"    {'kernel (top %d by device time)' % TOP:{NAME}s} {'calls':>6s} "
                 f"{'total us':>10s} {'us/call':>8s}")
    top = sorted(by_name.items(), key=lambda item: -item[1][1])[:TOP]
    for kernel, (calls, spent) in top:
        lines.append(f"    {kernel[:NAME]:{NAME}s} {int(calls):6d} {spent:10.1f} "
                     f"{spent / calls:8.2f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fused", type=Path, help="tfgraph's build --kv-cache --fused-attention "
                        "model (float16)")
    parser.add_argument("genai", type=Path, help="onnxruntime-genai's builder's model folder")
    parser.add_argument("--prompt-ids", required=True, help="the prompt, ids joined by commas")
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt_ids.split(",")]
    import torch

    profile_lines(args.fused, args.genai, prompt, torch.cuda.is_available(),
                  lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
