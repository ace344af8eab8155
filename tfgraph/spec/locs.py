"""Reading pydantic error ``loc``s against the data they are about (tfgraph.spec.errors).

pydantic's ``loc`` mixes keys of the input with names of union members (``('layers',
'constrained-int')``, ``('layers', 'StackLayers', 'encoder')``); walking it against the actual
data keeps the keys and drops the rest. Cross-field rules arrive with ``loc == ()`` and a
message ``"Value error, field.path: what to change"`` (the convention of
``tfgraph.spec.schema``): :data:`PATH_PREFIX` reads the path.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from tfgraph.spec.safe_yaml import KeyPath

PATH_PREFIX = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*): (.+)$", re.S)
DOTTED = re.compile(r"\b[a-z_]+(?:\.[a-z_]+)+\b")
MAPPING_TYPES = {"model_type", "dict_type", "model_attributes_type"}
# A list branch's complaints about the list as a whole (its items' carry their index in loc).
LIST_TYPES = {"list_type", "too_short", "too_long"}


def members(annotation: Any) -> list[Any]:
    """Flatten ``X | Y | None`` and ``Annotated[...]`` into the member types."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in members(arg)]
    return [annotation]


def models_of(annotation: Any) -> list[type[BaseModel]]:
    return [m for m in members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]


def model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class a ``loc`` leads to, following field names and union-member tags."""
    model: type[BaseModel] | None = root
    candidates: list[type[BaseModel]] = []
    for element in loc:
        by_name = {c.__name__: c for c in candidates}
        if element in by_name:  # a union-member tag picks the branch
            model, candidates = by_name[element], []
            continue
        if model is None or element not in model.model_fields:
            return None
        candidates = models_of(model.model_fields[element].annotation)
        model = candidates[0] if len(candidates) == 1 else None
    return model


def walk(loc: tuple[Any, ...], data: Any) -> tuple[KeyPath, int | None]:
    """The keys of ``loc`` present in ``data``, and the index in ``loc`` of the first non-key."""
    keys: list[Any] = []
    skipped: int | None = None
    node = data
    for i, element in enumerate(loc):
        if isinstance(node, dict) and element in node:
            keys.append(element)
            node = node[element]
        elif isinstance(node, list) and isinstance(element, int) and 0 <= element < len(node):
            keys.append(element)
            node = node[element]
        elif skipped is None:
            skipped = i
    return tuple(keys), skipped


def value_at(data: Any, path: KeyPath) -> Any:
    for key in path:
        data = data[key]
    return data


def drop_union_noise(errors: list[ErrorDetails], data: Any) -> list[ErrorDetails]:
    """Keep, at each union, only the branch that matches the kind of value written.

    ``layers: {encoder: 2, decoder: true}`` fails both as an int and inside StackLayers; the
    int branch's complaint ("not an integer") is noise because a mapping was clearly meant.
    Likewise ``eos: [1, -2]`` is about its item ``-2``, not "expected an integer, got a
    list". Conversely ``layers: true`` is reported as "expected an integer", with the mapping
    form as a hint, not as "expected a mapping" (nor ``eos: x`` as "expected a list").
    """
    def list_branch(union: tuple[Any, ...]) -> bool:
        """Whether the union at ``union`` has a list member (pydantic tags it ``list[...]``)."""
        return any(len(e["loc"]) > len(union) and tuple(e["loc"][:len(union)]) == union
                   and str(e["loc"][len(union)]).startswith("list[") for e in errors)

    def union_branch(err: ErrorDetails) -> tuple[tuple[Any, ...], bool] | None:
        """(the loc of the union, whether this branch is noise), or None outside unions."""
        loc = err["loc"]
        keys, skipped = walk(loc, data)
        if skipped is None or err["type"] == "missing" and skipped == len(loc) - 1:
            return None
        value = value_at(data, keys)
        if isinstance(value, dict):  # a scalar (or list) branch rejecting the mapping
            noise = len(loc) == skipped + 1 and err["type"] not in MAPPING_TYPES
        elif isinstance(value, list) and list_branch(tuple(loc[:skipped])):
            # a scalar (or mapping) branch rejecting the list a list member was written for
            noise = len(loc) == skipped + 1 and err["type"] not in LIST_TYPES
        else:  # a mapping or list branch rejecting the scalar (or a list no member takes)
            noise = err["type"] in MAPPING_TYPES or err["type"] == "list_type"
        return tuple(loc[:skipped]), noise

    branches = [union_branch(err) for err in errors]
    useful = {b[0] for b in branches if b is not None and not b[1]}
    # Noise is dropped only where its union has a useful error to show instead.
    return [
        err
        for err, branch in zip(errors, branches)
        if branch is None or not branch[1] or branch[0] not in useful
    ]
