"""Text generation: the decoding loop, sampling and beam search over a small backend protocol.

The loop (``loop.generate``) drives any :class:`~tfgraph.generation.backend.Stepper`: the
full-recompute steppers of today's models (``tfgraph.exporters.onnx.recompute`` and
``recompute_torch``) and, through the same three calls, KV-cached ones. The steppers, and the
Python API ``tfgraph.generate`` that opens a spec, folder or ``.onnx`` file and picks one, live
in ``tfgraph.exporters`` because they run a back end; this package imports none (README.md,
"How it works").
"""
