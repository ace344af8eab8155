"""Passes over a lowered graph: per-op costs (``cost``), the liveness walk (``liveness``),
the training step's walk (``train_walk``), figures and the report (``figures``, ``report``,
``param_groups``), symbolic formulas (``formulas``) and variant comparison (``compare``).
"""
