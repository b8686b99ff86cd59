"""Analyses of datasets and models, each an `analysis` config option run by evaluate.py
(`python evaluate.py analysis=<name> [analysis.key=value ...]`, analyses/registry.py, configs/analysis/<name>.yaml),
writing JSON and figures into `output_dir`.
"""
