"""The `analysis` config group: `python evaluate.py analysis=NAME [ckpt=...] [data=...] [analysis.key=value ...]`.

Each analysis registers a name, a dataclass schema (its `configs/analysis/NAME.yaml` keys, validated like every
other group) and a `run(cfg, model_from_cli) -> dict` that reads a ranker and/or data, writes its JSON and figures
into `output_dir` (analyses/outputs.py: atomically, JSON last) and logs them (numbers, W&B tables, images). Rankers
come as the plain `nn.Module`s of models/rankers, from `ckpt=` or untrained (`pipeline.run.load_module`;
`model_from_cli`: the command line picked the model, so a checkpoint's ranker must match it).

evaluate.py runs every analysis as one job of the job table (pipeline/jobs.py, job `analysis`, selected by
`analysis` other than `none`), which defers here: the analyses take the same top-level keys (`ckpt`) and their own
keys are typed by their schemas here. `compose` makes `cfg.analysis` the structured node of the analysis's schema;
`analysis_options(cfg)` returns it as that dataclass.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import ClassVar

from omegaconf import DictConfig, OmegaConf

from core.errors import InputError
from core.progress import phase
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
    # What the analysis can do: rank a val / test split's questions, and so take the re-rankers' sample of them
    # (`data.max_eval_queries`, datamodules.corpus.IRDataset.eval_sample). One that cannot refuses the key rather than
    # silently reading every question or passage.
    takes_eval_sample: ClassVar[bool] = False
    # The evaluation-time data switches (`DATA_SWITCHES`) it applies. One set that it does not apply is refused
    # (`check_analysis`) rather than give the default's numbers under a config that says otherwise.
    applies_data: ClassVar[tuple[str, ...]] = ()
    # It reads answer spans: a data source that never has them (`DataConfig.answers` False) is refused from the config.
    needs_answers: ClassVar[bool] = False
    # It reads the training triples as training builds them, so the training-only data keys
    # (datamodules.config.TRAINING_ONLY: negatives, rotate_train, ...) apply; for the others pipeline/jobs.py refuses
    # them on the command line.
    reads_training_triples: ClassVar[bool] = False
    # The `eval` keys it reads (ATS's MATS reading, the random floor's measures). The others configure the re-ranking
    # test, which an analysis does not run: set on the command line they are refused (pipeline/jobs.py).
    reads_eval: ClassVar[tuple[str, ...]] = ()

    def candidate_depth_unread(self) -> str | None:
        """Return why it does not read `data.candidate_depth` (the depth it cuts candidate lists at), None if it does.

        pipeline/jobs.py refuses the key on the command line with this reason (training triples with BM25 negatives
        read it too: the job adds that case).
        """
        return f"analysis {self.name} reads no candidate list"

    def splits_read(self) -> tuple[str, ...] | None:
        """Return the splits it reads (`load_dataset`'s `splits`; None: every split).

        Its run loads them so; the data keys of the others' files (`DataConfig.split_keys`) and, when "train" is not
        among them, the training-only data keys are refused on the command line (pipeline/jobs.py).
        """
        return None


# data keys that change what an evaluation scores, and why an analysis that reads whole documents ignores them
DATA_SWITCHES = {
    "passage_words": "it reads whole documents (cut at model.doc_max_len tokens), not passage windows (MaxP / FirstP "
    "are for re-ranking: `python evaluate.py ckpt=... data.passage_words={value}`)",
    "rotate_eval": "it reads the documents as they are, not rotation-debiased (Eq. 7)",
}


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


def analysis_options(cfg):
    """Return `cfg.analysis` as an instance of its analysis's schema (a dataclass), the schema's checks run.

    `pipeline.config.compose` types `cfg.analysis` as the structured node of that schema, so this is
    `OmegaConf.to_object`; a plain mapping (a config built by hand) is merged onto the schema first.
    """
    node = cfg.analysis
    schema = load_all().get(str(node["name"]), "analysis.name").schema
    if not (isinstance(node, DictConfig) and OmegaConf.get_type(node) is schema):
        node = OmegaConf.merge(OmegaConf.structured(schema), node)
    return OmegaConf.to_object(node)


def check_analysis(cfg) -> None:
    """Refuse data keys the analysis `cfg.analysis.name` does not apply, from the config alone.

    The `analysis` job's own check (pipeline/jobs.py), made with the job's first checks and by `--dry-run`:
    `data.max_eval_queries` for an analysis that takes no sample of a split's questions, a source without answer spans
    for one that reads them (`needs_answers`), and a `DATA_SWITCHES` key set away from its default for one that does
    not declare it in `applies_data`.
    """
    entry = load_all().get(cfg.analysis.name, "analysis.name")
    data = cfg.get("data") or {}
    sample = data.get("max_eval_queries")
    if sample is not None and not entry.schema.takes_eval_sample:
        raise InputError(
            "config key 'data.max_eval_queries'",
            f"is {sample}, but analysis {cfg.analysis.name} takes no sample of a split's questions (those that do: "
            f"{', '.join(n for n in ANALYSES.names() if ANALYSES.get(n).schema.takes_eval_sample)}); leave it null",
        )
    source = OmegaConf.get_type(data) if isinstance(data, DictConfig) else None
    if entry.schema.needs_answers and source is not None and getattr(source, "answers", None) is False:
        raise InputError(
            "config key 'data.source'",
            f"is '{data.source}', which has no answer spans, but analysis {cfg.analysis.name} reads them; use a "
            "source with answers (squad, synthetic, ir_datasets with answer strings)",
        )
    defaults = {f.name: f.default for f in dataclasses.fields(OmegaConf.get_type(data))} if data else {}
    for key, why in DATA_SWITCHES.items():
        value = data.get(key, defaults.get(key))
        if key not in defaults or value == defaults[key] or key in entry.schema.applies_data:
            continue
        shown = OmegaConf.to_yaml({"v": value}).split(": ", 1)[1].strip()
        others = [n for n in ANALYSES.names() if key in ANALYSES.get(n).schema.applies_data]
        raise InputError(
            f"config key 'data.{key}'",
            f"is {shown}, but analysis {cfg.analysis.name} does not apply it: {why.format(value=shown)}"
            f"{f' (analyses that do: {others})' if others else ''}; leave it at "
            f"{OmegaConf.to_yaml({'v': defaults[key]}).split(': ', 1)[1].strip()}",
        )


def run_analysis(cfg, model_from_cli: bool = False) -> dict:
    """Run `cfg.analysis.name`: the `analysis` job of evaluate.py (pipeline/jobs.py) when it is not `none`."""
    entry = load_all().get(cfg.analysis.name, "analysis.name")
    check_analysis(cfg)  # made by the job's checks already; a caller that skips them (a test) is checked too
    # one phase for the whole analysis (core/progress.py): its steps that take minutes (per-query statistics,
    # projections) are not silent in a log, and its encodings report their own counts inside it
    with phase(f"analysis {cfg.analysis.name}", key=f"analysis {cfg.analysis.name}"):
        return entry.build(cfg, model_from_cli)
