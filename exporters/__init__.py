"""Back ends of tfgraph, installed as ``tfgraph.exporters`` (PyTorch, ONNX, graphviz)."""
