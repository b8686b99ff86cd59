"""Our pipeline's driver (runs in the project's own environment).

colbert_train / single_train: `RankingModule.training_step` (ColBERT; RepBERT for the single-vector ranker:
mean pooling, cosine, CE with in-batch negatives), backward, the module's own AdamW and schedule step, with the
batch tokenised inside the timed step by `PairTokenizer.triplets` (the peers tokenise inside theirs too).
encode: `RankingModule.encode_texts` (what evaluation uses). rerank: one query and its candidates through
`RankingModule.rerank_texts`.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import autocast, load_spec, time_rerank, timed, write  # noqa: E402


def build(name: str, spec: dict):
    import torch

    from lightning_modules.module import RankingModule

    torch.manual_seed(spec.get("seed", 0))
    model = dict(name=name, backbone=spec["backbone"], query_max_len=spec["query_max_len"], doc_max_len=spec["doc_max_len"],
                 **spec.get("model_overrides", {}))
    return RankingModule(model=model, optim=dict(lr=spec["lr"]))


def main() -> None:
    spec, data, out = load_spec()
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=".*self.log.*")  # training_step logs; there is no Trainer here
    from bench_speed import build_optimizer, train_step

    task, prec = spec["task"], spec["precision"]
    res = {"tool": "ours", "task": task}
    if task in ("colbert_train", "single_train"):
        module = build("colbert" if task == "colbert_train" else "repbert", spec)
        module.train()
        opt, sched, res["optimizer"] = build_optimizer(module, len(data["triplets"]))
        tok = module.pair_tokenizer
        losses = []

        def step(item):
            i, (q, pos, neg) = item
            losses.append(float(train_step(module, tok.triplets(q, pos, neg), i, opt, sched, prec)))

        res["times"], _ = timed(step, list(enumerate(data["triplets"])), spec["warmup"])
        res["units"], res["losses"] = len(data["triplets"][0][0]), losses
    elif task == "encode":
        module = build("colbert", spec).eval()
        chunks = [data["passages"]] * (spec["warmup"] + spec["repeats"])

        def enc(texts):
            with autocast(prec):
                module.encode_texts(texts, side="doc", batch_size=spec["encode_batch"])

        res["times"], _ = timed(enc, chunks, spec["warmup"])
        res["units"] = len(data["passages"])
    elif task == "rerank":
        module = build("colbert", spec).eval()

        def rr(q, cands):
            with autocast(prec):
                return module.rerank_texts(q, cands, batch_size=spec["encode_batch"])

        res.update(time_rerank(rr, data, spec))
    else:
        raise SystemExit(f"ours driver: unknown task {task!r}")
    res["threads"] = torch.get_num_threads()
    write(out, res)


if __name__ == "__main__":
    main()
