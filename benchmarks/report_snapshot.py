"""Snapshot of every figure tfgraph derives from the specs, to check a speed change keeps
them byte-identical (issue 23, item 6).

    python benchmarks/report_snapshot.py OUT.json [--quick]

For every spec in specs/ and benchmarks/specs/: ``graph.report(...)`` as
``json.dumps(report, sort_keys=True)`` at batch/seq 1/128, 2/64 with fused attention, 3/2048,
5/33 and the default length (an encoder-decoder also at separate target lengths; a refused
length records its refusal message); then, without ``--quick``, the training step's peak under
every recompute choice, the graph's JSON form (every node's cost strings) and the loss graph's,
``tfgraph plan --json`` of a few specs and ``tfgraph report``'s text of a few. Compare two
snapshots with ``cmp``; run it against another checkout with ``PYTHONPATH=that/checkout``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import tfgraph
from tfgraph.graph.serialize import graph_dict

ROOT = Path(__file__).resolve().parent.parent
SETTINGS: list[dict[str, Any]] = [
    {"batch": 1, "seq": 128},
    {"batch": 2, "seq": 64, "fused_attention": True},
    {"batch": 3, "seq": 2048},
    {"batch": 5, "seq": 33},
    {},
]
TWO_LENGTHS: list[dict[str, Any]] = [
    {"batch": 2, "seq": 48, "tgt_seq": 17},
    {"batch": 1, "seq": 128, "tgt_seq": 300, "fused_attention": True},
    {"batch": 1, "seq": 32, "tgt_seq": 40, "fused_attention": True},
]
PLANS = [("gpt3-175b.yaml", ["--gpus", "64", "--tp", "8", "--pp", "8"]),
         ("tiny-llama.yaml", ["--gpus", "2", "--tp", "2", "--sp"]),
         ("tiny-moe.yaml", ["--gpus", "4", "--ep", "2", "--recompute", "selective"]),
         ("tiny-t5.yaml", ["--gpus", "2", "--tp", "2", "--attention", "unfused"]),
         ("tiny-gemma2.yaml", ["--gpus", "2", "--tp", "2", "--recompute", "full",
                               "--attention", "unfused"]),
         ("tiny-bart.yaml", ["--gpus", "2", "--recompute", "full", "--seq", "40"]),
         ("gpt2.yaml", ["--gpus", "8", "--search", "--top", "3"])]


def _report(graph: Any, setting: dict[str, Any]) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return json.dumps(graph.report(**setting), sort_keys=True)
    except Exception as err:  # a refused length: its message is the result
        return f"refused: {type(err).__name__}: {err}"


def _train_peaks(key: str, graph: Any) -> dict[str, str]:
    """The training step's peak under every recompute choice (the report shows "none")."""
    from tfgraph.passes.report import sizes_for
    from tfgraph.passes.train_walk import RECOMPUTE, loss_graph, train_peak

    train = loss_graph(graph)
    if train is None:
        return {}
    out = {}
    for recompute in RECOMPUTE:
        for fused in (False, True):
            peak = train_peak(train, sizes_for(graph, 2, 32, 24), recompute, fused)
            out[f"{key} train_peak {recompute} fused={fused}"] = repr(peak)
    return out


def snapshot(quick: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    specs = [*sorted((ROOT / "specs").glob("*.yaml")),
             *sorted((ROOT / "benchmarks" / "specs").glob("*.yaml"))]
    for path in specs:
        key = f"{path.parent.name}/{path.name}"
        graph = tfgraph.compile(path)
        settings = list(SETTINGS)
        if graph.spec is not None and graph.spec.arch == "encoder-decoder":
            settings += TWO_LENGTHS
        for setting in settings:
            out[f"{key} report {sorted(setting.items())}"] = _report(graph, setting)
        if not quick:
            out.update(_train_peaks(key, graph))
            out[f"{key} graph"] = json.dumps(graph_dict(graph), sort_keys=True)
            if graph.spec is not None and graph.spec.arch != "encoder-only":
                loss = tfgraph.compile(path, loss=True)
                out[f"{key} loss graph"] = json.dumps(graph_dict(loss), sort_keys=True)
    if not quick:
        from click.testing import CliRunner

        from tfgraph.cli import main
        runner = CliRunner()
        for name, args in PLANS:
            res = runner.invoke(main, ["plan", str(ROOT / "specs" / name), *args, "--json"])
            out[f"plan {name} {args}"] = f"{res.exit_code}\n{res.output}"
        for name in ("gpt2.yaml", "tiny-t5.yaml", "tiny-moe.yaml", "tiny-gemma2.yaml"):
            res = runner.invoke(main, ["report", str(ROOT / "specs" / name)])
            out[f"report text {name}"] = f"{res.exit_code}\n{res.output}"
    return out


if __name__ == "__main__":
    result = snapshot("--quick" in sys.argv)
    Path(sys.argv[1]).write_text(json.dumps(result, indent=0, sort_keys=True) + "\n")
    print(f"{len(result)} entries")
