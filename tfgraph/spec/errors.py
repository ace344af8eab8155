"""Turn a pydantic ``ValidationError`` into one located, readable :class:`SpecError`.

pydantic's ``loc`` mixes keys of the input with names of union members (``('layers',
'constrained-int')``, ``('layers', 'StackLayers', 'encoder')``); walking it against the actual
data keeps the keys and drops the rest. Cross-field rules arrive with ``loc == ()`` and a message
``"Value error, field.path: what to change"`` (the convention of ``tfgraph.spec.schema``); the leading
path says which line to point at.
"""

from __future__ import annotations

import copy

import difflib
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from yaml.error import Mark

from tfgraph.errors import SpecError
from tfgraph.spec.safe_yaml import Document, KeyPath

_PATH_PREFIX = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*): (.+)$", re.S)
_DOTTED = re.compile(r"\b[a-z_]+(?:\.[a-z_]+)+\b")
_MAPPING_TYPES = {"model_type", "dict_type", "model_attributes_type"}
_EXPECTED = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
}

# pydantic's constraint errors, reworded like the rest ("must be ..."); ctx holds the bound.
_CONSTRAINTS = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "string_too_short": "must have at least {min_length} characters",
    "string_too_long": "must have at most {max_length} characters",
    "too_short": "must hold at least {min_length} items",
    "too_long": "must hold at most {max_length} items",
}
# Field patterns (tfgraph.spec.schema) said in words.
_PATTERNS = {
    r"^[a-z0-9][a-z0-9._-]*$": "must be lowercase letters, digits, '.', '_' or '-', starting "
                               "with a letter or digit",
}


@dataclass
class _Problem:
    path: KeyPath
    message: str
    at_key: bool = False

    def mark(self, doc: Document) -> Mark:
        """Where to point: the field itself or, when the file lacks it (``max_len: required
        when embedding.positions is learned``), the first field the message names that the
        file has, since that line is the reason for the error."""
        if self.path not in doc:
            for name in _DOTTED.findall(self.message):
                other = tuple(name.split("."))
                if other in doc:
                    return doc.locate(other)
        return doc.locate(self.path, at_key=self.at_key)


def _show(value: Any) -> str:
    """A short, YAML-flavoured rendering of an offending input."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _members(annotation: Any) -> list[Any]:
    """Flatten ``X | Y | None`` and ``Annotated[...]`` into the member types."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    return [annotation]


def _models_of(annotation: Any) -> list[type[BaseModel]]:
    return [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
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
        candidates = _models_of(model.model_fields[element].annotation)
        model = candidates[0] if len(candidates) == 1 else None
    return model


def _walk(loc: tuple[Any, ...], data: Any) -> tuple[KeyPath, int | None]:
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


def _value_at(data: Any, path: KeyPath) -> Any:
    for key in path:
        data = data[key]
    return data


def _drop_union_noise(errors: list[ErrorDetails], data: Any) -> list[ErrorDetails]:
    """Keep, at each union, only the branch that matches the kind of value written.

    ``layers: {encoder: 2, decoder: true}`` fails both as an int and inside StackLayers; the
    int branch's complaint ("not an integer") is noise because a mapping was clearly meant.
    Conversely ``layers: true`` is reported as "expected an integer", with the mapping form as
    a hint, not as "expected a mapping".
    """
    def union_branch(err: ErrorDetails) -> tuple[tuple[Any, ...], bool] | None:
        """(the loc of the union, whether this branch is noise), or None outside unions."""
        loc = err["loc"]
        keys, skipped = _walk(loc, data)
        if skipped is None or err["type"] == "missing" and skipped == len(loc) - 1:
            return None
        if isinstance(_value_at(data, keys), dict):  # a scalar branch rejecting the mapping
            noise = len(loc) == skipped + 1 and err["type"] not in _MAPPING_TYPES
        else:  # a mapping branch rejecting the scalar
            noise = err["type"] in _MAPPING_TYPES
        return tuple(loc[:skipped]), noise

    branches = [union_branch(err) for err in errors]
    useful = {b[0] for b in branches if b is not None and not b[1]}
    # Noise is dropped only where its union has a useful error to show instead.
    return [
        err
        for err, branch in zip(errors, branches)
        if branch is None or not branch[1] or branch[0] not in useful
    ]


def _mapping_hint(err: ErrorDetails, errors: list[ErrorDetails], root: type[BaseModel]) -> str:
    """'; or a mapping with keys a, b' when a scalar was written where a model also fits."""
    loc = err["loc"]
    for other in errors:
        oloc = other["loc"]
        if other["type"] in _MAPPING_TYPES and len(oloc) == len(loc) and oloc[:-1] == loc[:-1]:
            model = _model_at(root, oloc)
            if model is not None:
                return "; or a mapping with keys " + ", ".join(model.model_fields)
    return ""


def _problem(
    err: ErrorDetails, all_errors: list[ErrorDetails], doc: Document, root: type[BaseModel]
) -> _Problem:
    loc, kind, msg = tuple(err["loc"]), err["type"], err["msg"]
    keys, _ = _walk(loc, doc.data)
    if kind == "extra_forbidden":
        key = loc[-1]
        model = _model_at(root, loc[:-1])
        fields = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(key), fields, n=1, cutoff=0.6)
        if close:
            hint = f"did you mean {close[0]!r}?"
        else:
            hint = "valid fields: " + ", ".join(fields) if fields else "remove it"
        return _Problem(keys, f"unknown field {str(key)!r}; {hint}", at_key=True)
    if kind == "missing":
        return _Problem(keys + (loc[-1],), "required field is missing")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
        match = _PATH_PREFIX.match(msg) if not loc else None
        if match:  # a cross-field rule names the field it is about
            return _Problem(tuple(match.group(1).split(".")), match.group(2))
        return _Problem(keys, msg)
    got = _show(err["input"])
    if kind == "literal_error":
        return _Problem(keys, f"must be one of {err['ctx']['expected']} (got {got})")
    if kind in _MAPPING_TYPES:
        return _Problem(keys, f"expected a mapping, got {got}")
    if kind == "too_short" and err.get("ctx", {}).get("min_length") == 1:
        return _Problem(keys, f"must not be empty (got {got})")
    if kind in _CONSTRAINTS:
        return _Problem(keys, f"{_CONSTRAINTS[kind].format(**err.get('ctx', {}))} (got {got})")
    if kind == "string_pattern_mismatch":
        pattern = str(err.get("ctx", {}).get("pattern", ""))
        said = _PATTERNS.get(pattern, f"must match the pattern {pattern}")
        return _Problem(keys, f"{said} (got {got})")
    if kind in _EXPECTED:
        hint = _mapping_hint(err, all_errors, root)
        return _Problem(keys, f"{_EXPECTED[kind]}, got {got}{hint}")
    return _Problem(keys, f"{msg} (got {got})")


def _located(problem: _Problem, doc: Document, filename: str) -> SpecError:
    mark = problem.mark(doc)
    return SpecError(
        problem.message,
        file=filename,
        line=mark.line + 1,
        col=mark.column + 1,
        path=".".join(str(p) for p in problem.path) or None,
    )


def _explains_first(err: ErrorDetails) -> int:
    """Unknown fields first: a typo'd key (``layerz:``) is also why its field is missing, and
    "unknown field 'layerz'; did you mean 'layers'?" says so where "layers: required field is
    missing" would not."""
    return 0 if err["type"] == "extra_forbidden" else 1


def _after_repair(data: Any, errors: list[ErrorDetails], root: type[BaseModel],
                  rounds: int = 3) -> list[ErrorDetails]:
    """The errors pydantic did not get to: its cross-field rules (``heads`` against
    ``d_model``, ...) run only once every field is valid. So the document is repaired as the
    messages suggest -- an unknown key that is a typo of a missing field moves to that field
    (``layerz: 2`` -> ``layers: 2``), other unknown keys and invalid values are dropped (their
    defaults apply) -- and validated again, up to ``rounds`` times, for ``validate
    --all-errors`` to show every problem in one run. Nothing when the repair leaves a
    required field missing (the rules would only report that again)."""
    found: list[ErrorDetails] = []
    for _ in range(rounds):
        fixed = copy.deepcopy(data)
        if not isinstance(fixed, dict):
            return found
        for err in errors:
            if err["type"] == "missing":  # perhaps filled by a typo's value just moved
                continue
            keys, _ = _walk(tuple(err["loc"]), fixed)  # the loc minus union branch names
            if not keys:  # a missing field, or a rule of the whole document: nothing to drop
                continue
            holder = _value_at(fixed, keys[:-1])
            if not isinstance(holder, dict):
                continue
            value = holder.pop(keys[-1])
            loc = tuple(keys)
            if err["type"] == "extra_forbidden":
                model = _model_at(root, loc[:-1])
                fields = list(model.model_fields) if model else []
                close = difflib.get_close_matches(str(loc[-1]), fields, n=1, cutoff=0.6)
                if close and close[0] not in holder:
                    holder[close[0]] = value
        try:
            root.model_validate(fixed)
            return found
        except ValidationError as again:
            errors = again.errors(include_url=False)
        if any(e["type"] == "missing" for e in errors):
            return found
        found += [e for e in errors if not any(e["msg"] == f["msg"] and e["loc"] == f["loc"]
                                                for f in found)]
        data = fixed
    return found


def spec_error(
    exc: ValidationError, doc: Document, filename: str, root: type[BaseModel]
) -> SpecError:
    """The first problem, located in the file, with a count of the others in its message and
    all of them, located, in ``.problems`` (``tfgraph validate --all-errors`` prints them)."""
    raw = exc.errors(include_url=False)
    errors = sorted(_drop_union_noise(raw, doc.data), key=_explains_first)
    problems = [_located(_problem(err, raw, doc, root), doc, filename) for err in errors]
    seen = {str(p) for p in problems}
    for err in _after_repair(doc.data, errors, root):
        problem = _located(_problem(err, [err], doc, root), doc, filename)
        if str(problem) not in seen:
            seen.add(str(problem))
            problems.append(problem)
    first = _located(_problem(errors[0], raw, doc, root), doc, filename)
    if len(problems) > 1:
        others = len(problems) - 1
        first.message += (f" [{others} more error{'s' if others > 1 else ''} in this file: "
                          "tfgraph validate --all-errors]")
    first.problems = problems
    return first
