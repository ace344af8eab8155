"""A derived default checked against its own field's rules.

``Spec._derive`` fills in what a spec leaves out (``ffn.shared_hidden = shared_experts *
expert_hidden``, yarn's ``attention_factor``, ...). A value derived from valid fields can still
break the rules of the field it lands in (a width above its bound, a factor at or below 0); a
spec validated so would dump to a file that does not load again. :func:`check_derived` refuses
it at validation, naming the fields it was derived from.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

# pydantic's constraint errors said as the spec's messages say them; ctx holds the bound.
_RULES = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
}


def check_derived(model: BaseModel, name: str, path: str, source: str) -> None:
    """Raise ``ValueError("path: ...")`` when ``model.name``, derived from ``source`` (the
    fields it is computed from, dotted so the error points at the first one the file has),
    breaks the rules of its field ``name``."""
    value = getattr(model, name)
    try:  # on a copy: validate_assignment writes the value it validates
        type(model).__pydantic_validator__.validate_assignment(model.model_copy(), name, value)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        msg = str(err["msg"])
        if msg.startswith("Value error, "):
            rule = msg[len("Value error, "):]
        else:
            rule = _RULES.get(err["type"], msg).format(**err.get("ctx", {}))
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        raise ValueError(f"{path}: derived from {source} as {shown}, which {rule}; change "
                         f"them or set {path}") from None
