"""Analyses of datasets and models, each a `python -m analyses.<name>` command with the same `key=value` config as
train.py (pipeline/config.py), writing JSON and figures into `output_dir`."""
