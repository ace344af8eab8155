"""A ``Spec`` object validated again (``tfgraph.compile``): pydantic checks a spec when it is
built, not when it is changed after (``spec.model_copy(update=...)``, attribute assignment),
so a Spec given to the Python API may hold what no spec file can (``layers: 0``, a dtype
with no size, a dict where a model belongs).

The check is pydantic's own, on the spec's fields (a fraction of a millisecond); only when it
fails is the spec written out and read back as a file (tfgraph.spec.loader), so that the
error is the one ``parse_spec(dump_spec(spec))`` gives: the same words and field path, less
the line and column of a file the user never saw.
"""

from __future__ import annotations

import warnings

from pydantic import ValidationError

from tfgraph.errors import SpecError
from tfgraph.spec.schema import Spec


def _unlocated(error: SpecError) -> SpecError:
    """``error`` without the file, line and column of the YAML written to find it."""
    problems = [SpecError(p.message, path=p.path) for p in error.problems]
    first = problems[0]
    if len(problems) > 1:
        others = len(problems) - 1
        first = SpecError(f"{first.message} [{others} more error{'s' if others > 1 else ''}]",
                          path=first.path)
    first.problems = [first, *problems[1:]]
    return first


def _as_file(spec: Spec, exc: ValidationError) -> SpecError:
    """The SpecError of ``spec`` read as a file; pydantic's first error when it cannot be
    written as one (a field holding an object YAML has no form for)."""
    from tfgraph.spec.loader import dump_spec, parse_spec

    try:
        with warnings.catch_warnings():  # pydantic warns of each field of an unexpected type
            warnings.simplefilter("ignore")
            text = dump_spec(spec)
        parse_spec(text, filename="<spec>")
    except SpecError as error:
        return _unlocated(error)
    except Exception:  # noqa: BLE001 - no YAML for it: pydantic's words below
        pass
    first = exc.errors(include_url=False)[0]
    path = ".".join(str(part) for part in first["loc"])
    return SpecError(f"{first['msg']} (got {first.get('input')!r:.60})", path=path or None)


def rechecked(spec: Spec) -> Spec:
    """``spec`` validated again, as a new ``Spec`` (every rule, cross-field ones and derived
    values included); SpecError (a TfgraphError) naming the field that breaks one."""
    if not isinstance(spec, Spec):
        raise SpecError(f"expected a tfgraph.Spec or a spec file's path, got "
                        f"{type(spec).__name__}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a dict where a model was: validated just below
            data = spec.model_dump(round_trip=True)
    except Exception as exc:  # noqa: BLE001 - a field holding what pydantic cannot read
        raise SpecError(f"the spec cannot be read back: {exc}") from None
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        raise _as_file(spec, exc) from None
