"""Run several trainings of examples/train_distributed.py in one ``torchrun`` launch (the
launch costs seconds; tests/test_distributed.py batches its checks): argv[1] is a JSON list
of argument lists, argv[2] the JSON file rank 0 writes the results to, one per argument
list (an ``{"error": ...}`` object for a run that raised TfgraphError)."""

from __future__ import annotations

from typing import Any

from distributed_support import load_example, run_jobs


def main() -> None:
    example = load_example()

    def train(argv: list[str]) -> Any:
        return example.train(example.parse_args(argv))

    run_jobs(train)


if __name__ == "__main__":
    main()
