"""The ONNX model without its weights: nodes, inputs, outputs, value infos, opset, metadata.

The initializers are added afterwards, in memory (``to_onnx``) or streamed straight to the file
(``tfgraph.exporters.onnx.writer``); everything else about the model is decided here.
"""

from __future__ import annotations


import onnx
from onnx import helper

from tfgraph.exporters.onnx.builder import Builder, dims
from tfgraph.exporters.onnx.ops import MAX_OPSET, ONNX_OPS, check_opset
from tfgraph.exporters.onnx.tensors import ELEM_TYPE
from tfgraph.graph.ir import Graph, Node
# metadata_props key of the spec as JSON, so `tfgraph run MODEL.onnx --check` can rebuild it.
from tfgraph.graph.ir import SPEC_METADATA_KEY


ENCODER_OUTPUT = "last_hidden_state"
"""The output name of an encoder-decoder's encoder part (``encoder_model.onnx``): Hugging Face
optimum's (its encoder models' ``last_hidden_state``), the same for every spec."""


def _value_info(b: Builder, node: Node, name: str | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name or node.name, ELEM_TYPE[node.type.dtype],
                                         dims(node.type.shape, b.dim_names))


def output_names(graph: Graph) -> list[str]:
    """The ONNX model's output names, those of the graph's output nodes, except the hidden
    states an encoder-decoder's encoder part returns: that node is whatever ends the encoder
    stack (a layer's norm after post-norm layers, ``encoder.norm`` after pre-norm ones), so
    its name changes with the spec; the model names it ``ENCODER_OUTPUT`` instead."""
    names = list(graph.outputs)
    if graph.info.kind == "cached" and graph.info.part == "encoder":
        names[0] = ENCODER_OUTPUT
    return names


def build_structure(graph: Graph, opset: int = MAX_OPSET,
                    fused_attention: bool = False) -> onnx.ModelProto:
    """The model without initializer data: nodes, inputs, outputs, value infos, metadata.
    ``fused_attention``: a decoder's KV-cache attention as onnxruntime's GroupQueryAttention
    where it is exact (exporters/onnx/fused_attention.py), written out otherwise."""
    opset = check_opset(opset)
    b = Builder(graph, opset)
    if fused_attention:
        from tfgraph.exporters.onnx import fused_attention as fused

        if fused.refusal(graph) is None:
            b.fused = fused.plan(graph)
    absorbed = b.fused.absorbed if b.fused is not None else set()
    unwritten = b.fused.unwritten if b.fused is not None else set()  # a sum fused, unread
    value_infos = []
    for node in graph.ops():
        if node.name in absorbed:  # written by the fused attention node that reads it
            continue
        out = ONNX_OPS[node.op](b, node)
        if out != node.name:  # an emitter contract, not a user error
            raise AssertionError(f"{node.name}: ONNX emitter for {node.op} wrote {out}")
        if node.name not in graph.outputs and node.name not in unwritten:
            value_infos.append(_value_info(b, node))
    outputs = []
    for node_name, name in zip(graph.outputs, output_names(graph)):
        node = graph.node(node_name)
        if name != node_name:  # the node's tensor, passed on under the interface's name
            b.add(node_name, "Identity", [node_name], name, tag="output")
            value_infos.append(_value_info(b, node))
        outputs.append(_value_info(b, node, name))
    onnx_graph = helper.make_graph(
        b.nodes, graph.name,
        inputs=[_value_info(b, graph.node(i)) for i in graph.inputs
                if b.fused is None or i not in b.fused.dropped_inputs],
        outputs=outputs,
        value_info=value_infos,
    )
    opsets = [helper.make_opsetid("", opset)]
    # The lowest IR version that carries this opset: onnx 1.23 would write IR 14 by
    # default, which onnxruntime 1.31 rejects ("max supported IR version: 13").
    ir_version = helper.find_min_ir_version_for(opsets)
    if b.fused is not None:  # onnxruntime's contrib ops, version 1 of their domain
        from tfgraph.exporters.onnx.fused_attention import DOMAIN

        opsets.append(helper.make_opsetid(DOMAIN, 1))
    model = helper.make_model(onnx_graph, opset_imports=opsets, producer_name="tfgraph",
                              ir_version=ir_version)
    from tfgraph.version import __version__

    model.producer_version = __version__
    source = graph.info.source
    props: dict[str, str] = {}
    if source is not None:
        # Both are protobuf strings (length-delimited UTF-8): any text the spec allows, quotes,
        # newlines, U+2028 and escape characters included, is stored and read back unchanged,
        # with nothing to escape. (Lone surrogates, which UTF-8 cannot encode, are refused
        # when the spec is validated.) Printing them is the reader's job.
        model.doc_string = graph.info.description
        props[SPEC_METADATA_KEY] = source.json()
    if b.fused is not None:  # how a caller must lay out attention_mask (fused_attention.py)
        from tfgraph.exporters.onnx.fused_attention import PADDING_METADATA_KEY

        props[PADDING_METADATA_KEY] = "right"
    if props:
        helper.set_model_props(model, props)
    return model
