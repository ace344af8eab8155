"""Turn a pydantic ``ValidationError`` into one located, readable :class:`SpecError`.

Each error's ``loc`` is read against the data (tfgraph.spec.locs) for the keys it names; a
cross-field rule's message names its field (``field.path: what to change``), which says which
line to point at. The errors pydantic did not get to are found by repairing the file
(tfgraph.spec.repair).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from yaml.error import Mark

from tfgraph.errors import SpecError
from tfgraph.spec.locs import (DOTTED, MAPPING_TYPES, PATH_PREFIX, drop_union_noise,
                               model_at, walk)
from tfgraph.spec.repair import after_repair
from tfgraph.spec.safe_yaml import Document, KeyPath

_EXPECTED = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "list_type": "expected a list",
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
            for name in DOTTED.findall(self.message):
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


def _mapping_hint(err: ErrorDetails, errors: list[ErrorDetails], root: type[BaseModel]) -> str:
    """'; or a mapping with keys a, b' when a scalar was written where a model also fits."""
    loc = err["loc"]
    for other in errors:
        oloc = other["loc"]
        if other["type"] in MAPPING_TYPES and len(oloc) == len(loc) and oloc[:-1] == loc[:-1]:
            model = model_at(root, oloc)
            if model is not None:
                return "; or a mapping with keys " + ", ".join(model.model_fields)
    return ""


def _problem(
    err: ErrorDetails, all_errors: list[ErrorDetails], doc: Document, root: type[BaseModel]
) -> _Problem:
    loc, kind, msg = tuple(err["loc"]), err["type"], err["msg"]
    keys, _ = walk(loc, doc.data)
    if kind == "extra_forbidden":
        key = loc[-1]
        model = model_at(root, loc[:-1])
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
        match = PATH_PREFIX.match(msg) if not loc else None
        if match:  # a cross-field rule names the field it is about
            return _Problem(tuple(match.group(1).split(".")), match.group(2))
        return _Problem(keys, msg)
    got = _show(err["input"])
    if kind == "literal_error":
        return _Problem(keys, f"must be one of {err['ctx']['expected']} (got {got})")
    if kind in MAPPING_TYPES:
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


def spec_error(
    exc: ValidationError, doc: Document, filename: str, root: type[BaseModel]
) -> SpecError:
    """The first problem, located in the file, with a count of the others in its message and
    all of them, located, in ``.problems`` (``tfgraph validate --all-errors`` prints them)."""
    raw = exc.errors(include_url=False)
    errors = sorted(drop_union_noise(raw, doc.data), key=_explains_first)
    problems = [_located(_problem(err, raw, doc, root), doc, filename) for err in errors]
    seen = {str(p) for p in problems}
    for err in after_repair(doc.data, errors, root):
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
