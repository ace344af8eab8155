"""Full-recompute generation on the PyTorch module (tfgraph.generation.recompute).

The module's ``forward`` takes one whole sequence (``input_ids``, or ``src_ids, tgt_ids``), so
each step reruns every row's prefix under ``torch.no_grad``; rows of different lengths run as
separate batches (grouped by length), which gives what a correctly masked padded batch would.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tfgraph.generation.recompute import Recompute


class RecomputeTorch(Recompute):
    """A :class:`~tfgraph.generation.backend.Stepper` over a tfgraph torch module (eval mode)
    on ``device``."""

    def __init__(self, module: nn.Module, encoder_decoder: bool, vocab: int,
                 max_len: int | None, decoder_start: int = 0, output_probs: bool = False,
                 device: str = "cpu") -> None:
        super().__init__(vocab, max_len, encoder_decoder=encoder_decoder,
                         decoder_start=decoder_start, output_probs=output_probs)
        self.device = torch.device(device)
        self.module = module.eval().to(self.device)

    def _forward(self, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
        with torch.no_grad():
            args = [torch.from_numpy(np.ascontiguousarray(a)).to(self.device) for a in inputs]
            out = self.module(*args)
        result: np.ndarray = out.float().cpu().numpy()
        return result
