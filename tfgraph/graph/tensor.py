"""Tensor types of the op graph: symbolic sizes, dtypes and the error lowering raises.

The bottom layer of tfgraph: it imports nothing of tfgraph, and everything else may import it
(tensor <- ops <- ir <- lower <- passes <- exporters <- commands).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, Generic, TypeAlias, TypeVar, overload

import sympy
import sympy.tensor.tensor  # noqa: F401 (sympy imports it lazily in its first Add: 60-130 ms
# inside the first compile of a process otherwise; here it is part of ``import tfgraph``)

# Symbolic sizes: batch, source (or only) sequence length, target sequence length, and the
# positions already in a KV cache (past length, 0 at prefill).
B, S, T = sympy.symbols("B S T", positive=True, integer=True)
P = sympy.Symbol("P", nonnegative=True, integer=True)
SYMBOLS = {"B": B, "S": S, "T": T, "P": P}

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "bool": 1}

Dim: TypeAlias = sympy.Expr
Shape: TypeAlias = tuple[Dim, ...]


V = TypeVar("V")


class cached_attribute(Generic[V]):  # noqa: N801 (used like functools.cached_property)
    """``functools.cached_property`` without the lock Python 3.11 takes on every first access
    (about a microsecond: the cost passes read ``Node.component`` of every node). The value
    is a pure function of an object that never changes, so two threads computing it at once
    store the same value; Python 3.12 dropped the lock for that reason."""

    def __init__(self, func: Callable[[Any], V]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> cached_attribute[V]: ...

    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> V: ...

    def __get__(self, obj: object | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)  # later reads find it there
        return value


class LoweringError(Exception):
    """A node could not be built or checked; the message names the node."""


def as_dim(d: Any) -> Dim:
    """One dimension as a sympy expression: an ``int`` becomes ``sympy.Integer``; a sympy
    expression stays as it is; anything else (a float, a string, a bool) is a TypeError."""
    if isinstance(d, sympy.Expr):
        return d
    if type(d) is int:
        return sympy.Integer(d)
    if isinstance(d, numbers.Integral) and not isinstance(d, bool):
        return sympy.Integer(int(d))
    raise TypeError(f"a tensor dimension must be an int or a sympy expression, got "
                    f"{d!r} ({type(d).__name__})")


@dataclass(frozen=True)
class TensorType:
    """Symbolic shape and dtype of a node's single output.

    Contract: every dimension is a sympy expression (``sympy.Integer`` for a number; ints
    given here are converted, other types refused with a TypeError), so passes and back ends
    may call sympy methods on any dimension. The hash is computed once: types are compared
    and hashed for every node by the per-signature caches of shape inference and costs."""

    shape: Shape
    dtype: str

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple) or \
                not all(isinstance(d, sympy.Expr) for d in self.shape):
            if not isinstance(self.shape, (tuple, list)):
                raise TypeError(f"a tensor shape must be a tuple of dimensions, got "
                                f"{self.shape!r}")
            object.__setattr__(self, "shape", tuple(as_dim(d) for d in self.shape))
        object.__setattr__(self, "_hash", hash((self.shape, self.dtype)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from its fields: the cached hash (of strings, salted per process) must not
        # travel to another process
        return (TensorType, (self.shape, self.dtype))

    # computed once per type: nodes share their types (ir.infer), and every pass asks
    @cached_attribute
    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.shape)

    @cached_attribute
    def nbytes(self) -> sympy.Expr:
        return self.numel * DTYPE_BYTES[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"
