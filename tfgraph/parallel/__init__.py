"""Parallel training: how a graph is split across GPUs (``tp_plan``) and what each rank then
holds, computes and sends (``tfgraph plan``)."""
