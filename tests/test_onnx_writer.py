"""The streaming ONNX writer (``exporters/onnx/writer.py``): the file it writes is the model
``to_onnx`` builds in memory, for every spec of the library, in one file or with external data;
and its protobuf framing helpers encode exactly as protobuf itself does.
"""

from __future__ import annotations

import os
from io import BytesIO
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import GraphProto, ModelProto, TensorProto, numpy_helper

import tfgraph
from tfgraph.exporters.onnx import model as onnx_model
from tfgraph.exporters.onnx import writer as onnx_writer
from tfgraph.exporters.onnx.model import to_onnx, write_onnx
from tfgraph.exporters.onnx.tensors import make_initializer, numpy_dtype, tensor_header
from tfgraph.spec.schema import Spec


def _same_initializers(got: list[TensorProto], want: list[TensorProto]) -> None:
    assert [t.name for t in got] == [t.name for t in want]
    for a, b in zip(got, want):
        assert list(a.dims) == list(b.dims), a.name
        assert a.data_type == b.data_type, a.name
        assert a.raw_data == b.raw_data and len(a.raw_data) > 0, a.name


def _no_temporaries(folder: Path) -> None:
    left = [p.name for p in folder.iterdir() if ".tmp" in p.name]
    assert not left, left


def test_written_file_is_the_in_memory_model(small_spec: Spec, tmp_path: Path) -> None:
    """Catches: a framing mistake (a wrong length prefix shifts or truncates every later
    initializer), initializers out of order, a dtype cast that differs between the two paths
    (float16 / bfloat16 bytes), or structure (nodes, metadata) decided differently."""
    graph = tfgraph.compile(small_spec)
    path = write_onnx(graph, tmp_path / "m.onnx", seed=7)
    loaded = onnx.load(str(path))
    want = to_onnx(graph, seed=7)
    _same_initializers(list(loaded.graph.initializer), list(want.graph.initializer))
    assert [p.name for p in graph.params()] == [t.name for t in want.graph.initializer]
    assert loaded.graph.node == want.graph.node
    assert loaded.metadata_props == want.metadata_props
    assert loaded == want  # every other field too (opset, IR version, value infos, doc)
    _no_temporaries(tmp_path)


def test_external_data_file_loads_with_onnx_load(small_spec: Spec, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The >2 GiB path forced on a tiny model. Catches: wrong offsets or lengths (onnx.load
    reads the wrong bytes), locations that are not relative to the model, unaligned
    offsets, or a side file left under a temporary name."""
    monkeypatch.setattr(onnx_model, "EXTERNAL_DATA_THRESHOLD", 0)
    graph = tfgraph.compile(small_spec)
    path = write_onnx(graph, tmp_path / "ext.onnx", seed=7)
    data = tmp_path / "ext.onnx.data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext.onnx", "ext.onnx.data"]
    bare = onnx.load(str(path), load_external_data=False)
    end = 0
    for t in bare.graph.initializer:
        assert t.data_location == TensorProto.EXTERNAL and not t.raw_data, t.name
        info = {e.key: e.value for e in t.external_data}
        assert info["location"] == "ext.onnx.data"
        offset, length = int(info["offset"]), int(info["length"])
        assert offset % onnx_writer.EXTERNAL_ALIGNMENT == 0 and offset >= end, t.name
        end = offset + length
    assert data.stat().st_size == end
    # Loaded from another working directory: locations resolve against the model's folder.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = onnx.load(str(path))
    _same_initializers(list(loaded.graph.initializer),
                       list(to_onnx(graph, seed=7).graph.initializer))
    assert loaded.graph.node == bare.graph.node


# ---- protobuf framing ----------------------------------------------------------------------

VARINT_CASES = [0, 1, 127, 128, 255, 300, 16383, 16384, 2**21 - 1, 2**21, 2**28 - 1, 2**28,
                2**31, 2**35, 2**56, 2**63 - 1]


@pytest.mark.parametrize("n", VARINT_CASES)
def test_varint_is_protobufs(n: int) -> None:
    """ModelProto.model_version (field 5, int64) is encoded as tag 0x28 then varint(n).
    Catches: byte order of the 7-bit groups, a missing or extra continuation bit."""
    encoded = ModelProto(model_version=n).SerializeToString()
    assert encoded[:1] == b"\x28"
    assert onnx_writer._varint(n) == encoded[1:]


def test_varint_refuses_negative_numbers() -> None:
    with pytest.raises(ValueError):
        onnx_writer._varint(-1)


@pytest.mark.parametrize("length", [0, 1, 127, 128, 129, 16383, 16384, 16385, 2**21 + 3])
def test_field_header_is_protobufs(length: int) -> None:
    """A bytes field (TensorProto.raw_data = 9) is tag, varint length, payload."""
    payload = bytes(range(256)) * (length // 256) + bytes(length % 256)
    encoded = TensorProto(raw_data=payload).SerializeToString()
    assert onnx_writer._field_header(onnx_writer._TENSOR_RAW_DATA, length) + payload == encoded


def test_field_numbers_are_onnx_protos() -> None:
    """The framing's field numbers, against onnx's own descriptors (onnx.proto)."""
    assert ModelProto.DESCRIPTOR.fields_by_name["graph"].number == onnx_writer._MODEL_GRAPH
    assert GraphProto.DESCRIPTOR.fields_by_name["initializer"].number == \
        onnx_writer._GRAPH_INITIALIZER
    assert TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number == \
        onnx_writer._TENSOR_RAW_DATA


# Sizes whose tensor, graph and model records straddle the 1-, 2- and 3-byte varint lengths
# (127 / 128, 16383 / 16384, 2**21 - 1 / 2**21): each record is a few bytes longer than the one
# inside it, so a range of payloads around each boundary crosses it at every level.
_FRAMING_SIZES = sorted({*range(96, 136, 2), *range(16330, 16392, 2), 2**20, 2**20 + 18,
                         2**21 // 2 - 40})


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_appended_initializer_is_protobufs_encoding(dtype: str) -> None:
    """One chunk of the file is byte for byte the serialization of a ModelProto holding only
    that initializer. Catches: a length computed without the header, the raw_data tag or the
    nested headers (each record's length includes the records inside it)."""
    itemsize = numpy_dtype(dtype).itemsize
    rng = np.random.default_rng(0)
    for name in ("w", "decoder.layers.0." + "x" * 130 + ".weight"):  # header > 127 bytes too
        for nbytes in _FRAMING_SIZES:
            n = nbytes // itemsize
            value = rng.standard_normal(n).astype(np.float32).reshape(1, n)
            array = value.astype(numpy_dtype(dtype))
            out = BytesIO()
            onnx_writer._append_initializer(out, tensor_header(name, array, dtype), array)
            expected = ModelProto(graph=GraphProto(
                initializer=[make_initializer(name, value, dtype)])).SerializeToString()
            assert out.getvalue() == expected, (name, nbytes)


def test_concatenated_chunks_parse_as_one_model() -> None:
    """protobuf's merge rule that the file format relies on: the model's bytes followed by
    one chunk per initializer parse as the model with all initializers, in order."""
    base = ModelProto(ir_version=10, producer_name="t",
                      graph=GraphProto(name="g", node=[onnx.helper.make_node("Relu", ["x"],
                                                                              ["y"])]))
    tensors = [np.arange(k * 37, dtype=np.float32).reshape(k, 37) for k in (1, 5, 500)]
    out = BytesIO()
    out.write(base.SerializeToString())
    for i, t in enumerate(tensors):
        onnx_writer._append_initializer(out, tensor_header(f"t{i}", t, "float32"), t)
    parsed = ModelProto.FromString(out.getvalue())
    assert parsed.graph.name == "g" and len(parsed.graph.node) == 1
    assert parsed.producer_name == "t"
    got = [numpy_helper.to_array(t) for t in parsed.graph.initializer]
    assert [t.name for t in parsed.graph.initializer] == ["t0", "t1", "t2"]
    for a, b in zip(got, tensors):
        np.testing.assert_array_equal(a, b)


def test_write_model_streams_without_onnx_save(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer never builds the whole model in memory: onnx.save / SerializeToString of a
    model holding the weights would do so. Catches a regression to ``onnx.save(model)``."""
    spec = Spec.model_validate({"name": "s", "arch": "decoder-only", "d_model": 16,
                                "layers": 1, "vocab": 50, "attention": {"heads": 2}})
    graph = tfgraph.compile(spec)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("onnx.save called")

    monkeypatch.setattr(onnx, "save", refuse)
    monkeypatch.setattr(onnx, "save_model", refuse)
    sizes: list[int] = []
    real = ModelProto.SerializeToString

    def measured(self: ModelProto, **kwargs: object) -> bytes:
        data = real(self, **kwargs)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(ModelProto, "SerializeToString", measured)
    path = write_onnx(graph, tmp_path / "s.onnx")
    weights = sum(4 * int(np.prod(p.attrs["shape"])) for p in graph.params())
    assert sizes and max(sizes) < weights  # the model was serialized without its weights
    assert os.path.getsize(path) > weights


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_numpy_dtype_is_a_dtype_with_the_spec_byte_width(dtype: str) -> None:
    """Catches numpy_dtype returning ml_dtypes' scalar *type* for bfloat16, whose
    ``itemsize`` is a class descriptor: write_memory_bytes then raised TypeError and
    ``write_onnx`` / ``tfgraph build --to onnx`` failed on every bfloat16 spec."""
    from tfgraph.exporters.onnx.weights import write_memory_bytes
    from tfgraph.graph.ir import DTYPE_BYTES

    assert numpy_dtype(dtype).itemsize == DTYPE_BYTES[dtype]
    spec = Spec.model_validate({"name": "s", "arch": "decoder-only", "d_model": 8, "layers": 1,
                                "vocab": 10, "attention": {"heads": 2}, "ffn": {"hidden": 4},
                                "dtype": dtype})  # largest parameter: the (10, 8) table
    cast = 0 if dtype == "float32" else DTYPE_BYTES[dtype]
    assert write_memory_bytes(tfgraph.compile(spec)) == 2 * 10 * 8 * (4 + cast)
