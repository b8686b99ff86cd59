"""The `analysis` config group: `python evaluate.py analysis=NAME [ckpt=...] [data=...] [analysis.key=value ...]`.

Each analysis registers a name, a dataclass schema (its `configs/analysis/NAME.yaml` keys, validated like every
other group) and a `run(cfg, model_from_cli) -> dict` that reads a ranker and/or data, writes its JSON and figures
into `output_dir` (analyses/outputs.py: atomically, JSON last) and logs them (numbers, W&B tables, images). Rankers
come as the plain `nn.Module`s of models/rankers, from `ckpt=` or untrained (`pipeline.run.load_module`;
`model_from_cli`: the command line picked the model, so a checkpoint's ranker must match it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from core.registry import Registry

ANALYSES: Registry = Registry("analysis")

# Modules that register analyses; imported on first use so that train.py does not pay for them.
MODULES = (
    "analyses.answer_positions",
    "analyses.whitebox.analysis",
    "analyses.ats",
    "analyses.vocab.analysis",
    "analyses.vocab.lexical_enrichment",
    "analyses.vocab.fit_mlm_head",
    "analyses.random_rerank",
)


@dataclass
class AnalysisConfig:
    """Keys every analysis has (`configs/analysis/*.yaml`); each analysis extends it with its own."""

    name: str = "none"


ANALYSES.register("none", schema=AnalysisConfig)(lambda cfg, model_from_cli=False: None)
_loaded = False


def load_all() -> Registry:
    """Import every module in `MODULES` once, so that all analyses are registered, and return the registry.

    The import is deferred to first use so that train.py does not pay for the analyses' dependencies.
    """
    global _loaded
    if not _loaded:
        for m in MODULES:
            importlib.import_module(m)
        _loaded = True
    return ANALYSES


def run_analysis(cfg, model_from_cli: bool = False) -> dict:
    """Run `cfg.analysis.name` (evaluate.py dispatches here when it is not `none`)."""
    entry = load_all().get(cfg.analysis.name, "analysis.name")
    return entry.build(cfg, model_from_cli)
