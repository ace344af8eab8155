"""Full-recompute generation on onnxruntime (tfgraph.generation.recompute).

Today's ONNX models take one whole sequence and have no attention mask, so each step reruns
every row's prefix; rows of different lengths run as separate batches (grouped by length),
which gives what a correctly masked padded batch would. A KV-cache model (``attention_mask`` and
``past_key_values.*`` inputs) is driven by its own stepper instead (tfgraph.commands.steppers).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfgraph.exporters.onnx import runtime as rt
from tfgraph.generation.recompute import Recompute


class RecomputeOnnx(Recompute):
    """A :class:`~tfgraph.generation.backend.Stepper` over an onnxruntime session of a tfgraph
    model with inputs ``input_ids`` or ``src_ids, tgt_ids``."""

    def __init__(self, session: Any, inputs: tuple[str, ...], vocab: int,
                 max_len: int | None, decoder_start: int = 0,
                 output_probs: bool = False) -> None:
        super().__init__(vocab, max_len, encoder_decoder=inputs == rt.TWO_STACK_INPUTS,
                         decoder_start=decoder_start, output_probs=output_probs)
        self.session = session
        self.inputs = inputs

    def _forward(self, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
        out = rt.run(self.session, dict(zip(self.inputs, inputs)))
        return np.asarray(out, dtype=np.float32)
