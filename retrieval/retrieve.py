"""Full ranking as an evaluate.py job.

`python evaluate.py retrieval=dense ckpt=PATH data=... [retrieval.key=value ...]` (keys: retrieval/config.py,
configs/retrieval/dense.yaml).

The ranker comes from `ckpt=` (or is built untrained from `model=`); its index family (`RankerCapabilities.index`)
picks the index class from the registry `retrieval.base.INDEXES` (`index_for`): `dense` (RepBERT, BERT_DOT)
`retrieval.dense.DenseIndex`, `colbert` (ColBERT) end-to-end `retrieval.colbert_e2e.ColBERTIndex`. The `retrieval`
keys are offered to every family and each takes those its `build_options` / `search_options` declare (ColBERT:
`store_dtype`, the store folder, `k_tokens`, `depth`). Writes into `output_dir`:
the index (`<output_dir>/index` unless `retrieval.index_dir`), `run.trec`, `per_query.json` and `metrics.json` (the
split's qrels, `eval.measures`, plus the retrieval settings), metrics.json last.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from lightning_fabric import Fabric
from omegaconf import DictConfig, OmegaConf

from callbacks.rank_watch import watch_for
from core.ranks import as_rank_death, stop_watching, watching
from datamodules.config import empty_split
from datamodules.sources import data_config, load_dataset
from datamodules.tokenized import TokenizedCollection
from metrics.ir import evaluate_run
from metrics.results import print_table, write_result_dir
from models.loading import load_configured
from models.rankers.backbone import tokenizer_record
from models.rankers.limits import passage_length_note
from retrieval.base import index_for, sampled_queries
from retrieval.config import DenseRetrievalConfig
from retrieval.split import drop_shares, ranks, split_encode

__all__ = ["retrieve"]


def _launch(opts: DenseRetrievalConfig) -> str | None:
    """Return the device this process encodes on.

    With `retrieval.devices` > 1 (or under `torchrun`), Lightning Fabric starts the other processes (each runs this
    command again) and the process group the split encoding needs.
    """
    if opts.devices == 1 and not _torchrun():
        return opts.device
    fabric = Fabric(accelerator=opts.accelerator, devices=opts.devices, strategy="ddp")
    fabric.launch()
    watch = watch_for(fabric.strategy)  # any rank's death ends the others with one line, until the shares are in
    if watch is not None:
        watching(watch)
    return str(fabric.device)


def _torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "TORCHELASTIC_RUN_ID" in os.environ


def retrieve(cfg: DictConfig, model_from_cli: bool = False) -> dict | None:
    """Run the job: module (checkpoint or untrained), data, index, run, metrics; return the metric means.

    `model_from_cli`: the command line picked the model, so the checkpoint's ranker must match it. With
    `retrieval.devices` > 1 the ranks share the encoding (retrieval/split.py) and only rank 0 goes on to index, search
    and write; the others return None.
    """
    opts = DenseRetrievalConfig(**OmegaConf.to_container(cfg.retrieval))
    out = Path(cfg.output_dir)
    index_dir = Path(opts.index_dir) if opts.index_dir else out / "index"
    dc = data_config(cfg)
    ds = load_dataset(dc, cfg.seed, opts.splits_read())  # before any weights: bad data stops the run at once
    split = ds.split(opts.split)
    # the re-rankers' sample (data.max_eval_queries); one of a train split is an error here, before any weights
    queries, qrels = sampled_queries(ds, opts.split, split.queries, split.qrels, dc, cfg.seed, "retrieval.split")
    if not any(g > 0 for judged in split.qrels.values() for g in judged.values()):
        raise empty_split(
            dc,
            opts.split,
            f"has no judged query to retrieve for ({len(split.queries)} queries, none with a relevant document)",
        )
    device = _launch(opts)  # after the data's checks: a bad input stops before any process starts
    parts = index_dir.parent / f".{index_dir.name}.encode-parts"
    try:  # the ranks' work together ends with the shares (rank 0 merges alone), or with this rank's own error
        loaded = load_configured(cfg, model_from_cli)
        if device:
            loaded.to(device)
        ranker, tokenizer, _ = loaded
        # the backbone's own weights (no checkpoint): a passage cut shorter than it was trained for costs effectiveness
        # (issue 49: all-MiniLM-L6-v2 at 180 of its 256 tokens, SciFact nDCG@10 0.640 -> 0.626): said once
        note = None if cfg.ckpt else passage_length_note(ranker.cfg)
        if note and ranks()[0] == 0:
            warnings.warn(note, stacklevel=1)
        index_cls = index_for(ranker)  # the registry's class for its index family; none: an error before encoding
        # tokenised once (data.pretokenize): the encoder's host then pads cached ids instead of tokenising text
        docs = TokenizedCollection.of(ds.docs, tokenizer, dc.cache_dir, dc.pretokenize)
        encoded = None
        if ranks()[1] > 1:
            # each rank encodes its share of the collection; rank 0 merges the shares and does everything after
            encoded = split_encode(
                ranker,
                tokenizer,
                docs,
                parts,
                batch_size=opts.batch_size,
                device=device,
                precision=opts.precision,
                output=index_cls.encoding,
            )
            if encoded is None:
                return None
    except BaseException as e:  # before or in the split encoding: no shares are left behind (split.py)
        if ranks()[1] > 1:
            drop_shares(parts, ranks()[0], as_rank_death(e))
        raise
    finally:
        stop_watching()
    build_offered = dict(
        pair_tokenizer=tokenizer,
        batch_size=opts.batch_size,
        device=device,
        precision=opts.precision,
        checkpoint=cfg.ckpt or None,
        encoded=encoded,
        **opts.index_options(),
        store_dtype=opts.store_dtype,
        # ColBERT's token store is written beside the index folder while building: saving links it, not copies it
        store_dir=index_dir.parent,
    )
    search_offered = dict(batch_size=opts.batch_size, k_tokens=opts.k_tokens, depth=opts.depth)
    index = index_cls.build(ranker, docs, **index_cls.options("build", build_offered))
    run = index.search(queries, k=opts.k, **index_cls.options("search", search_offered))
    means, per_query = evaluate_run(run, qrels, list(cfg.eval.measures))
    # the run's own index is one of its result files: replaced together with run.trec and metrics.json, or not at all
    write_result_dir(
        out,
        {
            **means,
            "retrieval": {
                "split": opts.split,
                "k": opts.k,
                "index": index.manifest["params"],
                "docs": len(index),
                "queries": len(run),
            },
        },
        per_query,
        run,
        tag=f"{ranker.cfg.name}-{opts.index_type}",
        config=OmegaConf.to_yaml(cfg),
        folders=None if opts.index_dir else {index_dir.name: index.save},
        versions={"tokenizer": tokenizer_record(ranker.cfg.backbone, ranker.tokenizer)},
    )
    if opts.index_dir:  # a shared index outside the run's folder, a cache keyed by what built it: saved after the
        index.save(index_dir)  # results, so a stop in between leaves the earlier results beside the earlier index
    print_table({"value": means}, title=f"{opts.split} metrics")  # the table every job prints (metrics/results.py)
    return means
