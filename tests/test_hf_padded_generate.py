"""Greedy decoding of the families added with new spec features (MPT's ALiBi and clip_qkv,
OLMo 1's norms without parameters, Cohere2's rotary positions on the sliding layers only, ...)
against transformers' ``generate`` on a left-padded batch.

The tiny model of each family's case in tests/test_hf_families.py is imported from its folder;
tfgraph's KV-cache module (``to_torch`` with ``attention_mask`` and ``past_key_values``)
decodes 10 tokens greedily from three prompts of different lengths, left-padded, and must give
transformers' tokens; the ONNX KV-cache graph (opsets 23 and 17) must give transformers'
logits of the padded prompts on every real position.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

import tfgraph
from tfgraph.exporters import to_onnx, to_torch
from tfgraph.hf import name_map

from parity_support import greedy_with_cache
from test_hf_families import CASES, build_reference, family_seed, import_spec

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
TOL = dict(atol=1e-4, rtol=1e-4)
FAMILIES = ["mpt", "olmo", "cohere2", "falcon-new", "phimoe", "falcon-alibi", "falcon-alibi-12"]


def padded(vocab: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(3)
    lengths = (4, 11, 7)
    ids = torch.zeros((len(lengths), max(lengths)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, -n:] = torch.randint(2, vocab, (n,), generator=gen)
        mask[row, -n:] = 1
    return ids, mask


def imported(family: str, tmp_path: Path) -> tuple[tfgraph.Spec, torch.nn.Module,
                                                    dict[str, Tensor]]:
    case = CASES[family]
    ref = build_reference(case, seed=family_seed(family))
    ref.config.save_pretrained(tmp_path / family)
    spec = import_spec(tmp_path / family, tmp_path / f"{family}.yaml")
    config = json.loads((tmp_path / family / "config.json").read_text())
    return spec, ref, name_map(config, spec).to_tfgraph(ref.state_dict())


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_on_a_padded_batch_equal_transformers(family: str, tmp_path: Path
                                                            ) -> None:
    spec, ref, weights = imported(family, tmp_path)
    model = to_torch(tfgraph.compile(spec), weights=weights).eval()
    ids, mask = padded(spec.vocab_size("source"))
    new = 10
    with torch.no_grad():
        # eos -1: no token ends a row early or is suppressed before max_new_tokens
        want = ref.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                            eos_token_id=-1, pad_token_id=0)[:, ids.shape[1]:]
    assert greedy_with_cache(model, ids, mask, new).tolist() == want.tolist()


@pytest.mark.parametrize("opset", [23, 17])
@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_kv_cache_logits_on_a_padded_batch(family: str, opset: int, tmp_path: Path
                                                ) -> None:
    spec, ref, weights = imported(family, tmp_path)
    ids, mask = padded(spec.vocab_size("source"))
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
    graph = tfgraph.compile(spec, cache=True)
    session = ort.InferenceSession(to_onnx(graph, weights=weights, opset=opset)
                                   .SerializeToString(), providers=["CPUExecutionProvider"])
    att = spec.attention
    feeds: dict[str, np.ndarray] = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    for given in session.get_inputs():
        if given.name.startswith("past_key_values"):
            feeds[given.name] = np.zeros((3, att.kv_heads, 0, att.head_dim), np.float32)
        elif given.name == "position_ids":  # left padding: count the real tokens from 0
            feeds["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0).numpy()
    got = session.run(None, feeds)[0]
    real = mask.bool().numpy()
    np.testing.assert_allclose(got[real], want.numpy()[real], **TOL)
