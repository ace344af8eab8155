"""numpy arrays as ONNX ``TensorProto`` s: element types, casts to the model dtype, headers.

Shared by the ONNX builder (``Constant`` values), the weight streaming and the file writer.
Tensor data is stored as little-endian ``raw_data``, as onnx itself assumes of its hosts.
"""

from __future__ import annotations

from typing import Any, BinaryIO, Protocol

import numpy as np
from onnx import TensorProto

from tfgraph.errors import TfgraphError


class CopiedBytes(Protocol):
    """A parameter whose bytes are copied from a file rather than held as an array
    (tfgraph.hf.checkpoint.Verbatim): writers take either."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int: ...

    def copy_to(self, out: BinaryIO) -> None: ...


Value = np.ndarray | CopiedBytes
"""A parameter value on its way to a file: an array (cast to the model dtype by the writer)
or bytes already in the model dtype, copied file to file."""


def write_bytes(out: BinaryIO, value: Value) -> None:
    """Append the bytes of ``value`` (an array already at the model dtype) to ``out``."""
    if isinstance(value, np.ndarray):
        out.write(value.reshape(-1).view(np.uint8).data)  # a memoryview, no copy
    else:
        value.copy_to(out)

ELEM_TYPE = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "int64": TensorProto.INT64,
}


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype of a tfgraph dtype name (bfloat16 from ml_dtypes, onnx's dependency).

    Always a ``np.dtype`` instance, never a scalar type: ``ml_dtypes.bfloat16.itemsize`` is a
    descriptor of the class, not a number (``write_memory_bytes`` failed on bfloat16 specs)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def cast_array(value: np.ndarray, dtype: str, name: str = "value") -> np.ndarray:
    """``value`` (float32) at the model's dtype, C-contiguous.

    A finite value that the narrower dtype cannot hold (float16 stops at 65504) is refused,
    naming the tensor ``name``: a cast would make it infinity, and the model would compute
    infinities and NaNs from it without a word. Infinities and NaNs already in ``value`` pass
    (``--check-finite`` refuses those where they are read)."""
    target = numpy_dtype(dtype)
    if target == np.float16:
        # numpy raises its floating-point overflow flag when a finite float32 becomes inf
        # in this cast (and only then), so the check costs nothing when nothing overflows.
        try:
            with np.errstate(over="raise"):
                return np.ascontiguousarray(value.astype(target, copy=False))
        except FloatingPointError:
            raise _overflow(name, value, dtype) from None
    array = np.ascontiguousarray(value.astype(target, copy=False))
    # ml_dtypes' bfloat16 cast raises no flag: finite float32 above 3.3895e38 round to inf.
    if dtype == "bfloat16" and value.dtype != target and not np.isfinite(array).all() \
            and (np.isfinite(value) & ~np.isfinite(array)).any():
        raise _overflow(name, value, dtype)
    return array


def _overflow(name: str, value: np.ndarray, dtype: str) -> TfgraphError:
    """The refusal of a tensor ``value`` that ``dtype`` cannot hold."""
    import ml_dtypes  # its finfo knows bfloat16 as well as numpy's types

    finite = np.abs(value[np.isfinite(value)]) if value.size else value
    peak = float(finite.max()) if finite.size else float("inf")
    largest = float(ml_dtypes.finfo(numpy_dtype(dtype)).max)
    wider = "float32" if dtype == "bfloat16" else "float32 or bfloat16"
    return TfgraphError(f"{name}: holds a value of magnitude {peak:.6g}, beyond {dtype}'s "
                        f"largest {largest:.6g}; converted it would be infinity (--dtype "
                        f"{wider} keeps it)")


def cast_value(value: Value, dtype: str, name: str = "value") -> Value:
    """:func:`cast_array` for a writer's values; copied bytes are at the model's dtype."""
    if isinstance(value, np.ndarray):
        return cast_array(value, dtype, name)
    if value.dtype != dtype:
        raise ValueError(f"bytes of {value.dtype} written as {dtype}")
    return value


def tensor_header(name: str, array: Value, dtype: str) -> TensorProto:
    """A TensorProto with name, dtype and dims but no data (the writer appends the bytes)."""
    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = ELEM_TYPE[dtype]
    tensor.dims.extend(array.shape)
    return tensor


def make_initializer(name: str, value: np.ndarray, dtype: str) -> TensorProto:
    """A raw-data TensorProto of ``value`` cast to ``dtype`` (float32, float16 or bfloat16)."""
    array = cast_array(value, dtype, name)
    tensor = tensor_header(name, array, dtype)
    tensor.raw_data = array.tobytes()
    return tensor
