"""A checkpoint's tensors under tfgraph's parameter names, read on demand.

:class:`CheckpointWeights` is a ``Mapping`` from tfgraph parameter names to float32 arrays
that the back ends take wherever they take weights (``to_torch``, ``to_onnx``,
``write_onnx``, the torch folder). Names and shapes come from the checkpoint's headers and the
family's name map (``NameMap.shapes_one``), so a wrong checkpoint is refused before any
weight is read; a value is read only when it is asked for, and dropped by the caller after use.

A fused Hugging Face tensor (GPT-2's ``c_attn``, Phi-3's ``qkv_proj``) holds several
parameters. It is read once: the first part asked for splits it, and the other parts wait in
``_parts`` until they are asked for (writers ask for them together, in graph order), so memory
holds at most the fused tensors being consumed. Values are float32, the contract of every
weight source (tfgraph.graph.weights); widening float16 and bfloat16 is exact, and back ends cast to
the spec's dtype.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import numpy as np

from tfgraph.hf.checkpoint import Checkpoint, CheckpointError, Verbatim
from tfgraph.hf.names import NameMap, NameMapError


class CheckpointWeights(Mapping[str, np.ndarray]):
    """tfgraph name -> float32 value, read from ``checkpoint`` through ``names``.

    ``check_finite``: refuse (naming the tensor) a weight holding NaN or infinity.
    """

    def __init__(self, checkpoint: Checkpoint, names: NameMap,
                 check_finite: bool = False) -> None:
        self.checkpoint = checkpoint
        self.names = names
        self.check_finite = check_finite
        self._source: dict[str, tuple[str, int]] = {}  # ours -> (Hugging Face name, part)
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._tied: dict[str, list[str]] = {}  # ours -> further Hugging Face tensors of it
        self._buffers: list[str] = []  # config-fixed tensors, checked by check_buffers
        self._experts: dict[str, dict[int, str]] = {}  # stacked ours -> expert -> tensor
        for hf, info in checkpoint.tensors.items():
            try:  # a name the family does not know, or a fused tensor that does not split
                slot = names.expert_slot(hf)
                parts = [] if slot is not None else names.shapes_one(hf, info.shape)
            except NameMapError as err:
                raise CheckpointError(f"{info.file}: {err}") from None
            if slot is not None:
                self._add_expert(hf, *slot)
                continue
            if not parts:
                self._buffers.append(hf)
            for j, (ours, shape) in enumerate(parts):
                if ours in self._source:
                    if self._shapes[ours] != shape:
                        raise CheckpointError(f"{info.file}: {hf} {list(info.shape)} is "
                                              f"{ours}, which another tensor gives as "
                                              f"{list(self._shapes[ours])}")
                    self._tied.setdefault(ours, []).append(hf)
                    continue
                self._source[ours] = (hf, j)
                self._shapes[ours] = shape
        for ours, pieces in self._experts.items():
            total = self._shapes[ours][0]
            if len(pieces) != total:
                absent = sorted(set(range(total)) - set(pieces))
                raise CheckpointError(f"{checkpoint.folder}: {ours} has {total} experts, but "
                                      f"expert {absent[0]} is not in the checkpoint")
        self._parts: dict[str, dict[int, np.ndarray]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _add_expert(self, hf: str, ours: str, expert: int, total: int) -> None:
        info = self.checkpoint.tensors[hf]
        shape = (total, *info.shape)
        if expert >= total:
            raise CheckpointError(f"{info.file}: {hf} is expert {expert}, but the model has "
                                  f"{total}")
        if self._shapes.setdefault(ours, shape) != shape:
            raise CheckpointError(f"{info.file}: {hf} {list(info.shape)} differs from the "
                                  f"other experts of {ours} {list(self._shapes[ours][1:])}")
        self._experts.setdefault(ours, {})[expert] = hf

    # ---- Mapping -------------------------------------------------------------------------

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._experts:  # stacked experts: filled one expert at a time
            pieces = self._experts[name]
            value = np.empty(self._shapes[name], dtype=np.float32)
            for e in range(len(pieces)):
                value[e] = self._read(pieces[e])
            return value
        hf, j = self._source[name]
        value = self._part(hf, j)
        for other in self._tied.get(name, ()):
            tied = self._convert(self.names.to_tfgraph_one(other, self._read(other)))
            if not np.array_equal(tied[0], value):
                raise CheckpointError(f"{self.checkpoint.folder}: {other} differs from {hf}; "
                                      f"they are one tensor ({name}) in this model")
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes by tfgraph name, from the headers (what weight checks use: no reads)."""
        return dict(self._shapes)

    def verbatim(self, name: str, dtype: str) -> Verbatim | None:
        """Parameter ``name`` as byte ranges of the checkpoint when its bytes in ``dtype`` are
        stored there as they stand (copied, rows of a fused tensor split along its first
        axis, or experts stacked), else None (it must be read and converted). Never when
        values are to be checked (``check_finite``) or a tied copy compared."""
        if self.check_finite or name in self._tied:
            return None
        tensors = self.checkpoint.tensors
        if name in self._experts:
            infos = [tensors[hf] for _, hf in sorted(self._experts[name].items())]
            if any(info.dtype != dtype for info in infos):
                return None
            return Verbatim(self._shapes[name], dtype,
                            tuple((i.file, i.offset, i.nbytes) for i in infos))
        hf, j = self._source[name]
        info = tensors[hf]
        rule, _ = self.names.rule_for(hf)
        if info.dtype != dtype:
            return None
        if rule.kind in ("copy", "alias"):
            return Verbatim(info.shape, dtype, ((info.file, info.offset, info.nbytes),))
        if rule.kind == "split" and rule.axis == 0 and info.shape:
            row = info.nbytes // info.shape[0]
            start = sum(rule.sizes[:j]) * row
            return Verbatim(self._shapes[name], dtype,
                            ((info.file, info.offset + start, rule.sizes[j] * row),))
        return None

    # ---- reading -------------------------------------------------------------------------

    def check_buffers(self) -> None:
        """Check the tensors the config fixes (Marian's sinusoid tables, BART's zero logits
        bias): they hold no parameter, but a checkpoint whose values differ computes something
        else."""
        for hf in self._buffers:
            try:
                self.names.to_tfgraph_one(hf, self._read(hf))
            except NameMapError as err:
                raise CheckpointError(f"{self.checkpoint.tensors[hf].file}: {err}") from None

    def _read(self, hf: str) -> np.ndarray:
        array = self.checkpoint.read(hf)
        if self.check_finite and not np.isfinite(array).all():
            info = self.checkpoint.tensors[hf]
            raise CheckpointError(f"{info.file}: {info.key} holds NaN or infinite values")
        return array

    @staticmethod
    def _convert(parts: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        return [np.asarray(value, dtype=np.float32) for _, value in parts]

    def _part(self, hf: str, j: int) -> np.ndarray:
        with self._guard:
            lock = self._locks.setdefault(hf, threading.Lock())
        with lock:  # one reader per tensor; the other parts wait here for the first
            waiting = self._parts.get(hf)
            if waiting is not None and j in waiting:
                value = waiting.pop(j)
                if not waiting:
                    del self._parts[hf]
                return value
            values = self._convert(self.names.to_tfgraph_one(hf, self._read(hf)))
            if len(values) > 1:
                self._parts[hf] = {k: v for k, v in enumerate(values) if k != j}
            return values[j]
