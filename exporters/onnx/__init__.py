"""The ONNX back end: the per-op emitter table (``ops``, ``cache``, ``moe``, ``rope``), the
builder and model assembly (``builder``, ``graph``, ``model``, ``tensors``, ``weights``),
files (``writer``), onnxruntime sessions (``runtime``), recomputation (``recompute``) and
onnxruntime-genai's config (``genai_config``).
"""
