"""Shared test helpers: the spec library, and tiny versions of its large members.

``small(spec)`` keeps every knob of a spec (arch, norm placement and kind, positions, GQA ratio,
activation, tying, dtype, output) and shrinks only the sizes, so back-end tests cover what each
file in ``specs/`` means at a cost a 2-core CI machine can pay.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest

from tfgraph.spec.schema import Spec, StackLayers, Vocabularies

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
    if att.get("latent") is not None:  # latent attention: small latents, same knobs
        lat = att["latent"]
        att["kv_heads"] = heads  # latent attention expands per query head
        lat.update(kv_rank=16, rope_dim=4, v_head_dim=att["head_dim"] - 2,
                   q_rank=24 if lat["q_rank"] is not None else None)
        att["scale"] = None if att["scale"] is None else att["head_dim"] ** -0.5
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
    data.pop("tokens", None)  # a published model's ids lie past the tiny vocabulary
    if data["embedding"].get("pad_no_grad"):  # a row inside it, still without gradient
        data["tokens"] = {"pad": 0}
    if data["max_len"] is not None:
        data["max_len"] = min(data["max_len"], 64)
    ffn = data["ffn"]
    if ffn.get("experts") is not None:  # mixture of experts: a few narrow experts, same knobs
        experts = min(ffn["experts"], 8)
        ffn.update(experts=experts, top_k=max(1, min(ffn["top_k"], experts // 2)),
                   expert_hidden=d_model // 2 + 4)
        if ffn["shared_experts"]:
            ffn["shared_hidden"] = ffn["shared_experts"] * ffn["expert_hidden"] + (
                8 if spec.ffn.shared_hidden != spec.ffn.shared_experts * spec.ffn.expert_hidden
                else 0)  # keep "shared_hidden is not shared_experts * expert_hidden"
        if ffn.get("router_groups", 1) > 1:  # DeepSeek: 4 groups of 2, the best 2 of them
            ffn.update(experts=8, router_groups=4, router_top_groups=2,
                       top_k=min(ffn["top_k"], 4))
        layers = data["layers"] if isinstance(data["layers"], int) else 2
        ffn["dense_layers"] = min(ffn["dense_layers"], layers - 1)
    emb, hd = data["embedding"], att["head_dim"]
    if emb["rotary_fraction"] < 1 and int(hd * emb["rotary_fraction"]) % 2:
        emb["rotary_fraction"] = 0.5  # still partial, and an even number of the smaller head
    scaling = emb.get("rope_scaling")
    if scaling and scaling.get("original_max_len") and data["max_len"] is not None:
        scaling["original_max_len"] = min(scaling["original_max_len"], data["max_len"])
    return Spec.model_validate(data)


def tgt_for(graph: Any, tgt: int) -> int | None:
    """``tgt_seq`` for ``graph.report``: ``tgt`` for an encoder-decoder, None for a model with
    one sequence, whose report refuses a target length (as ``report --tgt-seq``)."""
    return tgt if graph.spec is not None and graph.spec.arch == "encoder-decoder" else None


def load_all_specs() -> list[tuple[str, Spec]]:
    from tfgraph.spec.loader import load_spec

    return [(p.name, load_spec(p)) for p in SPEC_FILES]


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for the test (``pytest.mark.usefixtures("one_torch_thread")``):
    decoding tests compare tokens, and a float sum split over another number of threads
    rounds differently; ``_torch_threads_restored`` gives the next test its count back."""
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True)
def _torch_threads_restored() -> Iterator[None]:
    """A command run in-process with ``--threads N`` sets torch's intra-op threads for the
    whole process (a CLI's right); the next test on this pytest-xdist worker must not inherit
    it: a float sum split over another number of threads rounds differently."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(params=[p.name for p in SPEC_FILES])
def spec_file(request: pytest.FixtureRequest) -> Path:
    """Each file in specs/, one test per file."""
    return ROOT / "specs" / request.param


@pytest.fixture
def small_spec(spec_file: Path) -> Spec:
    """Each file in specs/ at tiny sizes (see ``small``)."""
    from tfgraph.spec.loader import load_spec

    return small(load_spec(spec_file))
