"""Diagrams (graphviz): the structure read from graph metadata (``structure``), how each op is
drawn (``ops``, one row per op), labels and style (``words``, ``labels``, ``style``), the
model, layer and op levels (``model``, ``layer``, ``op``) and rendering (``draw``).
"""
