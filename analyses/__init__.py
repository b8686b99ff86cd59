"""Analyses of datasets and models, each an `analysis` config option run by evaluate.py.

Run one with `python evaluate.py analysis=<name> [analysis.key=value ...]` (analyses/registry.py,
configs/analysis/<name>.yaml); each writes JSON and figures into `output_dir`.
"""
