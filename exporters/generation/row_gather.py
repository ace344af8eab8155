"""Rows of a cache's OrtValues selected where they are, by onnxruntime itself.

A bfloat16 KV cache (``build --kv-cache`` of a bfloat16 spec) cannot go through numpy when
rows leave the batch or beams move (exporters/generation/cached_steppers.onnx_cached's
``select``): numpy has no bfloat16, and the values sit on the session's device. A one-node
model (``Gather`` on axis 0, any element type of the cache) on the session's own providers
picks the rows on that device instead: onnxruntime's CPU and CUDA Gather kernels copy
elements by size, bfloat16 among them.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class RowGather:
    """``gather(value, rows)``: the OrtValue of ``value``'s rows ``rows`` (axis 0), on the
    device ``device`` ("cpu" or "cuda") of ``session``, whose providers it runs on.
    ``elem_type``: the ONNX element type of the values."""

    def __init__(self, session: Any, device: str, elem_type: int) -> None:
        import onnxruntime as ort
        from onnx import helper

        vi = helper.make_tensor_value_info
        graph = helper.make_graph(
            [helper.make_node("Gather", ["values", "rows"], ["selected"], axis=0)],
            "row_gather", [vi("values", elem_type, ["batch", "heads", "length", "width"]),
                           vi("rows", 7, ["rows"])],  # 7: int64
            [vi("selected", elem_type, ["rows", "heads", "length", "width"])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                  ir_version=8)
        options = ort.SessionOptions()
        options.log_severity_level = 4  # a failure raises; tfgraph says it in one line
        self.session = ort.InferenceSession(model.SerializeToString(), options,
                                            providers=session.get_providers())
        self.device = device

    def __call__(self, value: Any, rows: np.ndarray) -> Any:
        from tfgraph.exporters.onnx.runtime import run_bound

        binding = self.session.io_binding()
        binding.bind_ortvalue_input("values", value)
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, np.int64))
        binding.bind_output("selected", self.device)
        return run_bound(self.session, binding)[0]
