"""Repairing a spec as its errors suggest, to find the errors pydantic did not get to.

``tfgraph validate --all-errors`` lists them too (tfgraph.spec.errors, README.md "tfgraph
validate").
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from tfgraph.spec.locs import DOTTED, PATH_PREFIX, drop_union_noise, model_at, value_at, walk
from tfgraph.spec.safe_yaml import KeyPath

# Stand-ins for a required field whose value is invalid (or missing), one per variant of the
# repaired document: they satisfy the rules of the other fields (d_model divisible by most
# head counts, vocabularies above any token id, ...), and differ between variants so that a
# rule whose outcome depends on the stand-in is seen to (its message differs, or it fires in
# one variant only) and is not reported: it is about the value still to be chosen.
_STAND_INS: dict[str, tuple[Any, ...]] = {
    "name": ("t", "t", "t"),
    "arch": ("decoder-only", "encoder-only", "encoder-decoder"),
    "d_model": (20160, 40320, 60480),  # 2^6 * 3^2 * 5 * 7 and multiples
    "heads": (1, 2, 1),
    "top_k": (1, 1, 1),  # optional, but a rule asks for it with ffn.experts
    **{k: (64, 128, 192) for k in ("layers", "encoder", "decoder")},
    **{k: (1 << 20, 1 << 21, 1 << 22) for k in ("vocab", "source", "target")},
}
_VARIANTS = 3


def _error_path(err: ErrorDetails, data: Any) -> KeyPath:
    """The field an error is about, in ``data``: a rule's from its message, a missing
    field's with its name, others' as far as ``data`` has the keys of its loc (a list's
    item's: the list's, ``tokens.eos.1`` -> ``tokens.eos``)."""
    loc = tuple(err["loc"])
    if not loc:
        match = PATH_PREFIX.match(err["msg"].removeprefix("Value error, "))
        return tuple(match.group(1).split(".")) if match else ()
    if err["type"] == "missing":
        return walk(loc[:-1], data)[0] + (loc[-1],)
    keys, _ = walk(loc, data)
    for end in range(len(keys)):
        if isinstance(value_at(data, keys[:end]), list):
            return keys[:end]
    return keys


@functools.lru_cache(maxsize=1 << 14)  # a file has at most 10,000 keys
def _typo_of(root: type[BaseModel], path: KeyPath) -> str | None:
    """The field that the unknown key at ``path`` is a typo of, if any (once per variant)."""
    model = model_at(root, path[:-1])
    fields = list(model.model_fields) if model else []
    close = difflib.get_close_matches(str(path[-1]), fields, n=1, cutoff=0.6)
    return close[0] if close else None


def _repair(data: dict[str, Any], err: ErrorDetails, path: KeyPath, root: type[BaseModel],
            variant: int, attempt: int) -> bool:
    """Repair ``data`` at ``path`` as ``err`` suggests, in place; False if it cannot be: an
    unknown key is dropped (moved to the field it is a typo of, when that is missing), an
    invalid optional value dropped (its default applies), a required one replaced by its
    stand-in. When dropping an optional value did not help (``attempt`` 1: ``ffn.top_k:
    required with ffn.experts``), its stand-in if it has one. A rule about an optional field
    the file does not set (``max_len: required when ...``) has nothing to drop."""
    holder: Any = data
    for key in path[:-1]:
        holder = holder.get(key) if isinstance(holder, dict) else None
    if not path or not isinstance(holder, dict):
        return False
    leaf = path[-1]
    if attempt:
        if attempt > 1 or leaf not in _STAND_INS:
            return False
        holder[leaf] = _STAND_INS[str(leaf)][variant]
        return True
    if err["type"] == "extra_forbidden":
        value = holder.pop(leaf, None)
        close = _typo_of(root, path)
        if close is not None and close not in holder:
            holder[close] = value
        return True
    model = model_at(root, path[:-1])
    field = model.model_fields.get(str(leaf)) if model is not None else None
    if field is not None and field.is_required():
        if err["type"] == "missing" and leaf in holder:  # filled by a typo's value just moved
            return True
        if leaf not in _STAND_INS:
            return False
        holder[leaf] = _STAND_INS[str(leaf)][variant]
        return True
    return holder.pop(leaf, _ABSENT) is not _ABSENT


_ABSENT = object()


def after_repair(data: Any, errors: list[ErrorDetails], root: type[BaseModel],
                  rounds: int = 10) -> list[ErrorDetails]:
    """The errors pydantic did not get to: its cross-field rules (``heads`` against
    ``d_model``, ...) run only once every field is valid, and one at a time. So the document
    is repaired as each message suggests (:func:`_repair`) and validated again, round after
    round, for ``validate --all-errors`` to show in one run every problem that does not
    depend on how another is fixed (README.md "tfgraph validate").

    The repair is made in a few variants that differ in the stand-ins for required fields;
    only an error that every variant finds is reported, never one about a repaired value
    itself, nor one that names a repaired field (``embedding.local_rope_theta ... needs
    attention.window`` once an invalid window was dropped, ``relative_buckets 32`` once an
    invalid one was left to its default): those depend on how the reported error gets fixed.
    The rounds stop where a repair cannot be made or does not clear its error (``max_len:
    required when ...`` in a file without max_len; a second ``ffn.top_k`` error once top_k
    has its stand-in): the rules after that one are checked once it is fixed."""
    if not isinstance(data, dict):
        return []
    variants = [copy.deepcopy(data) for _ in range(_VARIANTS)]
    pending = [errors] * _VARIANTS
    repaired: dict[KeyPath, int] = {}  # how many rounds repaired each path
    found: list[ErrorDetails] = []
    for _ in range(rounds):
        now: set[KeyPath] = set()
        for variant, (fixed, errs) in enumerate(zip(variants, pending)):
            done: set[KeyPath] = set()  # a path with two errors is repaired once
            for err in errs:
                path = _error_path(err, fixed)
                attempt = repaired.get(path, 0)
                if path not in done and not _repair(fixed, err, path, root, variant, attempt):
                    return found
                done.add(path)
            now |= done
        for path in now:
            repaired[path] = repaired.get(path, 0) + 1
        pending = []
        for fixed in variants:
            try:
                root.model_validate(fixed)
                pending.append([])
            except ValidationError as again:
                pending.append(drop_union_noise(again.errors(include_url=False), fixed))
        if not any(pending):
            return found

        def key(err: ErrorDetails) -> tuple[Any, ...]:
            return tuple(err["loc"]), err["msg"]

        def about_repair(err: ErrorDetails) -> bool:
            """Whether ``err`` is at a repaired field, names one (``attention.window``), or
            says its name (``relative_buckets 32``, ``positions: rope``): then it is about
            the default or stand-in put there, not about the file."""
            named = [tuple(n.split(".")) for n in DOTTED.findall(err["msg"])]
            if any(p[:len(r)] == r for r in repaired
                   for p in (_error_path(err, variants[0]), *named)):
                return True
            body = err["msg"].removeprefix("Value error, ")
            match = PATH_PREFIX.match(body)
            words = set(re.findall(r"\w+", match.group(2) if match else body))
            return any(str(r[-1]) in words for r in repaired)

        common = set.intersection(*({key(e) for e in errs} for errs in pending))
        found += [e for e in pending[0] if key(e) in common and not about_repair(e)
                  and all(key(e) != key(f) for f in found)]
    return found
