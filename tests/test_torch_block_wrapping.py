"""Per-block wrapping of the torch module the way training frameworks do it: a block put in
its ``ModuleDict`` entry after building (torchtitan's activation checkpointing,
``apply_activation_checkpointing``, per-block ``torch.compile``) is the one that runs, and
weights reparametrized with ``torch.nn.utils.parametrize`` are read through it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.utils.parametrize as parametrize
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing, checkpoint_wrapper)

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch.module import LayerModule, TorchModel
from tfgraph.spec.loader import load_spec

from conftest import ROOT, small

SPEC = small(load_spec(ROOT / "specs" / "tiny-llama.yaml"))


def _model() -> TorchModel:
    module = to_torch(tfgraph.compile(SPEC, loss=True), seed=0).train()
    assert isinstance(module, TorchModel)
    return module


def _ids() -> torch.Tensor:
    return torch.randint(0, SPEC.vocab, (2, 12), generator=torch.Generator().manual_seed(1))


def _step(module: TorchModel) -> tuple[torch.Tensor, dict[str, torch.Tensor], int, int]:
    """Loss, gradients, layer forwards run and bytes autograd saved for one step."""
    runs = [0]
    for sub in module.modules():
        if isinstance(sub, LayerModule):
            sub.register_forward_pre_hook(lambda *_: runs.__setitem__(0, runs[0] + 1))
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.nbytes
        return t

    ids = _ids()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = module(ids, ids)
    loss.backward()
    grads = {n.replace("._checkpoint_wrapped_module", ""): p.grad.clone()
             for n, p in module.named_parameters() if p.grad is not None}
    return loss.detach(), grads, runs[0], saved[0]


def _titan_ac(module: TorchModel) -> None:  # torchtitan's apply_ac, full checkpointing
    layers = module.get_submodule("decoder.layers")
    for layer_id, block in layers.named_children():
        layers.register_module(layer_id, checkpoint_wrapper(block))


def _apply_ac(module: TorchModel) -> None:
    apply_activation_checkpointing(module, check_fn=lambda m: isinstance(m, LayerModule))


@pytest.mark.parametrize("wrap", [_titan_ac, _apply_ac], ids=["register_module", "apply"])
def test_checkpointed_blocks_recompute(wrap: Callable[[TorchModel], None]) -> None:
    loss, grads, runs, saved = _step(_model())
    wrapped = _model()
    wrap(wrapped)
    loss_ac, grads_ac, runs_ac, saved_ac = _step(wrapped)
    layers = SPEC.layers
    assert runs == layers and runs_ac == 2 * layers  # each block reruns in the backward
    assert saved_ac < saved / 2
    torch.testing.assert_close(loss_ac, loss, rtol=0, atol=0)
    assert grads_ac.keys() == grads.keys() and len(grads) == len(list(wrapped.parameters()))
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ac[name], grad, rtol=1e-6, atol=1e-7)


def test_per_block_compile_runs() -> None:
    module = _model().eval()
    with torch.no_grad():
        expected = module(_ids(), _ids())
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, _inputs: list[torch.Tensor]) -> Callable[..., object]:
        graphs.append(1)
        return gm.forward

    layers = module.get_submodule("decoder.layers")
    for layer_id, block in layers.named_children():
        layers.register_module(layer_id, torch.compile(block, backend=backend))
    torch._dynamo.reset()
    with torch.no_grad():
        got = module(_ids(), _ids())
    assert graphs  # the compiled blocks ran, not the ones bound at build time
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


class _Zero(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(w)


class _Scale(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * 20.0


def test_parametrized_weights_are_computed() -> None:
    module = to_torch(tfgraph.compile(SPEC), seed=0).eval()
    ids = _ids()
    with torch.no_grad():
        base = module(ids)
    head = module.get_submodule("head")
    parametrize.register_parametrization(head, "weight", _Zero())
    with torch.no_grad():
        assert module(ids).abs().max().item() == 0.0
    parametrize.remove_parametrizations(head, "weight", leave_parametrized=False)
    with torch.no_grad():
        torch.testing.assert_close(module(ids), base, rtol=0, atol=0)


def test_parametrized_weight_in_masked_forward_and_gradient() -> None:
    module = to_torch(tfgraph.compile(SPEC), seed=0).eval()
    ids, mask = _ids(), torch.ones_like(_ids())
    with torch.no_grad():
        module(ids, attention_mask=mask)  # a KV-cache part built before parametrizing
    q = module.get_submodule("decoder.layers.0.self_attn.q")
    original = q.weight
    with torch.no_grad():
        plain = module(ids)
    parametrize.register_parametrization(q, "weight", _Scale())
    with torch.no_grad():
        whole, masked = module(ids), module(ids, attention_mask=mask)
    assert (whole - plain).abs().max().item() > 1e-3  # the parametrization counts
    torch.testing.assert_close(masked, whole, rtol=1e-5, atol=1e-5)  # in the part too
    module(ids, attention_mask=mask).sum().backward()
    assert q.parametrizations.weight.original is original
    assert original.grad is not None and original.grad.abs().max().item() > 0
