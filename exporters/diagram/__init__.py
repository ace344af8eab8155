"""Diagrams (graphviz): the structure read from graph metadata (``structure``), labels and
style (``labels``, ``style``), the model, layer and op levels (``model``, ``layer``, ``op``)
and rendering (``draw``).
"""
