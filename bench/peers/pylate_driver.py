"""PyLate 1.6.0 driver (runs in /work/venvs/pylate; see bench/requirements-pylate.txt), on `spec["device"]` (default
the CPU; bench/bench_gpu_speed.py runs colbert_train on CUDA, each batch's features moved there as PyLate's trainer
moves them, and records when the timed steps ended, `t_end`).

colbert_train: one optimiser step as PyLate's trainer takes it: `ColBERT.tokenize(pad=True)` of queries (expanded
to query_length with [MASK], PyLate's default) and passages (padded to document_length, as its collator does),
`losses.Contrastive` (in-batch negatives over every passage of the batch, like ours), backward, and the step of the
optimiser PyLate's trainer builds by default (`trainer_optimizer`: fused AdamW from torch 2.8 on, weight decay 0; no
gradient clipping, as ours in bench_peers; bench_gpu_speed's train.py clips at 1.0). encode:
`ColBERT.encode(is_query=False)`. rerank: one query and its candidates encoded, then `rank.rerank`. quality:
`train_steps` colbert_train steps, then every query and every distinct candidate passage encoded once
(`ColBERT.encode`) and each query's candidates scored by `rank.rerank` (MaxSim).
"""

from __future__ import annotations

import time

import torch

from bench.peers.common import autocast, load_spec, scores_by_query, time_rerank, timed, write


def trainer_optimizer(model, lr: float):
    """The optimiser PyLate's trainer builds by default, and its name.

    PyLate trains through sentence-transformers' SentenceTransformerTrainer, an HF Trainer: its
    `TrainingArguments.optim` (fused AdamW from torch 2.8 on) with the arguments' betas, eps and weight decay (0).
    A plain `torch.optim.AdamW` (the loop over parameters on a CPU, weight decay 0.01) is not what a PyLate user runs.
    """
    import tempfile

    from sentence_transformers import SentenceTransformerTrainingArguments
    from transformers import Trainer

    with tempfile.TemporaryDirectory() as folder:
        args = SentenceTransformerTrainingArguments(output_dir=folder, learning_rate=lr, report_to=[])
    # HF Trainer's static method (SentenceTransformerTrainer overrides it with one that needs a built trainer)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    opt = cls([{"params": list(model.parameters()), "weight_decay": args.weight_decay}], **kwargs)
    return opt, f"{cls.__module__}.{cls.__name__}({', '.join(f'{k}={v}' for k, v in kwargs.items())}), " + (
        f"weight_decay={args.weight_decay}: SentenceTransformerTrainingArguments' optim={args.optim.value}"
    )


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
        opt, res["optimizer"] = trainer_optimizer(model, spec["lr"])
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
