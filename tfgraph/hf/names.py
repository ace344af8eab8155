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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tfgraph.errors import TfgraphError

Tensor = Any
"""A torch.Tensor or a numpy.ndarray."""

Kind = Literal["copy", "transpose", "split", "split_t", "heads", "alias", "generated",
               "expert"]
Layout = Literal["both", "memory", "disk"]


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
    ``sizes[0]`` heads; with more sizes, ``sizes[0]`` groups of ``sizes[1:]`` rows of the
    parts in turn: Falcon-40B's [q heads of a group, its k, its v] per key/value group); ``alias`` (the same tensor under a second name, e.g. a tied
    ``lm_head.weight``: imported once, written back under both names in a state dict,
    left out of a folder as ``save_pretrained`` leaves it out); ``generated`` (a buffer
    stored as a tensor but fixed by the config, e.g.
    Marian's sinusoid tables, BART's zero ``final_logits_bias``: no tfgraph parameter;
    ``check`` validates it on import and ``make`` rebuilds it on export); ``expert`` (one
    expert's matrix, ``{e}`` in the name, of the tfgraph parameter stacking ``sizes[0]``
    experts along its first axis: the files ``save_pretrained`` writes for Mixtral and
    Qwen2-MoE).

    ``layout``: transformers 5 keeps some families' tensors fused in memory (a MoE layer's
    experts as one ``gate_up_proj``) and converts them to the hub's per-expert tensors when it
    saves (``transformers.conversion_mapping``; GPT-NeoX's head is ``lm_head`` in memory and
    ``embed_out`` on disk; Marian's sinusoid tables are not saved). Import accepts both;
    export writes ``memory`` names for a module's state dict and ``disk`` names for a
    folder.
    """

    hf: str
    ours: tuple[str, ...] = ()
    kind: Kind = "copy"
    sizes: tuple[int, ...] = ()
    axis: int = 0
    check: Callable[[Tensor], str | None] | None = None
    make: Callable[[Tensor], Tensor] | None = None
    layout: Layout = "both"


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

    def targets(self, name: str) -> list[str] | None:
        """The tfgraph parameters Hugging Face tensor ``name`` holds (none for a buffer fixed
        by the config, the stacked parameter for one expert), or None when no rule names it."""
        for pattern, rule in self._hf:
            match = pattern.match(name)
            if match:
                return [_fill(o, match.groupdict()) for o in rule.ours]
        return None

    def to_tfgraph_one(self, name: str, tensor: Tensor) -> list[tuple[str, Tensor]]:
        """The tfgraph (name, tensor) pairs one Hugging Face tensor holds (none for a buffer
        fixed by the config; several for a fused projection)."""
        rule, groups = self.rule_for(name)
        ours = [_fill(o, groups) for o in rule.ours]
        if rule.kind in ("copy", "alias"):
            return [(ours[0], tensor)]
        if rule.kind == "expert":
            raise NameMapError(f"{name}: one expert of {ours[0]}; stack the experts "
                               "(to_tfgraph, expert_slot)")
        if rule.kind == "transpose":
            return [(ours[0], _contiguous(tensor.T))]
        if rule.kind == "generated":
            problem = rule.check(tensor) if rule.check else None
            if problem:
                raise NameMapError(f"{name}: {problem}")
            return []
        if rule.kind == "heads":
            heads, parts = rule.sizes[0], len(ours)
            if (tensor.shape[0] != heads * sum(rule.sizes[1:]) if rule.sizes[1:]
                    else tensor.shape[0] % (heads * parts)):
                raise NameMapError(f"{name}: {tensor.shape[0]} rows are not {heads} heads of "
                                   f"{parts} parts")
            rows = rule.sizes[1:] or (tensor.shape[0] // (heads * parts),) * parts
            per_head = tensor.reshape(heads, -1, *tensor.shape[1:])
            starts = [sum(rows[:j]) for j in range(parts)]
            return [(o, _contiguous(per_head[:, starts[j]:starts[j] + rows[j]]
                                    .reshape(-1, *tensor.shape[1:])))
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

    def shapes_one(self, name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
        """The tfgraph (name, shape) pairs :meth:`to_tfgraph_one` makes of a Hugging Face tensor
        of ``shape``, without its values: what a checkpoint's header is checked with before
        any weight is read."""
        rule, groups = self.rule_for(name)
        ours = [_fill(o, groups) for o in rule.ours]
        shape = tuple(int(n) for n in shape)
        if rule.kind in ("copy", "alias"):
            return [(ours[0], shape)]
        if rule.kind == "transpose":
            return [(ours[0], shape[::-1])]
        if rule.kind == "generated":
            return []
        if rule.kind == "expert":
            return [(ours[0], (rule.sizes[0], *shape))]
        if rule.kind == "heads":
            rows = shape[0] if shape else 0
            if not shape or (rows != rule.sizes[0] * sum(rule.sizes[1:]) if rule.sizes[1:]
                             else rows % (rule.sizes[0] * len(ours))):
                raise NameMapError(f"{name}: {rows} rows are not {rule.sizes[0]} heads of "
                                   f"{len(ours)} parts")
            if rule.sizes[1:]:
                return [(o, (rule.sizes[0] * n, *shape[1:]))
                        for o, n in zip(ours, rule.sizes[1:])]
            return [(o, (rows // len(ours), *shape[1:])) for o in ours]
        source = shape[::-1] if rule.kind == "split_t" else shape
        if len(source) <= rule.axis or source[rule.axis] != sum(rule.sizes):
            raise NameMapError(f"{name}: expected {sum(rule.sizes)} entries along dimension "
                               f"{rule.axis} to split into {list(rule.sizes)}, got shape "
                               f"{list(source)}")
        return [(o, source[:rule.axis] + (size,) + source[rule.axis + 1:])
                for o, size in zip(ours, rule.sizes)]

    def expert_slot(self, name: str) -> tuple[str, int, int] | None:
        """(stacked tfgraph parameter, expert index, experts) when ``name`` is one expert's
        matrix (an ``expert`` rule), else None."""
        rule, groups = self.rule_for(name)
        if rule.kind != "expert":
            return None
        return _fill(rule.ours[0], groups), int(groups["e"]), rule.sizes[0]

    def to_tfgraph(self, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """A whole Hugging Face state dict as tfgraph's; aliases must hold equal tensors."""
        out: dict[str, Tensor] = {}
        experts: dict[str, tuple[int, dict[int, Tensor]]] = {}
        for name, tensor in state.items():
            slot = self.expert_slot(name)
            if slot is not None:
                experts.setdefault(slot[0], (slot[2], {}))[1][slot[1]] = tensor
                continue
            for ours, value in self.to_tfgraph_one(name, tensor):
                if ours in out and not _same(out[ours], value):
                    raise NameMapError(f"{name}: differs from the tensor already read as "
                                       f"{ours} (they are tied in tfgraph's spec)")
                out.setdefault(ours, value)
        for ours, (total, pieces) in experts.items():
            if sorted(pieces) != list(range(total)):
                raise NameMapError(f"{ours}: expected experts 0..{total - 1}, got "
                                   f"{sorted(pieces)}")
            out[ours] = _stack([pieces[e] for e in range(total)], 0)
        return out

    # ---- tfgraph -> Hugging Face ------------------------------------------------------------

    def hf_tensors(self, ours: Iterable[str], aliases: bool = True,
                   layout: Layout = "memory") -> list[HFTensor]:
        """The Hugging Face tensors tfgraph's parameters ``ours`` make, in first-seen order:
        fused tensors once with all their parts; tied ``alias`` names too when ``aliases``
        (``save_pretrained`` omits them: transformers ties them again on load). Config-fixed
        buffers (``generated`` rules) are not included: :meth:`generated` makes them.
        ``layout``: the names of a module's state dict (``memory``) or of the files
        ``save_pretrained`` writes (``disk``)."""
        found: dict[tuple[int, tuple[tuple[str, str], ...]], dict[int, str]] = {}
        rules: dict[int, Rule] = {}
        for name in ours:
            matched = False
            for pattern, rule, j in self._ours:
                skip = rule.layout not in ("both", layout)
                if skip or (rule.kind == "alias" and not aliases):
                    matched = matched or bool(pattern.match(name))
                    continue
                match = pattern.match(name)
                if match:
                    matched = True
                    key = (id(rule), tuple(sorted(match.groupdict().items())))
                    found.setdefault(key, {})[j] = name
                    rules[id(rule)] = rule
            if not matched:
                raise NameMapError(f"{name}: no Hugging Face tensor holds this parameter")
        out = []
        for (rule_id, groups), parts in found.items():
            rule = rules[rule_id]
            hf = _fill(rule.hf, dict(groups))
            missing = [_fill(rule.ours[j], dict(groups)) for j in range(len(rule.ours))
                       if j not in parts]
            if missing:
                raise NameMapError(f"{hf}: missing {', '.join(missing)}")
            names = tuple(parts[j] for j in range(len(rule.ours)))
            if rule.kind == "expert":
                out += [HFTensor(_fill(hf, {"e": str(e)}), rule, names, e)
                        for e in range(rule.sizes[0])]
            else:
                out.append(HFTensor(hf, rule, names))
        return out

    def generated(self, example: Tensor, layout: Layout = "memory") -> dict[str, Tensor]:
        """The config-fixed buffers a checkpoint of this family stores (Marian's sinusoid
        tables, BART's zero ``final_logits_bias``), in ``example``'s library and dtype."""
        return {r.hf: r.make(example) for r in self.rules if r.kind == "generated"
                and r.make is not None and r.layout in ("both", layout)}

    def from_tfgraph(self, state: Mapping[str, Tensor], layout: Layout = "memory"
                     ) -> dict[str, Tensor]:
        """tfgraph's state dict as the family's Hugging Face names (a module's, or with
        ``layout="disk"`` a saved folder's), fused tensors fused back, aliases and
        config-fixed buffers written too."""
        if not state:
            return {}
        out = {t.name: t.fuse([state[p] for p in t.parts])
               for t in self.hf_tensors(state, layout=layout)}
        out.update(self.generated(next(iter(state.values())), layout))
        return out


@dataclass(frozen=True)
class HFTensor:
    """One Hugging Face tensor and the tfgraph parameters (``parts``) it is made of."""

    name: str
    rule: Rule
    parts: tuple[str, ...]
    expert: int | None = None  # which expert of the stacked part (an ``expert`` rule)

    def shape(self, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
        """Its shape, from the shapes of its parts (what :meth:`fuse` returns)."""
        first = tuple(shapes[self.parts[0]])
        kind = self.rule.kind
        if kind in ("copy", "alias"):
            return first
        if kind == "expert":
            return first[1:]
        if kind == "transpose":
            return first[::-1]
        if kind == "heads":
            return (sum(shapes[p][0] for p in self.parts), *first[1:])
        axis = self.rule.axis
        fused = first[:axis] + (sum(shapes[p][axis] for p in self.parts),) + first[axis + 1:]
        return fused[::-1] if kind == "split_t" else fused

    def fuse(self, tensors: list[Tensor]) -> Tensor:
        """The Hugging Face tensor from its parts' values (in ``parts`` order)."""
        kind = self.rule.kind
        if kind in ("copy", "alias"):
            return tensors[0]
        if kind == "expert":
            return _contiguous(tensors[0][self.expert])
        if kind == "transpose":
            return _contiguous(tensors[0].T)
        if kind == "heads":
            shape = tensors[0].shape
            per = [t.reshape(self.rule.sizes[0], -1, *shape[1:]) for t in tensors]
            return _cat(per, 1).reshape(-1, *shape[1:])  # each head's (group's) parts in turn
        fused = _cat(tensors, self.rule.axis)
        return _contiguous(fused.T) if kind == "split_t" else fused


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
