"""Host time and dispatched ATen ops per phase of a training step, plain and under FSDP2, and of
one eager decode step: is an H100 step host-bound?

    python benchmarks/step_host.py [--spec specs/llama.yaml] [--repeat 7]

``tfgraph plan --kernels eager`` times a step as its kernels' device time. On an H100 (the third
H100 run of benchmarks/RESULTS.md) the plain eager step of llama.yaml (bf16, batch 4 x 1024,
forward + float32 token cross-entropy + backward) took 69.0 ms against 58.5 predicted then (62.7
since the plan's memory-bound kernel rate, 2026-11-28), and examples/train_distributed.py's
FSDP2 step (one process, bf16 parameters, AdamW foreach) 180.2 ms against 105.9 (110.2): is the host
(Python, the dispatcher, DTensor, FSDP2's hooks) the rest? Here the spec's structure (its layers,
parameter tensors and ops) runs at tiny widths (``small_spec``: 2 dims per head, vocabulary 256,
batch 1 x 4), on the CPU, one thread, so the arithmetic is nil and what is timed is the host's
work, the approach of benchmarks/optimizer_host.py. RMSNorm runs as one fused op each way, as
on CUDA (``cuda_norms``). Measured:

- (a) "plain": ``to_torch``'s module in bfloat16: forward + loss, backward;
- (b) "fsdp2": the example's own ``build`` (``fully_shard`` per block, ``MixedPrecisionPolicy``
  bf16 parameters, float32 reduction) and ``adamw`` (foreach) on one gloo rank, its step as the
  example runs it: forward + loss, backward, optimizer. FSDP2's hooks (casts, gathers,
  copy-outs, reduce-scatters, their Python) are "hooks": fsdp2's forward and backward less
  plain's. "loop": the optimizer phase with AdamW's per-tensor loop (``foreach=False``);
- (c) "decode": ``tfgraph.generate(module, backend="torch")`` at batch 1 through its KV cache,
  what ``tfgraph generate --backend torch`` runs per token: ms per decode token, ops per token.

Ops are counted below autograd by a ``TorchDispatchMode`` (about one per kernel an eager GPU run
launches; a DTensor operation counts once); host ms are medians of perf_counter over
``--repeat`` rounds, each round running every step once in turn (a shared machine's load hits
all alike), without the counter. The estimate: eager decode at batch 1 is host-bound on a GPU,
so an H100 machine's ms per token over this CPU's is its host's time relative to this one;
each phase's host time here, times that factor, is its host time there, set beside the plan's
device time for the phase: the step is then at least the larger of the two totals, and the
sum over phases of the larger of the two if the device waits for each phase's host. One factor
is a rough transfer: decode is mostly module calls and small ops without autograd, backward
runs in the C++ autograd engine, FSDP2's hooks and DTensor's sharding propagation are Python
of their own, and CUDA adds launch, stream and event work that the CPU run does not do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from argparse import Namespace
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # an installed tfgraph first (its tfgraph.exporters); else this checkout
sys.path.insert(0, str(ROOT / "examples"))  # train_distributed: the FSDP2 step's build
sys.path.insert(0, str(ROOT / "benchmarks"))  # optimizer_host: its stand-in parameters

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import tfgraph  # noqa: E402
from tfgraph.exporters import to_torch  # noqa: E402
from tfgraph.spec.schema import Spec  # noqa: E402

BATCH, SEQ, PROMPT = 1, 4, 16
# Measured on two H100 machines (torch 2.11+cu130): eager decode at batch 1 (tfgraph torch eager,
# TinyLlama-1.1B sizes) in ms per token, and steps in ms: the third H100 run's (the plain step
# and the FSDP2 step with AdamW foreach) and benchmarks/RESULTS.md's first H100 (the plain step, and the
# FSDP2 step with AdamW's per-tensor loop, foreach=False).
MACHINES = {"third H100": {"decode": 1e3 / 44.2, "plain": 69.0, "fsdp2": 180.2},
            "first H100": {"decode": 1e3 / 41.5, "plain": 63.6, "fsdp2 loop": 191.8}}


def plan_device(spec_path: Path) -> dict[str, dict[str, float]]:
    """The plan's device time per phase, ms (``plan_step.plan_of``: ``tfgraph plan SPEC --gpus 1
    --gpu h100 --micro-batch 4 --global-batch 4 --seq 1024 --dtype bfloat16 [--zero 3]
    --kernels eager``). FSDP2's copies go 1/3 to forward (one cast and gather) and 2/3 to
    backward (the gather again, resharded after forward, and the gradients' reduce-scatter
    copies)."""
    from plan_step import Step, plan_of

    parts = {}
    for zero in (0, 3):
        # (plan_of reads ROOT / spec: an absolute path stays itself)
        step = Step(str(spec_path), batch=4, seq=1024, dtype="bfloat16", zero=zero,
                    kernels="eager")
        times = plan_of(step, "h100")["step"]["time_parts"]
        parts[zero] = {k: v * 1e3 for k, v in times.items()}
    copies = parts[3].get("fsdp_copies", 0.0)
    return {"plain": {"forward": parts[0]["forward"], "backward": parts[0]["backward"]},
            "fsdp2": {"forward": parts[3]["forward"] + copies / 3,
                      "backward": parts[3]["backward"] + 2 * copies / 3,
                      "optimizer": parts[3]["optimizer"]}}


class OpCounter(TorchDispatchMode):
    """Counts the ATen ops dispatched below autograd while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.names: defaultdict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        self.count += 1
        self.names[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@dataclass
class Phase:
    ms: float
    ops: int


class Clock:
    """Each phase's host seconds (a list per step) and, when counting, its ATen ops."""

    def __init__(self, count: bool = False) -> None:
        self.counting = count
        self.seconds: defaultdict[str, list[float]] = defaultdict(list)
        self.ops: defaultdict[str, int] = defaultdict(int)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        counter = OpCounter() if self.counting else None
        start = time.perf_counter()
        with counter if counter is not None else nullcontext():
            yield
        self.seconds[name].append(time.perf_counter() - start)
        if counter is not None:
            self.ops[name] += counter.count


@contextmanager
def cuda_norms() -> Iterator[None]:
    """RMSNorm as one fused ATen op each way, as CUDA runs it (``_fused_rms_norm``; the CPU
    runs a Python autograd Function in training and a composite of six ops in inference,
    exporters/torch/functional.py): ``F.layer_norm``, one op each way on the CPU too, stands in
    (host time only: its values are not RMSNorm's)."""
    from unittest import mock

    from tfgraph.exporters.torch import functional

    def fused(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), weight, None, eps)
    with mock.patch.object(functional, "rms_norm", fused):
        yield


def small_spec(path: Path) -> Spec:
    """The spec's structure (layers, parameter tensors, ops) at tiny widths: 2 dims per head,
    a feed-forward as wide as the model, a vocabulary of 256."""
    spec = tfgraph.load_spec(path)
    data = spec.model_dump(exclude_unset=True)
    width = 2 * spec.attention.heads
    data.update(d_model=width, vocab=min(spec.vocab_size("source"), 256))
    data["attention"].pop("head_dim", None)
    data["ffn"]["hidden"] = width
    return Spec.model_validate(data)


Step = Callable[[Clock], Any]  # a training step returns its loss


def rounds(steps: dict[str, Step], repeat: int) -> dict[str, dict[str, Phase]]:
    """Each step's median host ms per phase over ``repeat`` rounds (two warm-up rounds first),
    the steps run in turn in each round so that a load that comes and goes (a shared machine)
    hits all alike; and the ops of one more step of each."""
    clocks = {name: Clock() for name in steps}
    for _ in range(repeat + 2):
        for name, step in steps.items():
            step(clocks[name])
    result = {}
    for name, step in steps.items():
        counted = Clock(count=True)
        step(counted)
        result[name] = {phase: Phase(statistics.median(s[2:]) * 1e3, counted.ops[phase])
                        for phase, s in clocks[name].seconds.items()}
    return result


def batch_of(spec: Spec, device: str, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (inputs, labels) of ``batch`` rows of ``seq`` tokens on ``device``."""
    ids = torch.randint(0, spec.vocab_size("source"), (batch, seq + 1), device=device)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def plain_step(spec: Spec, device: str = "cpu", batch: int = BATCH, seq: int = SEQ) -> Step:
    """benchmarks/gpu.py's eager step: the bf16 module, forward + float32 loss, backward
    (the step returns its loss)."""
    model = to_torch(tfgraph.compile(spec.model_copy(update={"dtype": "bfloat16"})),
                     device=device).train()
    inputs, labels = batch_of(spec, device, batch, seq)

    def step(clock: Clock) -> torch.Tensor:
        with clock.phase("forward"):
            loss = F.cross_entropy(model(inputs).float().flatten(0, 1), labels.flatten())
        with clock.phase("backward"):
            loss.backward()
        model.zero_grad(set_to_none=True)
        return loss
    return step


def fsdp2_step(spec: Spec, foreach: bool = True, device: str = "cpu", batch: int = BATCH,
               seq: int = SEQ) -> Step:
    """examples/train_distributed.py's FSDP2 step, built by its own functions (the process group
    must be started: ``train_distributed.start_group``; on CUDA the current device set);
    ``foreach=False``: AdamW's per-tensor loop, as the example stepped it before
    (benchmarks/RESULTS.md's 191.8 ms H100 row). The step returns its loss."""
    import train_distributed as td

    args = Namespace(strategy="fsdp", tp=1, ep=1, sp=False, seed=0, param_dtype="bfloat16")
    model, _, _ = td.build(args, tfgraph.compile(spec), None, torch.device(device))
    optimizer = td.adamw(model, td.LR, td.WEIGHT_DECAY) if foreach else torch.optim.AdamW(
        model.parameters(), lr=td.LR, weight_decay=td.WEIGHT_DECAY, foreach=False)
    inputs, labels = batch_of(spec, device, batch, seq)

    def step(clock: Clock) -> torch.Tensor:
        with clock.phase("forward"):
            loss = F.cross_entropy(model(inputs).float().flatten(0, 1), labels.flatten())
        optimizer.zero_grad(set_to_none=True)
        with clock.phase("backward"):
            loss.backward()
        with clock.phase("optimizer"):
            optimizer.step()
        return loss
    return step


def optimizer_ops(tensors: int, layers: int, foreach: bool) -> dict[str, int]:
    """The ATen ops, by name, of one AdamW step (not the first, which makes the states) on
    benchmarks/optimizer_host.py's stand-in: ``tensors`` 8 x 8 parameters sharded per layer by
    ``fully_shard`` (the process group must be started)."""
    from optimizer_host import stand_in

    params = list(stand_in(tensors, layers).parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=foreach)
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    with OpCounter() as counter:
        optimizer.step()
    return dict(counter.names)


def decode_step(spec: Spec, tokens: int = 32) -> Step:
    """Eager KV-cache decoding at batch 1, ``tfgraph.generate(module, backend="torch")``: a run
    of ``tokens`` new tokens whose phase "token" is the time per decode token (the decode
    interval of tfgraph.generation.result over its tokens); counted, the ops per token: those
    of this run less those of a run of 8, over the difference."""
    model = to_torch(tfgraph.compile(spec))
    prompt = [[(7 * i) % spec.vocab_size("source") for i in range(PROMPT)]]

    def run(new: int) -> Any:
        return tfgraph.generate(model, prompt, max_new_tokens=new, backend="torch",
                                eos_token_id=None)

    def step(clock: Clock) -> None:
        if clock.counting:
            counts = []
            for new in (8, tokens):
                with OpCounter() as counter:
                    run(new)
                counts.append(counter.count)
            clock.ops["token"] = (counts[1] - counts[0]) // (tokens - 8)
        clock.seconds["token"].append(1 / run(tokens).decode_tokens_per_s)
    return step


def measure(spec_path: Path, repeat: int = 7) -> dict[str, Any]:
    """Host ms and ops per phase of (a) "plain", (b) "fsdp2" (its "hooks": the difference from
    plain in forward and backward) and "loop" (fsdp2 with foreach=False), (c) "decode"."""
    import torch.distributed as dist
    import train_distributed as td

    spec = small_spec(spec_path)
    with cuda_norms():
        td.start_group(300.0)
        try:
            got = rounds({"plain": plain_step(spec), "fsdp2": fsdp2_step(spec),
                          "loop": fsdp2_step(spec, foreach=False),
                          "decode": decode_step(spec)}, repeat)
        finally:
            dist.destroy_process_group()
    plain, fsdp2 = got["plain"], got["fsdp2"]
    fsdp2["hooks"] = Phase(sum(fsdp2[p].ms - plain[p].ms for p in plain),
                           sum(fsdp2[p].ops - plain[p].ops for p in plain))
    tensors = sum(1 for _ in to_torch(tfgraph.compile(spec), device="meta").parameters())
    return {"spec": spec, "tensors": tensors, "plain": plain, "fsdp2": fsdp2,
            "loop": got["loop"]["optimizer"], "decode": got["decode"]["token"]}


def estimate(host_ms: dict[str, float], device_ms: dict[str, float]) -> tuple[float, float]:
    """A step's time from each phase's host and device time: (the larger of the two totals,
    the host running ahead of the device throughout; the sum over phases of the larger of the
    two, the device waiting for each phase's host)."""
    return (max(sum(host_ms.values()), sum(device_ms.values())),
            sum(max(host_ms[p], device_ms[p]) for p in device_ms))


def report(m: dict[str, Any], spec_path: Path) -> None:
    spec, dec = m["spec"], m["decode"]
    device_ms = plan_device(spec_path)
    print(f"{spec.name}'s structure at d_model {spec.d_model}: {spec.layers} layers, "
          f"{m['tensors']} parameter tensors, batch {BATCH} x {SEQ}; torch {torch.__version__}, "
          "1 thread; host ms are medians")
    print(f"(c) decode, batch 1: {dec.ms:.2f} ms/token here, {dec.ops} ops/token "
          f"({dec.ms / dec.ops * 1e3:.1f} us/op)")
    print(f"{'step':6} {'phase':10} {'ops':>6} {'ms here':>8} {'us/op':>6} {'H100 device':>11}")
    for name in ("plain", "fsdp2"):
        for phase, got in m[name].items():
            device = device_ms[name].get(phase)
            print(f"{name:6} {phase:10} {got.ops:6d} {got.ms:8.2f} "
                  f"{got.ms / max(got.ops, 1) * 1e3:6.1f} "
                  + ("" if device is None else f"{device:11.2f}"))
    print(f"fsdp2  {'optimizer, foreach=False':17} {m['loop'].ops:6d} {m['loop'].ms:8.2f}")
    print("hooks: FSDP2's forward and backward less the plain step's (inside them, not added)")
    if spec.name != "tinyllama-1.1b":
        print("(the H100 figures are llama.yaml's: no estimate for another spec)")
        return
    print("estimated H100 steps (ms): host, device -> max of the totals / phase by phase; "
          "measured")
    steps = {"plain": m["plain"], "fsdp2": m["fsdp2"],
             "fsdp2 loop": {**m["fsdp2"], "optimizer": m["loop"]}}
    for machine, measured in MACHINES.items():
        factor = measured["decode"] / dec.ms
        print(f"  {machine}: decode {measured['decode']:.1f} ms/token -> host {factor:.2f} x "
              "this one's time")
        for label, got in steps.items():
            if label not in measured:
                continue
            kind = device_ms[label.split()[0]]
            host = {p: got[p].ms * factor for p in kind}
            overlap, serial = estimate(host, kind)
            print(f"    {label:10} {sum(host.values()):6.1f}, {sum(kind.values()):6.1f} -> "
                  f"{overlap:6.1f} / {serial:6.1f}; measured {measured[label]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "specs" / "llama.yaml")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    report(measure(args.spec, args.repeat), args.spec)


if __name__ == "__main__":
    main()
