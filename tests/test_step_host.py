"""benchmarks/step_host.py counts what it says it counts: its host times are for a person to read
(benchmarks/RESULTS.md), the structure of its op counts is checked here, on tiny-llama."""

from __future__ import annotations

import sys

import torch.distributed as dist

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import step_host  # noqa: E402
import train_distributed  # noqa: E402  (step_host puts examples/ on the path)


def test_fsdp2_step_dispatches_the_plain_step_and_its_hooks() -> None:
    m = step_host.measure(ROOT / "specs" / "tiny-llama.yaml", repeat=1)
    plain, fsdp2 = m["plain"], m["fsdp2"]
    assert set(plain) == {"forward", "backward"}
    assert set(fsdp2) == {"forward", "backward", "optimizer", "hooks"}
    assert m["tensors"] == 21  # tiny-llama: 2 layers of 9, the token table, final norm, head
    for phase in [*plain.values(), *fsdp2.values(), m["loop"], m["decode"]]:
        assert phase.ops > 0
    # FSDP2 runs the same module: every op of the plain step, and its hooks' on top; forward
    # casts each float32 shard to the bf16 compute dtype (MixedPrecisionPolicy), one op at least
    # per parameter tensor
    assert fsdp2["forward"].ops - plain["forward"].ops >= m["tensors"]
    assert fsdp2["backward"].ops > plain["backward"].ops
    assert fsdp2["hooks"].ops == (fsdp2["forward"].ops + fsdp2["backward"].ops
                                  - plain["forward"].ops - plain["backward"].ops)
    assert m["loop"].ops > fsdp2["optimizer"].ops  # AdamW's per-tensor loop against foreach


def _foreach(ops: dict[str, int]) -> dict[str, int]:
    return {name: n for name, n in ops.items() if "_foreach_" in name}


def test_foreach_adamw_ops_are_fixed_and_the_loop_grows_per_tensor() -> None:
    train_distributed.start_group(60.0)
    try:
        counts = {(n, foreach): step_host.optimizer_ops(n, 2, foreach)
                  for n in (10, 20, 40) for foreach in (True, False)}
    finally:
        dist.destroy_process_group()
    kernels = _foreach(counts[10, True])
    assert kernels and all(_foreach(counts[n, True]) == kernels for n in (20, 40))
    loop = {n: sum(counts[n, False].values()) for n in (10, 20, 40)}
    assert not any(_foreach(counts[n, False]) for n in (10, 20, 40))
    per_tensor = (loop[20] - loop[10]) / 10
    assert per_tensor >= 8  # a dozen or so DTensor operations for each parameter tensor
    assert loop[40] - loop[20] == 20 * per_tensor  # linear in the tensors
