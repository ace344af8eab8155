"""The PyTorch back end: the per-op table of kernels and model.py templates (``ops``,
``functional``), the ``nn.Module`` interpreter (``module``), the generated model.py
(``source``, ``render*``), torch folders (``folder``), reading training checkpoints
without running their code (``checkpoint_reader``), recomputation (``recompute``) and
tensor / sequence / expert parallelism (``parallel``, ``sequence_parallel``,
``expert_parallel``, ``source_parallel``).
"""
