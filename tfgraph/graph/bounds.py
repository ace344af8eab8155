"""Documented upper bounds of a model's sizes (README "Limits"): far above any published
model, low enough that a typo such as 5120000 for 5120 is caught and symbolic accounting never
meets absurd numbers. The spec language validates against them (tfgraph.spec.schema); back
ends that read sizes from untrusted files (an .onnx model's cache inputs) check them too."""

MAX_D_MODEL = 1 << 18  # 262,144
MAX_LAYERS = 10_000
MAX_VOCAB = 1 << 24  # 16,777,216
MAX_HEADS = 4_096
MAX_HIDDEN = 1 << 21  # 2,097,152
MAX_LEN = 1 << 24
MAX_EXPERTS = 1 << 16  # 65,536; DeepSeek-V3 has 256 routed experts
