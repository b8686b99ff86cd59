"""Our pipeline's driver (runs in the project's own environment).

colbert_train / single_train: `RankingModule.training_step` (ColBERT; RepBERT for the single-vector ranker:
mean pooling, cosine, CE with in-batch negatives), backward, the module's own AdamW and schedule step, with the
batch tokenised inside the timed step by `PairTokenizer.triplets` (the peers tokenise inside theirs too).
encode: `RankingModule.encode_texts` (what evaluation uses). rerank: one query and its candidates through
`RankingModule.rerank_texts`. quality: `train_steps` ColBERT steps as colbert_train (constant lr, no warm-up, like
the peers' plain AdamW), then the evaluation path: every query and every distinct candidate passage encoded once
(`encode_texts`), each (query, candidate) pair scored by the ranker's `score_indexed` (MaxSim).
"""

from __future__ import annotations

import time
import warnings

import torch

from bench.bench_speed import build_optimizer, train_step
from bench.peers.common import autocast, load_spec, time_rerank, timed, write
from lightning_modules.module import RankingModule


def build(name: str, spec: dict):

    torch.manual_seed(spec.get("seed", 0))
    model = dict(
        name=name,
        backbone=spec["backbone"],
        query_max_len=spec["query_max_len"],
        doc_max_len=spec["doc_max_len"],
        **spec.get("model_overrides", {}),
    )
    return RankingModule(model=model, optim=dict(lr=spec["lr"], **spec.get("optim_overrides", {})))


def score_lists(module, lists: dict, prec: str, batch_size: int) -> tuple[dict, float]:
    """{qid: [score of each candidate, in the lists' order]} and the seconds it took."""
    t0 = time.perf_counter()
    pairs = [(qi, d) for qi, cands in enumerate(lists["candidates"]) for d in cands]
    iq, id_ = (torch.tensor(col, dtype=torch.long) for col in zip(*pairs))
    with torch.inference_mode(), autocast(prec):
        q = module.encode_texts(lists["queries"], side="query", batch_size=batch_size)
        d = module.encode_texts(lists["docs"], side="doc", batch_size=batch_size)
        flat = torch.cat(
            [
                module.ranker.score_indexed(q, d, iq[s : s + 512], id_[s : s + 512]).float()
                for s in range(0, len(pairs), 512)
            ]
        ).tolist()
    scores, k = {}, 0
    for qid, cands in zip(lists["qids"], lists["candidates"]):
        scores[qid], k = flat[k : k + len(cands)], k + len(cands)
    return scores, time.perf_counter() - t0


def main() -> None:
    spec, data, out = load_spec()
    from transformers.utils import logging as hf_logging  # lazy: heavy, only model building needs it

    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=".*self.log.*")  # training_step logs; there is no Trainer here
    task, prec = spec["task"], spec["precision"]
    res = {"tool": "ours", "task": task}
    if task == "quality":
        # the peers step a plain AdamW at a constant lr: ours the same (the default warm-up of 10 steps would
        # leave half of a 20-step run at a lower lr than theirs)
        spec["optim_overrides"] = dict(schedule="constant", warmup_steps=0)
        data["triplets"] = data["triplets"][: spec["train_steps"]]
    if task in ("colbert_train", "single_train", "quality"):
        module = build("repbert" if task == "single_train" else "colbert", spec)
        module.train()
        opt, sched, res["optimizer"] = build_optimizer(module, max(1, len(data["triplets"])))
        tok = module.pair_tokenizer
        losses = []

        def step(item):
            i, (q, pos, neg) = item
            losses.append(float(train_step(module, tok.triplets(q, pos, neg), i, opt, sched, prec)))

        res["times"], _ = timed(step, list(enumerate(data["triplets"])), spec["warmup"])
        res["units"], res["losses"] = len(data["triplets"][0][0]) if data["triplets"] else 0, losses
        if task == "quality":
            module.eval()
            res["scores"], res["score_s"] = score_lists(module, data["eval"], prec, spec["encode_batch"])
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
