"""KV-cache decoding steps over built models, ONNX and torch, for the decoding loop of
``tfgraph.generation`` (``cached_steppers``); the recomputing steppers live with their back
ends (``onnx.recompute``, ``torch.recompute``).
"""
