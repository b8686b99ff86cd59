"""Post-hoc head training speed: flow epochs from the on-disk representation cache vs re-encoding every epoch.

    python -m bench.bench_heads [head=glow] [backbone=minilm|bert-base-shape|HF id or dir] [paragraphs=150]
                                [questions=300] [epochs=3] [precision=bf16] [batch_size=1024] [threads=2]
                                [out=bench/results/heads.json]

The isotropy paper's code stacks the flow on the frozen BERT and re-encodes the training texts in every flow
epoch; `train.py stage=head` encodes them once into `models/heads/cache.py`'s memory-mapped cache and
trains from it. Both arms here train the same head (same config, seed, batch size and learning rate) on the token
vectors of the same SQuAD paragraphs and questions (../shared/data), with the frozen ColBERT's backbone
(`backbone`): all-MiniLM-L6-v2 (6 layers, 384 dims; ours), or `bert-base-shape`, the paper's BERT-base
architecture (12 layers, 768 dims) with random weights and the same uncased vocabulary, built offline from its config:
its encoding costs what bert-base-uncased costs, which is what the ratio depends on (the likelihoods are then of
random-BERT vectors, compared between the arms only):

- cached: build the cache once (timed on its own), then each epoch reads shuffled batches from the memmap;
- re-encode: each epoch encodes the texts (inference_mode, same precision) and trains on the vectors as they come.

The arms alternate epoch by epoch (cached, in RAM, re-encode, cached, ...), so load from other processes falls on
all of them alike.

Printed: seconds per epoch of each arm (median over epochs), their ratio, the same epochs from vectors already in
RAM (the flow's own cost: no cache can beat it, so re-encode / in-RAM bounds the attainable ratio), the one-off cache
build, and the mean negative log-likelihood of both trained heads on held-out token vectors (other paragraphs), so the
speed-up is shown not to cost likelihood. The CPU may be shared: each timing records what other processes used
meanwhile.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench import options
from bench.bench_retrieval import machine
from bench.bench_speed import Meter
from core.io import write_json
from lightning_modules.module import RankingModule
from models.heads import build_head
from models.heads.cache import RepresentationCache, _vectors
from models.heads.flows import GlowConfig, NICEConfig
from models.rankers.backbone import save_random_bert

REPO = Path(__file__).resolve().parents[1]
SQUAD = REPO.parent / "shared" / "data" / "squad_v1.1_dev" / "dev-v1.1.json.gz"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Options:
    head: str = field(default="glow", metadata={"choices": ("glow", "nice")})
    backbone: str = "minilm"  # minilm | bert-base-shape | an HF id or local model dir
    paragraphs: int = 150
    questions: int = 300
    heldout_paragraphs: int = 30
    epochs: int = 3
    batch_size: int = 1024
    lr: float = 1e-4
    encode_batch: int = 32
    # encoding and flow-training precision, both arms
    precision: str = field(default="fp32", metadata={"choices": ("fp32", "bf16")})
    threads: int = 2
    seed: int = 0
    out: str = field(default_factory=lambda: str(REPO / "bench" / "results" / "heads.json"))


def squad_texts(n_par: int, n_q: int, skip: int = 0) -> tuple[list[str], list[str]]:
    with gzip.open(SQUAD, "rt", encoding="utf-8") as f:
        data = json.load(f)["data"]
    pars = [p for art in data for p in art["paragraphs"]][skip : skip + n_par]
    questions = [qa["question"] for p in pars for qa in p["qas"]][:n_q]
    return questions, [p["context"] for p in pars]


def bert_base_shape(folder: Path) -> str:
    """BERT-base (bert-base-uncased's config: 12 layers, 768 dims, 12 heads) with seeded random weights and MiniLM's
    uncased 30,522-token tokenizer, saved to `folder`: the paper's backbone cost without a hub download."""
    return save_random_bert(folder)


def batches(n: int, size: int, seed: int, epoch: int):
    order = np.random.default_rng([seed, epoch]).permutation(n)
    for s in range(0, n, size):
        yield order[s : s + size]


def train_step(head, opt, x: torch.Tensor, autocast=None) -> float:
    # bf16: the flow trains under autocast too, as `train.py stage=head trainer.precision=bf16-mixed` does
    with autocast() if autocast else contextlib.nullcontext():
        loss = head.nll(x.float()).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def main(argv=None) -> dict:
    a = options.parse(Options, argv, __doc__)
    torch.set_num_threads(a.threads)

    scratch = tempfile.TemporaryDirectory()
    backbone = bert_base_shape(Path(scratch.name)) if a.backbone == "bert-base-shape" else a.backbone
    module = RankingModule(
        {"name": "colbert", "backbone": backbone, "query_max_len": 32, "doc_max_len": 180}, {}
    ).eval()
    scratch.cleanup()  # loaded: the weights are in memory
    ranker, tok = module.ranker, module.pair_tokenizer
    for p in ranker.parameters():
        p.requires_grad = False
    questions, paragraphs = squad_texts(a.paragraphs, a.questions)
    held_q, held_p = squad_texts(a.heldout_paragraphs, 0, skip=a.paragraphs)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" else None  # noqa: E731
    cfg = (GlowConfig if a.head == "glow" else NICEConfig)(lr=a.lr, batch_size=a.batch_size)

    def new_head(init: np.ndarray):
        torch.manual_seed(a.seed)
        head = build_head(cfg, ranker.hidden_size)
        head.init_from(torch.from_numpy(np.asarray(init, dtype=np.float32)))
        return head, torch.optim.Adam(head.parameters(), lr=a.lr, fused=True)  # as HeadModule's optimizer

    with tempfile.TemporaryDirectory() as tmp:
        with Meter() as m_cache:
            cache = RepresentationCache.build(
                Path(tmp) / "c",
                ranker,
                tok,
                questions,
                paragraphs,
                dtype="float16",
                autocast=autocast,
                batch_size=a.encode_batch,
            )
        vectors = cache.vectors()
        held = RepresentationCache.build(
            Path(tmp) / "h", ranker, tok, held_q, held_p, dtype="float32", autocast=autocast, batch_size=a.encode_batch
        )
        held_x = torch.from_numpy(np.array(held.vectors()))
        sample = vectors[np.sort(np.random.default_rng([a.seed, 5]).permutation(len(vectors))[:65536])]
        print(
            f"cache: {cache.count} token vectors x {cache.dim} ({cache.count * cache.dim * 2 / 2**20:.1f} MiB fp16), "
            f"built in {m_cache.wall:.1f} s; held-out {held.count} vectors",
            flush=True,
        )

        # The three arms train side by side, one epoch of each in turn (A B C A B C ...), so that a change in what
        # else runs on the machine falls on all of them alike.

        head_c, opt_c = new_head(sample)  # arm 1: from the cache
        head_m, opt_m = new_head(sample)  # the bound: the same batches from a float32 tensor already in RAM
        head_r, opt_r = new_head(sample)  # arm 2: re-encode every epoch, as the paper's code does
        in_ram = torch.from_numpy(np.asarray(vectors, dtype=np.float32))
        cached_s, cached_others, ram_s, reenc_s, reenc_others = [], [], [], [], []
        texts = [(t, "q") for t in questions] + [(t, "d") for t in paragraphs]
        for epoch in range(a.epochs):
            with Meter() as m:
                for rows in batches(len(vectors), a.batch_size, a.seed, epoch):
                    train_step(
                        head_c, opt_c, torch.from_numpy(np.asarray(vectors[np.sort(rows)], dtype=np.float32)), autocast
                    )
            cached_s.append(m.wall)
            cached_others.append(m.others_cores)
            print(f"  cached    epoch {epoch + 1}: {m.wall:.2f} s (others {m.others_cores} cores)", flush=True)

            with Meter() as m:
                for rows in batches(len(vectors), a.batch_size, a.seed, epoch):
                    train_step(head_m, opt_m, in_ram[torch.from_numpy(np.sort(rows))], autocast)
            ram_s.append(m.wall)
            print(f"  in RAM    epoch {epoch + 1}: {m.wall:.2f} s (others {m.others_cores} cores)", flush=True)

            with Meter() as m:
                buf: list[torch.Tensor] = []
                order = np.random.default_rng([a.seed, epoch]).permutation(len(texts))
                for s in range(0, len(texts), a.encode_batch):
                    idx = order[s : s + a.encode_batch]
                    for kind, side, name in (("q", tok.queries, "query"), ("d", tok.docs, "doc")):
                        chunk = [texts[i][0] for i in idx if texts[i][1] == kind]
                        if not chunk:
                            continue
                        ids, mask = side(chunk).values()  # {q_|d_}input_ids, {q_|d_}attention_mask
                        with torch.inference_mode(), autocast() if autocast else torch.autocast("cpu", enabled=False):
                            rows = _vectors(ranker, ids, mask, name, "token")["rows"]
                        buf.append(rows.float().clone())
                    pending = torch.cat(buf)
                    while len(pending) >= a.batch_size:
                        train_step(head_r, opt_r, pending[: a.batch_size], autocast)
                        pending = pending[a.batch_size :]
                    buf = [pending]
                if len(buf[0]):
                    train_step(head_r, opt_r, buf[0], autocast)
            reenc_s.append(m.wall)
            reenc_others.append(m.others_cores)
            print(f"  re-encode epoch {epoch + 1}: {m.wall:.2f} s (others {m.others_cores} cores)", flush=True)
        del in_ram

        with torch.no_grad():
            nll_c, nll_r = float(head_c.nll(held_x).mean()), float(head_r.nll(held_x).mean())
        with torch.no_grad():
            head0, _ = new_head(sample)
            nll_0 = float(head0.nll(held_x).mean())

    med_c, med_r, med_m = statistics.median(cached_s), statistics.median(reenc_s), statistics.median(ram_s)
    result = {
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "args": vars(a),
        "machine": machine(),
        "cache_vectors": cache.count,
        "cache_build_s": m_cache.wall,
        "cached_epoch_s": cached_s,
        "reencode_epoch_s": reenc_s,
        "in_ram_epoch_s": ram_s,
        "bound_speedup": med_r / med_m,
        "others_cores": {"cached": cached_others, "reencode": reenc_others},
        "speedup_per_epoch": med_r / med_c,
        "speedup_fastest_epoch": min(reenc_s) / min(cached_s),
        "heldout_nll": {"untrained": nll_0, "cached": nll_c, "reencode": nll_r},
    }
    table = (
        f"| {a.head} on {a.backbone} ({ranker.hidden_size} dims), {cache.count} token vectors, {a.epochs} epochs, "
        f"{a.precision} encoding | s / epoch | held-out NLL after training |\n"
        f"|---|---|---|\n"
        f"| re-encode every epoch (paper's code) | {med_r:.2f} | {nll_r:.1f} |\n"
        f"| from the cache (stage=head) | {med_c:.2f} | {nll_c:.1f} |\n"
        f"| ratio | {med_r / med_c:.1f}x | untrained head: {nll_0:.1f} |\n"
        # the fastest epoch of each arm is the estimate least touched by other processes on a shared machine
        f"| ratio of the fastest epochs | {min(reenc_s) / min(cached_s):.1f}x | |\n"
        f"| flow alone, vectors already in RAM (the bound on any cache) | {med_m:.2f} | "
        f"ratio bound {med_r / med_m:.1f}x |\n"
        f"\none-off cache build: {m_cache.wall:.1f} s"
    )
    result["table_markdown"] = table
    print("\n" + table)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, result)
    print(f"JSON -> {a.out}")
    return result


if __name__ == "__main__":
    main()
