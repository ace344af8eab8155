"""Training through padding masks (issue 28 item 6): an encoder-decoder's forward takes the
source's padding mask, and a masked forward (decoder or encoder-decoder), which runs the
model's KV-cache graphs, sends its gradients to the model's own parameters."""

from __future__ import annotations

import pytest
import torch

import tfgraph
from tfgraph.exporters import to_torch

from conftest import ROOT


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_masked_decoder_forward_trains_the_models_parameters() -> None:
    """A mask runs the KV-cache graph; its gradients must be the full graph's, on the same
    Parameter objects (before: none reached them, the optimizer stepped nothing)."""
    model = to_torch(tfgraph.compile(ROOT / "specs" / "tiny-llama.yaml"), seed=0).train()
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    model(ids).float().square().mean().backward()
    plain = grads(model)
    model.zero_grad(set_to_none=True)
    model(ids, attention_mask=torch.ones_like(ids)).float().square().mean().backward()
    masked = grads(model)
    assert plain.keys() == masked.keys() == {n for n, _ in model.named_parameters()}
    for name in plain:
        torch.testing.assert_close(masked[name], plain[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["tiny-t5", "tiny-bart"])
def test_the_source_padding_mask(name: str) -> None:
    model = to_torch(tfgraph.compile(ROOT / "specs" / f"{name}.yaml"), seed=0).eval()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 100, (2, 7), generator=g)
    tgt = torch.randint(3, 100, (2, 5), generator=g)
    with torch.no_grad():
        full = model(src, tgt)
        # all real: the full-sequence graph's logits
        torch.testing.assert_close(model(src, tgt, attention_mask=torch.ones_like(src)), full,
                                   rtol=1e-5, atol=1e-5)
        # a batch of a 7-token and a 4-token source, left-padded: each row as if alone
        short = src[1:, 3:]
        batch = torch.cat([src[:1], torch.cat([torch.zeros_like(src[1:, :3]), short], 1)])
        mask = torch.ones_like(batch)
        mask[1, :3] = 0
        got = model(batch, tgt, attention_mask=mask)
        torch.testing.assert_close(got[0], full[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1], model(short, tgt[1:])[0], rtol=1e-5, atol=1e-5)
        # the padding's ids do not matter
        other = batch.clone()
        other[1, :3] = 42
        torch.testing.assert_close(model(other, tgt, attention_mask=mask), got)


def test_training_an_encoder_decoder_through_the_mask_reaches_every_parameter() -> None:
    """Gradients compared in eval mode (tiny-t5's dropout 0.1 would draw different masks in
    the two graphs); in train mode the masked forward drops out too."""
    model = to_torch(tfgraph.compile(ROOT / "specs" / "tiny-t5.yaml"), seed=0).train()
    g = torch.Generator().manual_seed(2)
    src = torch.randint(3, 100, (2, 6), generator=g)
    tgt = torch.randint(3, 100, (2, 4), generator=g)
    mask = torch.ones_like(src)
    assert not torch.equal(model(src, tgt, attention_mask=mask),
                           model(src, tgt, attention_mask=mask))  # dropout is on
    model.eval()
    model(src, tgt).float().square().mean().backward()
    plain = grads(model)
    model.zero_grad(set_to_none=True)
    model(src, tgt, attention_mask=torch.ones_like(src)).float().square().mean().backward()
    masked = grads(model)
    assert masked.keys() == plain.keys() and masked
    for name in plain:
        torch.testing.assert_close(masked[name], plain[name], rtol=1e-4, atol=1e-6)
