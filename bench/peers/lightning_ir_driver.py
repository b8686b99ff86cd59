"""Lightning IR 0.0.6 driver (runs in /work/venvs/lightning-ir; see bench/requirements-lightning-ir.txt).

colbert_train: `BiEncoderModule` with `ColConfig` (late interaction, l2-normalised token vectors: cosine, as
ours), single_train: `DprConfig` with mean pooling and cosine (RepBERT's scoring); both one optimiser step of
`training_step` on a `TrainBatch` (query, [positive, negative]) with `InBatchCrossEntropy` (in-batch negatives,
like ours), backward, AdamW step. encode: `forward(IndexBatch)` in batches. rerank: `BiEncoderModule.score` of
one query and its candidates. quality: `train_steps` colbert_train steps, then `BiEncoderModule.score` of each
query and its candidate passages (Lightning IR's re-ranking call; it encodes a passage again for every query that
lists it, so its scoring time is not comparable with the others').
"""

from __future__ import annotations

import time

import torch

from bench.peers.common import autocast, load_spec, scores_by_query, time_rerank, timed, write


def main() -> None:
    spec, data, out = load_spec()
    from lightning_ir import (
        BiEncoderModule,
        InBatchCrossEntropy,
        IndexBatch,
        TrainBatch,
    )  # lazy: exists only in the peer's environment
    from lightning_ir.models import ColConfig, DprConfig  # lazy: exists only in the peer's environment

    q_len, task, prec = spec["query_max_len"], spec["task"], spec["precision"]
    # Lightning IR pads to a multiple of 8 and refuses a truncation length that is not one: 180 -> 176, the
    # multiple below, so it never sees more tokens than the others (its figures are, if anything, flattered).
    d_len = spec["doc_max_len"] // 8 * 8
    if task == "single_train":
        config = DprConfig(
            query_length=q_len,
            doc_length=d_len,
            similarity_function="cosine",
            query_pooling_strategy="mean",
            doc_pooling_strategy="mean",
            projection=None,
        )
    else:
        config = ColConfig(query_length=q_len, doc_length=d_len, similarity_function="dot", normalization_strategy="l2")
    module = BiEncoderModule(spec["backbone"], config=config, loss_functions=[InBatchCrossEntropy()])
    res = {"tool": "lightning-ir", "task": task, "doc_max_len": d_len}
    if task == "quality":
        data["triplets"] = data["triplets"][: spec["train_steps"]]
    if task in ("colbert_train", "single_train", "quality"):
        module.train()
        opt = torch.optim.AdamW(module.parameters(), lr=spec["lr"])
        losses = []

        def step(item):
            i, (q, pos, neg) = item
            batch = TrainBatch(
                queries=q, docs=[[p, n] for p, n in zip(pos, neg)], targets=torch.tensor([[1.0, 0.0]] * len(q))
            )
            with autocast(prec):
                loss = module.training_step(batch, i)["loss"]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))

        res["times"], _ = timed(step, list(enumerate(data["triplets"])), spec["warmup"])
        res["units"], res["losses"] = len(data["triplets"][0][0]) if data["triplets"] else 0, losses
        if task == "quality":
            module.eval()
            lists, t0, per_query = data["eval"], time.perf_counter(), []
            with torch.inference_mode(), autocast(prec):
                for q, cands in zip(lists["queries"], lists["candidates"]):
                    scores = module.score(q, [lists["docs"][j] for j in cands]).scores.float().tolist()
                    per_query.append(dict(zip(cands, scores)))
            res["scores"], res["score_s"] = scores_by_query(lists, per_query), time.perf_counter() - t0
    elif task == "encode":
        module.eval()
        n, b = len(data["passages"]), spec["encode_batch"]
        chunks = [data["passages"]] * (spec["warmup"] + spec["repeats"])

        def enc(texts):
            with torch.inference_mode(), autocast(prec):
                for s in range(0, n, b):
                    module.forward(IndexBatch(doc_ids=[str(j) for j in range(s, min(n, s + b))], docs=texts[s : s + b]))

        res["times"], _ = timed(enc, chunks, spec["warmup"])
        res["units"] = n
    elif task == "rerank":
        module.eval()

        def rr(q, cands):
            with autocast(prec):
                return module.score(q, cands)

        res.update(time_rerank(rr, data, spec))
    else:
        raise SystemExit(f"lightning-ir driver: task {task!r} not supported")
    write(out, res)


if __name__ == "__main__":
    main()
