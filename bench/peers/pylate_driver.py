"""PyLate 1.6.0 driver (runs in /work/venvs/pylate; see bench/requirements-pylate.txt), on `spec["device"]` (default
the CPU; bench/bench_gpu_speed.py runs colbert_train on CUDA, each batch's features moved there as PyLate's trainer
moves them, and records when the timed steps ended, `t_end`).

colbert_train: one optimiser step as PyLate's trainer takes it: `ColBERT.tokenize(pad=True)` of queries (expanded
to query_length with [MASK], PyLate's default) and passages (padded to document_length, as its collator does),
`losses.Contrastive` (in-batch negatives over every
passage of the batch, like ours), backward, AdamW step. encode: `ColBERT.encode(is_query=False)`. rerank: one
query and its candidates encoded, then `rank.rerank`. quality: `train_steps` colbert_train steps, then every query
and every distinct candidate passage encoded once (`ColBERT.encode`) and each query's candidates scored by
`rank.rerank` (MaxSim).
"""

from __future__ import annotations

import time

import torch

from bench.peers.common import autocast, load_spec, scores_by_query, time_rerank, timed, write


def main() -> None:
    spec, data, out = load_spec()
    from pylate import losses, models, rank  # lazy: exists only in the peer's environment

    q_len, d_len = spec["query_max_len"], spec["doc_max_len"]
    device = spec.get("device", "cpu")
    model = models.ColBERT(spec["backbone"], query_length=q_len, document_length=d_len, device=device)
    task, prec, res = spec["task"], spec["precision"], {"tool": "pylate", "task": spec["task"]}
    if task == "quality":
        data["triplets"] = data["triplets"][: spec["train_steps"]]
    if task in ("colbert_train", "quality"):
        model.train()
        loss_fn = losses.Contrastive(model)
        opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"])
        losses_seen = []

        def step(batch):
            q, pos, neg = batch
            # as PyLate's ColBERTCollator tokenises a training batch: pad=True (to query/document_length)
            feats = [
                {k: v.to(device) for k, v in model.tokenize(t, is_query=side == "q", pad=True).items()}
                for side, t in (("q", q), ("d", pos), ("d", neg))
            ]
            with autocast(prec, device):
                loss = loss_fn(feats)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses_seen.append(float(loss))

        res["times"], _ = timed(step, data["triplets"], spec["warmup"])
        res["t_end"] = time.time()  # each step reads its loss back (float), so the timed steps are complete here
        res["units"], res["losses"] = len(data["triplets"][0][0]) if data["triplets"] else 0, losses_seen
        if task == "quality":
            model.eval()
            lists, t0 = data["eval"], time.perf_counter()
            with torch.inference_mode(), autocast(prec):
                qe = model.encode(
                    lists["queries"], is_query=True, batch_size=spec["encode_batch"], show_progress_bar=False
                )
                de = model.encode(
                    lists["docs"], is_query=False, batch_size=spec["encode_batch"], show_progress_bar=False
                )
                ranked = rank.rerank(
                    documents_ids=lists["candidates"],
                    queries_embeddings=qe,
                    documents_embeddings=[[de[j] for j in c] for c in lists["candidates"]],
                )
            # rerank returns each list sorted by score: back to {candidate index: score}
            res["scores"] = scores_by_query(lists, [{r["id"]: r["score"] for r in rs} for rs in ranked])
            res["score_s"] = time.perf_counter() - t0
    elif task == "encode":
        model.eval()
        chunks = [data["passages"]] * (spec["warmup"] + spec["repeats"])

        def enc(texts):
            with autocast(prec):
                model.encode(texts, is_query=False, batch_size=spec["encode_batch"], show_progress_bar=False)

        res["times"], _ = timed(enc, chunks, spec["warmup"])
        res["units"] = len(data["passages"])
    elif task == "rerank":
        model.eval()

        def rr(q, cands):
            with autocast(prec):
                qe = model.encode([q], is_query=True, show_progress_bar=False)
                de = model.encode(cands, is_query=False, batch_size=spec["encode_batch"], show_progress_bar=False)
            return rank.rerank(
                documents_ids=[list(range(len(cands)))], queries_embeddings=qe, documents_embeddings=[de]
            )

        res.update(time_rerank(rr, data, spec))
    else:
        raise SystemExit(f"pylate driver: task {task!r} not supported")
    write(out, res)


if __name__ == "__main__":
    main()
