"""Parameter-name maps between Hugging Face checkpoints and tfgraph (README.md, "Parameter names").

A family's map is a table of :class:`Rule` rows, one per Hugging Face tensor name pattern, in
the style of mlx-lm's ``sanitize``: data, not code. ``{i}`` in a pattern is a layer index (it
matches digits and is carried to the other side), ``{e}`` an expert index. The map works one
tensor at a time (:meth:`NameMap.to_tfgraph_one`), so a checkpoint can be streamed; the inverse
gathers the parts of a fused tensor (GPT-2's ``c_attn``, Phi-3's ``qkv_proj`` and
``gate_up_proj``) and fuses them back.

Tensors are torch tensors or numpy arrays, never converted: the map only slices, transposes,
reshapes and concatenates, and imports torch only when it is handed torch tensors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tfgraph.errors import TfgraphError

Tensor = Any
"""A torch.Tensor or a numpy.ndarray."""

Kind = Literal["copy", "transpose", "split", "split_t", "heads", "alias", "legacy",
               "generated"]


class NameMapError(TfgraphError):
    """A tensor name or shape the family's map does not know (exit 2)."""


@dataclass(frozen=True)
class Rule:
    """One Hugging Face tensor pattern and the tfgraph tensor(s) it holds.

    kinds: ``copy``; ``transpose`` (GPT-2's Conv1D stores [in, out]); ``split`` (rows
    [sizes[0]; sizes[1]; ...], e.g. a fused q/k/v or gate/up projection); ``split_t``
    (transpose, then split: GPT-2's ``c_attn``); ``axis`` says which dimension is split (1
    for transformers' stacked experts, ``gate_up_proj`` of shape [E, 2 * hidden, d]);
    ``heads`` (GPT-NeoX: per head, the rows of each part in turn, ``len(ours)`` parts of
    ``sizes[0]`` heads); ``alias`` (the same tensor under a second name, e.g. a tied
    ``lm_head.weight``: imported once, written back under both names); ``legacy`` (an older
    checkpoint's name for a tensor, read on import and never written: GPT-NeoX's
    ``embed_out``); ``generated`` (a buffer stored as a tensor but fixed by the config, e.g.
    Marian's sinusoid tables, BART's zero ``final_logits_bias``: no tfgraph parameter;
    ``check`` validates it on import and ``make`` rebuilds it on export).
    """

    hf: str
    ours: tuple[str, ...] = ()
    kind: Kind = "copy"
    sizes: tuple[int, ...] = ()
    axis: int = 0
    check: Callable[[Tensor], str | None] | None = None
    make: Callable[[Tensor], Tensor] | None = None


def _pattern(text: str) -> re.Pattern[str]:
    escaped = re.escape(text)
    escaped = escaped.replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{e\}", r"(?P<e>\d+)")
    return re.compile(escaped + r"\Z")


def _fill(text: str, groups: Mapping[str, str]) -> str:
    for key, value in groups.items():
        text = text.replace("{" + key + "}", value)
    return text


def _is_torch(t: Tensor) -> bool:
    return type(t).__module__.split(".")[0] == "torch"


def _contiguous(t: Tensor) -> Tensor:
    return t.contiguous() if _is_torch(t) else np.ascontiguousarray(t)


def _cat(parts: list[Tensor], axis: int = 0) -> Tensor:
    if _is_torch(parts[0]):
        import torch

        return torch.cat(parts, axis)
    return np.concatenate(parts, axis)


def _stack(parts: list[Tensor], dim: int) -> Tensor:
    if _is_torch(parts[0]):
        import torch

        return torch.stack(parts, dim)
    return np.stack(parts, dim)


def _same(a: Tensor, b: Tensor) -> bool:
    if a is b:
        return True
    if tuple(a.shape) != tuple(b.shape):
        return False
    if _is_torch(a) and _is_torch(b):
        import torch

        return bool(torch.equal(a, b))
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


class NameMap:
    """Hugging Face names <-> tfgraph names for one model, from a family's table of rules."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._hf = [(_pattern(r.hf), r) for r in rules]
        self._ours = [(_pattern(o), r, j) for r in rules for j, o in enumerate(r.ours)]

    # ---- Hugging Face -> tfgraph ------------------------------------------------------------

    def rule_for(self, name: str) -> tuple[Rule, dict[str, str]]:
        for pattern, rule in self._hf:
            match = pattern.match(name)
            if match:
                return rule, match.groupdict()
        raise NameMapError(f"{name}: no tfgraph parameter for this Hugging Face tensor")

    def to_tfgraph_one(self, name: str, tensor: Tensor) -> list[tuple[str, Tensor]]:
        """The tfgraph (name, tensor) pairs one Hugging Face tensor holds (none for a buffer
        fixed by the config; several for a fused projection)."""
        rule, groups = self.rule_for(name)
        ours = [_fill(o, groups) for o in rule.ours]
        if rule.kind in ("copy", "alias", "legacy"):
            return [(ours[0], tensor)]
        if rule.kind == "transpose":
            return [(ours[0], _contiguous(tensor.T))]
        if rule.kind == "generated":
            problem = rule.check(tensor) if rule.check else None
            if problem:
                raise NameMapError(f"{name}: {problem}")
            return []
        if rule.kind == "heads":
            heads, parts = rule.sizes[0], len(ours)
            if tensor.shape[0] % (heads * parts):
                raise NameMapError(f"{name}: {tensor.shape[0]} rows are not {heads} heads of "
                                   f"{parts} parts")
            per_head = tensor.reshape(heads, parts, -1, *tensor.shape[1:])
            return [(o, _contiguous(per_head[:, j].reshape(-1, *tensor.shape[1:])))
                    for j, o in enumerate(ours)]
        source = tensor.T if rule.kind == "split_t" else tensor
        axis = rule.axis
        if source.ndim <= axis or source.shape[axis] != sum(rule.sizes):
            raise NameMapError(f"{name}: expected {sum(rule.sizes)} entries along dimension "
                               f"{axis} to split into {list(rule.sizes)}, got shape "
                               f"{list(source.shape)}")
        out, start = [], 0
        lead = (slice(None),) * axis
        for o, size in zip(ours, rule.sizes):
            index = lead + (slice(start, start + size),)
            out.append((o, _contiguous(source[index])))
            start += size
        return out

    def to_tfgraph(self, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """A whole Hugging Face state dict as tfgraph's; aliases must hold equal tensors."""
        out: dict[str, Tensor] = {}
        for name, tensor in state.items():
            for ours, value in self.to_tfgraph_one(name, tensor):
                if ours in out and not _same(out[ours], value):
                    raise NameMapError(f"{name}: differs from the tensor already read as "
                                       f"{ours} (they are tied in tfgraph's spec)")
                out.setdefault(ours, value)
        return out

    # ---- tfgraph -> Hugging Face ------------------------------------------------------------

    def _groups(self, state: Mapping[str, Tensor]
                ) -> Iterator[tuple[Rule, dict[str, str], dict[int, Tensor]]]:
        found: dict[tuple[int, tuple[tuple[str, str], ...]], dict[int, Tensor]] = {}
        rules: dict[int, Rule] = {}
        for name, tensor in state.items():
            for pattern, rule, j in self._ours:
                if rule.kind == "legacy":
                    continue
                match = pattern.match(name)
                if match:
                    key = (id(rule), tuple(sorted(match.groupdict().items())))
                    found.setdefault(key, {})[j] = tensor
                    rules[id(rule)] = rule
            if not any(p.match(name) for p, _, _ in self._ours):
                raise NameMapError(f"{name}: no Hugging Face tensor holds this parameter")
        for (rule_id, groups), parts in found.items():
            yield rules[rule_id], dict(groups), parts

    def from_tfgraph(self, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """tfgraph's state dict as the family's Hugging Face names, fused tensors fused back,
        aliases and config-fixed buffers written too."""
        if not state:
            return {}
        example = next(iter(state.values()))
        out: dict[str, Tensor] = {}
        for rule, groups, parts in self._groups(state):
            name = _fill(rule.hf, groups)
            missing = [_fill(rule.ours[j], groups) for j in range(len(rule.ours))
                       if j not in parts]
            if missing:
                raise NameMapError(f"{name}: missing {', '.join(missing)}")
            tensors = [parts[j] for j in range(len(rule.ours))]
            if rule.kind in ("copy", "alias"):
                out[name] = tensors[0]
            elif rule.kind == "transpose":
                out[name] = _contiguous(tensors[0].T)
            elif rule.kind == "heads":
                shape = tensors[0].shape
                heads = rule.sizes[0]
                per = [t.reshape(heads, -1, *shape[1:]) for t in tensors]
                out[name] = _stack(per, 1).reshape(-1, *shape[1:])
            else:
                fused = _cat(tensors, rule.axis)
                out[name] = _contiguous(fused.T) if rule.kind == "split_t" else fused
        for rule in self.rules:
            if rule.kind == "generated" and rule.make is not None:
                out[rule.hf] = rule.make(example)
        return out


def zeros_like_lib(example: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Zeros of ``shape`` in ``example``'s library and dtype."""
    if _is_torch(example):
        return example.new_zeros(shape)
    return np.zeros(shape, dtype=example.dtype)


def from_numpy_like(example: Tensor, array: np.ndarray) -> Tensor:
    """``array`` in ``example``'s library and dtype."""
    if _is_torch(example):
        import torch

        return torch.from_numpy(array).to(example.dtype)
    return array.astype(example.dtype)


def all_zero(tensor: Tensor) -> str | None:
    """None when every element is zero, else what is wrong (a ``Rule.check``)."""
    values = tensor.detach().float().cpu().numpy() if _is_torch(tensor) else np.asarray(tensor)
    return None if not values.any() else "is not zero; tfgraph's spec has no place for it"
