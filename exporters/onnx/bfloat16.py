"""bfloat16 tensors between onnxruntime and numpy, which has no bfloat16 type.

onnxruntime's ``OrtValue.numpy()`` and ``session.run`` refuse a bfloat16 output ("No
corresponding Numpy type for Tensor Type. bfloat16"), and a numpy array fed to a bfloat16
input is refused for its type. On the host a bfloat16 tensor is held here as float32: a
bfloat16 is the upper 16 bits of the float32 of the same value, so widening (16 bits shifted
left into a 32-bit word) is exact, and narrowing a value that came from bfloat16 back is
exact too (other float32 values round to the nearest bfloat16, ties to even).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from tfgraph.errors import TfgraphError

TYPE = "tensor(bfloat16)"
"""The type onnxruntime's NodeArg names a bfloat16 tensor by."""

ONNX_TYPE = 16
"""onnx.TensorProto.BFLOAT16."""


def widen(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 ``bits`` (uint16): exact."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def narrow(values: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (uint16) of float32 ``values``, rounded to nearest, ties to even;
    NaN stays NaN."""
    words = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = (words + np.uint32(0x7FFF) + ((words >> 16) & np.uint32(1))) >> 16
    bits = rounded.astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), bits).astype(np.uint16)


def to_host(value: Any) -> np.ndarray:
    """An OrtValue's values as a new numpy array: a bfloat16 one widened to float32 (it must
    be on the host: bind such an output to "cpu")."""
    if value.data_type() != TYPE:
        return np.array(value.numpy())
    if value.device_name().lower() != "cpu":
        raise TfgraphError(f"a bfloat16 output on {value.device_name()}: tfgraph reads "
                           "bfloat16 outputs from the host only")
    shape = tuple(value.shape())
    count = value.tensor_size_in_bytes() // 2
    if count == 0:
        return np.zeros(shape, np.float32)
    bits = np.frombuffer((ctypes.c_uint16 * count).from_address(value.data_ptr()), np.uint16)
    return widen(bits.reshape(shape))  # widen makes a new array: the OrtValue may go


def ortvalue(values: np.ndarray) -> Any:
    """A host OrtValue of type bfloat16 holding float32 ``values`` (narrowed)."""
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(narrow(values), ONNX_TYPE)


def empty(shape: tuple[int, ...], device: str) -> Any:
    """An OrtValue of type bfloat16 of ``shape`` on ``device`` ("cpu" or "cuda"), its values
    unset (for shapes with no element: a cache with no positions yet)."""
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_shape_and_type(shape, ONNX_TYPE, device, 0)


def has_bfloat16(session: Any) -> bool:
    """Whether any input or output of an onnxruntime session is bfloat16."""
    return any(v.type == TYPE for v in (*session.get_inputs(), *session.get_outputs()))


def run_host(session: Any, feeds: dict[str, Any], options: Any = None) -> list[np.ndarray]:
    """``session.run`` for a session with bfloat16 inputs or outputs: float32 host arrays
    fed to a bfloat16 input are narrowed, every output comes back to the host as numpy
    (bfloat16 ones widened to float32). Through an I/O binding whose outputs are all bound
    to the host, so no output is left on a device."""
    types = {i.name: i.type for i in session.get_inputs()}
    binding = session.io_binding()
    for name, value in feeds.items():
        if not isinstance(value, np.ndarray):  # an OrtValue
            binding.bind_ortvalue_input(name, value)
        elif types.get(name) == TYPE:
            binding.bind_ortvalue_input(name, ortvalue(value))
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
    for out in session.get_outputs():
        binding.bind_output(out.name, "cpu")
    session.run_with_iobinding(binding, options)
    return [to_host(v) for v in binding.get_outputs()]
