"""Tensor types of the op graph: symbolic sizes, dtypes and the error lowering raises.

The bottom layer of tfgraph: it imports nothing of tfgraph, and everything else may import it
(tensor <- ops <- ir <- lower <- passes <- exporters <- commands).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import sympy

# Symbolic sizes: batch, source (or only) sequence length, target sequence length, and the
# positions already in a KV cache (past length, 0 at prefill).
B, S, T = sympy.symbols("B S T", positive=True, integer=True)
P = sympy.Symbol("P", nonnegative=True, integer=True)
SYMBOLS = {"B": B, "S": S, "T": T, "P": P}

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "bool": 1}

Dim: TypeAlias = sympy.Expr
Shape: TypeAlias = tuple[Dim, ...]


class LoweringError(Exception):
    """A node could not be built or checked; the message names the node."""


@dataclass(frozen=True)
class TensorType:
    """Symbolic shape and dtype of a node's single output."""

    shape: Shape
    dtype: str

    @property
    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.shape)

    @property
    def nbytes(self) -> sympy.Expr:
        return self.numel * DTYPE_BYTES[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"
