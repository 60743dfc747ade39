"""One module per benchmark, each run as ``python -m bench <name> [options]``."""
