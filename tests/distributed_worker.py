"""Run several trainings of examples/train_distributed.py in one ``torchrun`` launch (the
launch costs seconds; tests/test_distributed.py batches its checks): argv[1] is a JSON list
of argument lists, argv[2] the JSON file rank 0 writes the results to, one per argument
list (an ``{"error": ...}`` object for a run that raised TfgraphError)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from distributed_support import load_example
from tfgraph.errors import TfgraphError



def main() -> None:
    example = load_example()
    dist.init_process_group("gloo")
    results = []
    for argv in json.loads(sys.argv[1]):
        try:
            results.append(example.train(example.parse_args(argv)))
        except TfgraphError as e:
            results.append({"error": str(e)})
        dist.barrier()
    if dist.get_rank() == 0:
        Path(sys.argv[2]).write_text(json.dumps(results))
    dist.barrier()  # no rank tears down gloo while another is still writing (it aborted)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
