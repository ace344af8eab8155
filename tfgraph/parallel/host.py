"""Whether a ZeRO 3 step is likely host-bound: FSDP2's host work per layer group against the
device time the plan gives that group (``tfgraph plan``'s ``step.host_bound``).

The plan times the device; the host's (CPU's) work is assumed to run ahead of it
(``timing.ASSUMPTIONS["host"]``). Under ZeRO 3 as PyTorch's FSDP2 runs it, one ``fully_shard``
group per layer (examples/train_distributed.py, torchtitan), that work is large and does not
shrink with the batch: profiled on this project's H200 machine (torch 2.11), the forward of
TinyLlama-1.1B's 22 groups spent 55.8 ms of host time at batch 4 x 1024, 54.9 at 16 x 1024 and
62.5 at 32 x 1024 (an H100 machine's: 53.2 at 16 x 1024), the backward 70.7 ms at 4 x 1024:
about 2.5 and 3.2 ms a group (benchmarks/RESULTS.md, "the FSDP2 step profiled").

The host and the device meet once a step (the loss's ``.item()``); in between the host queues
kernels ahead, and a phase where it falls behind is made up in one where it leads. So the step,
not each phase, is compared: where a group's device time per micro-batch, forward + backward,
is below the host's 5.7 ms, the device waits for the host. Measured on the H200: device 2.67 ms
a group at batch 4 x 1024 (the step 1.46x the plan), 5.25 ms at 8 x 1024 (1.20x); 7.83 ms at
12 x 1024 (0.95x), 10.44 at 16 x 1024 (0.96x). (The profile at 12 x 1024 put the forward's
device time, 44.4 ms over 22 groups, 2.0 ms a group, below the host's 2.5, and the step was
not longer: the comparison per phase is wrong.)

The figures are one host's (a faster or slower CPU, another PyTorch, shifts them), so the plan
names the risk rather than adding a host time to the step.
"""

from __future__ import annotations

from typing import Any

from tfgraph.parallel.layout import Layout

FSDP2_HOST_S = {"forward": 2.5e-3, "backward": 3.2e-3}
"""Host seconds per FSDP2 group and micro-batch, forward and backward (the module docstring)."""


def host_bound(layout: Layout, parts: dict[str, Any], layers: int) -> str | None:
    """A sentence saying the step is likely host-bound, or None: under ZeRO 3, when the device
    time of one layer group in one micro-batch, forward + backward (``parts``: the plan's
    ``step.time_parts``; ``layers``: the slowest stage's layers), is below FSDP2's host time per
    group (``FSDP2_HOST_S``)."""
    if layout.zero < 3 or layers < 1:
        return None
    passes = layout.microbatches * layers
    # (recompute's rerun is left out on both sides: it adds forward work to host and device)
    device = (parts["forward"] + parts["backward"]) / passes
    host = sum(FSDP2_HOST_S.values())
    if device >= host:
        return None
    return (f"likely: ZeRO 3's device time per layer group and micro-batch, forward + "
            f"backward {device * 1e3:.2f} ms, is below the host time FSDP2 spent per group on "
            f"this project's H200 machine ({host * 1e3:.1f} ms: forward "
            f"{FSDP2_HOST_S['forward'] * 1e3:.1f}, backward {FSDP2_HOST_S['backward'] * 1e3:.1f}, "
            "torch 2.11): the device would wait for the host and the step take longer than "
            "planned (a larger micro-batch moves the step back onto the device; "
            "benchmarks/RESULTS.md)")
