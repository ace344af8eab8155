"""``python -m tfgraph``: the same program as the ``tfgraph`` console script."""

from tfgraph.cli import main

if __name__ == "__main__":
    main(prog_name="tfgraph")
