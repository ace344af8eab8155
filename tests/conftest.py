"""Shared test helpers: the spec library, and tiny versions of its large members.

``small(spec)`` keeps every knob of a spec (arch, norm placement and kind, positions, GQA ratio,
activation, tying, dtype, output) and shrinks only the sizes, so back-end tests cover what each
file in ``specs/`` means at a cost a 2-core CI machine can pay.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tfgraph.spec import Spec, StackLayers, Vocabularies

ROOT = Path(__file__).resolve().parent.parent
SPEC_FILES = sorted((ROOT / "specs").glob("*.yaml"))


def small(spec: Spec, d_model: int = 32, vocab: int = 61, max_layers: int = 2) -> Spec:
    """``spec`` with tiny sizes and the same structure (4 heads of 8, GQA ratio kept)."""
    data = spec.model_dump()
    att = data["attention"]
    heads, group = 4, att["heads"] // att["kv_heads"]
    att.update(heads=heads, kv_heads=max(1, heads // min(group, heads)), head_dim=d_model // heads)
    if spec.attention.head_dim != spec.d_model // spec.attention.heads:
        att["head_dim"] = d_model // heads + 4  # keep "head_dim is not d_model / heads"
    data["d_model"] = d_model
    data["ffn"]["hidden"] = 2 * d_model + 8
    if isinstance(spec.layers, StackLayers):
        data["layers"] = {k: min(v, max_layers) for k, v in data["layers"].items()}
    else:
        data["layers"] = min(spec.layers, max_layers)
    if isinstance(spec.vocab, Vocabularies):
        data["vocab"] = {"source": vocab, "target": vocab + 6}
    else:
        data["vocab"] = vocab
    if data["max_len"] is not None:
        data["max_len"] = min(data["max_len"], 64)
    return Spec.model_validate(data)


def load_all_specs() -> list[tuple[str, Spec]]:
    from tfgraph.loader import load_spec

    return [(p.name, load_spec(p)) for p in SPEC_FILES]


@pytest.fixture(params=[p.name for p in SPEC_FILES])
def spec_file(request: pytest.FixtureRequest) -> Path:
    """Each file in specs/, one test per file."""
    return ROOT / "specs" / request.param


@pytest.fixture
def small_spec(spec_file: Path) -> Spec:
    """Each file in specs/ at tiny sizes (see ``small``)."""
    from tfgraph.loader import load_spec

    return small(load_spec(spec_file))
