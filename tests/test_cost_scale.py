"""No weights are ever allocated: a 1-trillion-parameter spec compiles and reports with a few MB
of Python memory, where its float32 weights alone would be 4 TB. How long it takes is measured
by benchmarks/compile.py (the README's claim for ``tfgraph report``), not here."""

from __future__ import annotations

import tracemalloc

import tfgraph
from tfgraph.spec.schema import Spec

TRILLION = {
    "name": "trillion", "arch": "decoder-only", "d_model": 25600, "layers": 128, "vocab": 50257,
    "max_len": 4096, "embedding": {"positions": "learned", "scale": False},
    "attention": {"heads": 160}, "ffn": {"activation": "gelu"}, "norm": {"position": "pre"},
}


def test_trillion_parameter_spec_compiles_and_reports():
    rep = tfgraph.compile(Spec.model_validate(TRILLION)).report(batch=8, seq=4096)
    assert rep["params"] >= 10**12
    assert rep["memory"]["weights"] == 4 * rep["params"]


def test_trillion_parameter_spec_allocates_no_weights():
    spec = Spec.model_validate(TRILLION)
    tracemalloc.start()
    try:
        rep = tfgraph.compile(spec).report(batch=1, seq=2048)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rep["memory"]["weights"] > 4 * 10**12
    assert peak < 200 * 2**20, f"peak Python allocation {peak / 2**20:.0f} MiB"
