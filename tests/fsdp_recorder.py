"""What FSDP2 itself runs in a step: every kernel inside its ``FSDP::`` profiler scopes with the
bytes it reads and writes (tests/test_fsdp_copies.py and its torchrun worker)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch.parallel import parallelize

NO_KERNEL = {"aten.empty", "aten.empty_strided", "aten.new_empty", "aten.new_empty_strided",
             "aten.view", "aten.as_strided", "aten.detach", "aten.alias", "aten.split",
             "aten.split_with_sizes", "aten.narrow", "aten.slice", "aten.chunk",
             "aten._local_scalar_dense"}
"""Views and allocations; c10d's collectives (its own namespace) are not counted either."""


def _nbytes(x: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(x) if isinstance(t, torch.Tensor))


class FsdpKernels(TorchDispatchMode):
    """Each kernel inside FSDP2's own profiler scopes: (op, bytes read + written, scope)."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: list[str] = []
        self.kernels: list[tuple[str, int, str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func.overloadpacket)
        if name == "profiler._record_function_enter_new":
            self.scopes.append(args[0])
        elif name == "profiler._record_function_exit":
            self.scopes.pop()
        elif (name in NO_KERNEL or name.startswith("c10d.")
              or not any(s.startswith("FSDP::") for s in self.scopes)):
            pass
        else:
            if name in ("aten.copy_", "aten._foreach_copy_"):  # read src, write self
                moved = _nbytes(args[1]) + _nbytes(args[0])
            elif name in ("fsdp.chunk_cat", "fsdp.split_with_sizes_copy"):  # into ``out``
                moved = _nbytes(args[0]) + _nbytes(kwargs["out"])
            elif name == "fsdp.all_gather_copy_in":  # the inputs into the gather's input
                moved = 2 * _nbytes(out[0])
            else:
                moved = _nbytes(args) + _nbytes(out)
            self.kernels.append((name, moved, self.scopes[-1]))
        return out


def record_step(spec_name: str, mesh: Any, dtype: str, ep: int = 1,
                vocab: int | None = None) -> list[tuple[str, int, str]]:
    """The spec's module sharded by ``parallelize`` (float32 masters, ``dtype`` compute,
    float32 reduction): one step to set FSDP2 up, one more kept, then the kernels of a third
    (its gradients added to the second's: FSDP2's accumulation)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from conftest import ROOT
    from test_torch_module import make_ids

    spec = tfgraph.load_spec(ROOT / "specs" / f"{spec_name}.yaml")
    if vocab is not None:
        spec = spec.model_copy(update={"vocab": vocab})
    graph = tfgraph.compile(spec, loss=True)
    module = to_torch(graph, seed=0)
    parallelize(module, mesh, ep=ep, mp_policy=MixedPrecisionPolicy(
        param_dtype=getattr(torch, dtype), reduce_dtype=torch.float32))
    out_vocab = int(graph.node("logits").type.shape[-1])
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, out_vocab, (2, 6 if "tgt_ids" in graph.inputs else 8),
                           generator=generator)
    inputs = (*make_ids(tfgraph.compile(spec), 2, 8, 6), labels)
    module(*inputs).backward()
    module.zero_grad(set_to_none=True)
    module(*inputs).backward()
    mode = FsdpKernels()
    with mode:
        module(*inputs).backward()
    return mode.kernels
