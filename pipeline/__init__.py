"""Shared plumbing: config composition, registries, atomic I/O, and the fit/evaluate orchestration.

This is what `train.py` and `evaluate.py` call. Nothing model- or data-specific lives here.
"""
