"""A mixture-of-experts training step on the CPU: tfgraph's module against transformers'
``OlmoeForCausalLM``, the same model.

    python benchmarks/moe_train_step.py [--repeat 3]

``specs/tiny-olmoe.yaml`` grown to 64 experts, top-8 (OLMoE's routing), d_model 512, expert
hidden 1024, 2 layers, 8 heads, vocabulary 1024; float32, batch 4 x 128; forward, token
cross-entropy, backward (median of ``--repeat`` after one warm-up). transformers' model is
built from the config.json ``tfgraph build --to hf`` writes for the spec, its weights copied
into tfgraph's module through the name map, so both compute the same loss (checked). Before the
routed experts unbound their stacked weights once (``tf.experts``), autograd wrote a
zero-filled gradient of each whole stack for every expert: ``plan --kernels eager`` showed
it (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # an installed tfgraph first; else this checkout

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

import tfgraph  # noqa: E402
from tfgraph.exporters import to_torch  # noqa: E402
from tfgraph.hf import name_map  # noqa: E402
from tfgraph.hf.export_config import hf_config  # noqa: E402

BATCH, SEQ = 4, 128


def grown_spec() -> Any:
    spec = tfgraph.load_spec(ROOT / "specs" / "tiny-olmoe.yaml")
    data = spec.model_dump(exclude_none=True)
    data.update(name="bench-olmoe", d_model=512, vocab=1024, max_len=256)
    data["ffn"].update(hidden=1024, expert_hidden=1024, experts=64, top_k=8)
    data["attention"].update(heads=8, kv_heads=8)
    del data["attention"]["head_dim"]  # 512 / 8, derived again
    return type(spec).model_validate(data)


def timed(step: Callable[[], float], repeat: int) -> tuple[float, float]:
    loss = step()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), loss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    spec = grown_spec()
    graph = tfgraph.compile(spec)
    exported = hf_config(spec)
    config = transformers.AutoConfig.for_model(**exported.config)
    theirs = transformers.AutoModelForCausalLM.from_config(config).train()
    names = name_map(exported.config, spec)  # transformers' weights into tfgraph's names
    ours = to_torch(graph, weights=names.to_tfgraph(theirs.state_dict())).train()
    ids = torch.randint(3, spec.vocab_size("source"), (BATCH, SEQ))

    def step_of(model: torch.nn.Module, hf: bool) -> Callable[[], float]:
        def step() -> float:
            logits = model(ids).logits if hf else model(ids)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
            loss.backward()
            model.zero_grad(set_to_none=True)
            return loss.item()
        return step

    threads = torch.get_num_threads()
    print(f"{spec.name}: 64 experts, top-8, d_model 512, expert hidden 1024, 2 layers; float32, "
          f"batch {BATCH} x {SEQ}, forward + cross-entropy + backward, median of "
          f"{args.repeat}; torch {torch.__version__}, {threads} threads")
    t_ours, loss_ours = timed(step_of(ours, False), args.repeat)
    t_hf, loss_hf = timed(step_of(theirs, True), args.repeat)
    print(f"tfgraph      {t_ours * 1e3:9.1f} ms  loss {loss_ours:.6f}")
    print(f"transformers {t_hf * 1e3:9.1f} ms  loss {loss_hf:.6f}  ({exported.model_type})")
    print(f"tfgraph / transformers time: {t_ours / t_hf:.3f}")
    assert abs(loss_ours - loss_hf) < 1e-4, "the two models differ"
    return 0


if __name__ == "__main__":
    sys.exit(main())
