"""One module per ``tfgraph`` subcommand; each is registered in ``tfgraph.cli``."""
