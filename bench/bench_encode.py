"""Host time per encoding batch outside the model: the pipelined encoder against the serial loop it replaced, one run.

    python -m bench.bench_encode [passages=16384] [batch_size=256] [ranker=colbert] [layers=1] [threads=1] [rounds=3]

The collection: `passages` synthetic MS MARCO passages (bench/synthetic_msmarco.py: Gamma(7, 8) words, mean 56).
The ranker: ColBERT or RepBERT on a random BERT of `layers` layers and `hidden` dims (MiniLM's tokenizer), so the
forward is cheap and what is left is the host's share of each batch: reading and tokenising its window, padding, the
copy to the host and the caller's write. The caller is the split encoding's `ShareWriter` (retrieval/split.py),
which appends each batch's ids and vectors to files, as an index's store is written.

Each round times both encoders over the whole collection (which goes first alternates; `rounds` rounds, medians):
- `serial`: `serial_windows`, the encoder as it was before the pipeline (commit d71daaf): the window tokenised in the
  loop, each batch padded row by row, the forward, a blocking `.float().cpu()`, then the caller's write;
- `pipelined`: retrieval/encode.py `encode_windows` (windows read, tokenised and padded on a background thread).
Per batch: the loop's wall time, the time inside `ranker.encode` (timed around the call; synchronous on the CPU), and
their difference, the host time outside the model. Both encoders' batches must be equal (ids and vectors, exactly).
Also the time to pad one batch's token ids, row by row (before) and by `pad_batch` (now). `device=cuda` runs both on a
GPU (`layers` / `hidden` of a real encoder, e.g. 12 / 768): there the passages/s are the figure, since the timer around
the forward sees only its launch.
TOKENIZERS_PARALLELISM=false, as the pipeline's entry scripts set it. The machine may be shared: `others_cores` is
the CPU other processes used meanwhile.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench import options
from bench.bench_speed import Meter
from bench.synthetic_msmarco import Spec, ensure, files
from core.io import write_json
from datamodules.tokenization import length_order
from models.encoding import eval_mode, pad_batch
from models.loading import pair_tokenizer_for
from models.rankers import build_ranker, ranker_config
from models.rankers.backbone import save_random_bert
from models.rankers.base import Encoded
from retrieval.encode import autocast, encode_windows, window_size, windows
from retrieval.split import ShareWriter

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def loop_pad(ids, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """models/encoding.py `pad_batch` before it was vectorised: a copy per row."""
    lens = [len(x) for x in ids]
    width = max(lens, default=0)
    inp = torch.full((len(ids), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(ids), width), dtype=torch.long)
    for r, x in enumerate(ids):
        inp[r, : lens[r]] = torch.as_tensor(x, dtype=torch.long)
        att[r, : lens[r]] = 1
    return inp, att


def serial_windows(ranker, pt, numbered, *, side, batch_size, device, precision, sort, output):
    """retrieval/encode.py `encode_windows` before the pipeline (commit d71daaf), out-of-memory halving left out:
    everything on the caller's thread, one step after the other. The reference the tests compare the pipeline with."""
    ranker_side = "doc" if side == "docs" else "query"
    for w, items in numbered:
        ids = pt.ids([t for _, t in items], ranker_side)
        order = length_order([len(x) for x in ids]) if sort else range(len(ids))
        for s in range(0, len(ids), batch_size):
            chunk = order[s : s + batch_size]
            inp, att = loop_pad([ids[i] for i in chunk], pt.tokenizer.pad_token_id)
            with torch.inference_mode(), eval_mode(ranker), autocast(device, precision):
                enc = ranker.encode(inp.to(device), att.to(device), side=ranker_side)
            keys = [items[i][0] for i in chunk]
            want = output if output != "auto" else ("sequence" if enc.sequence is not None else "tokens")
            if want == "sequence":
                yield w, keys, enc.sequence.float().cpu()
            else:
                yield w, keys, Encoded(tokens=enc.tokens.float().cpu(), mask=enc.mask.cpu())


@dataclass
class Options:
    passages: int = 16384
    batch_size: int = 256
    ranker: str = field(default="colbert", metadata={"choices": ("colbert", "repbert")})
    layers: int = 1
    hidden: int = 32
    threads: int = 1
    rounds: int = 3
    device: str = "cpu"  # cuda: wall time and passages/s only (the forward's timer would see its launch alone)
    out: Path | None = None  # a JSON of the figures; none: printed only


def _run(encoder, ranker, pt, docs: list, batch_size: int, folder: Path, device: torch.device) -> tuple[dict, str]:
    """One pass of `encoder` over `docs`, every batch written by a ShareWriter into `folder`; the figures, and a
    digest of every batch's ids and real vectors in order."""
    model_s = [0.0]
    encode = ranker.encode

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return encode(*a, **k)
        finally:
            model_s[0] += time.perf_counter() - t0

    ranker.encode = timed
    writer, digest, n = ShareWriter(folder), hashlib.sha256(), 0
    window = window_size(batch_size, None)
    try:
        with Meter() as m:
            for w, ids, out in encoder(
                ranker,
                pt,
                enumerate(windows(iter(docs), window)),
                side="docs",
                batch_size=batch_size,
                device=device,
                precision="fp32",
                sort=True,
                output="auto",
            ):
                writer.add(w, ids, out)
                rows = out.tokens[out.mask] if isinstance(out, Encoded) else out
                digest.update(json.dumps([w, ids]).encode())
                digest.update(rows.numpy().tobytes())
                n += 1
            writer.finish()
    finally:
        del ranker.encode
    return {
        "batches": n,
        "wall_s": m.wall,
        "passages_per_s": len(docs) / m.wall,
        "model_s": model_s[0],
        "outside_model_ms_per_batch": 1e3 * (m.wall - model_s[0]) / n,
        "model_ms_per_batch": 1e3 * model_s[0] / n,
        "others_cores": m.others_cores,
    }, digest.hexdigest()


def _pad_times(pt, docs: list, repeats: int) -> dict:
    """Median ms to pad one batch of `docs`' token ids: the row-by-row loop against `pad_batch`."""
    ids = pt.ids([t for _, t in docs], "doc")
    pad_id = pt.tokenizer.pad_token_id
    times: dict[str, list[float]] = {"loop_ms": [], "pad_batch_ms": []}
    for _ in range(max(5, repeats)):
        for key, pad in (("loop_ms", loop_pad), ("pad_batch_ms", pad_batch)):
            t0 = time.perf_counter()
            pad(ids, pad_id)
            times[key].append(1e3 * (time.perf_counter() - t0))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> dict:
    args = options.parse(Options, argv, __doc__)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-encode-") as tmp:
        tmp = Path(tmp)
        folder, _, _ = ensure(
            tmp / "data", Spec(passages=args.passages, val_queries=1, test_queries=1, other_queries=1)
        )
        with open(files(folder)["collection"], encoding="utf-8") as f:
            docs = [tuple(line.rstrip("\n").split("\t", 1)) for line in f]
        backbone = save_random_bert(
            tmp / "bert",
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=2,
            intermediate_size=2 * args.hidden,
        )
        torch.manual_seed(0)
        ranker = build_ranker(ranker_config({"name": args.ranker, "backbone": backbone})).eval()
        device = torch.device(args.device)
        ranker.to(device)
        pt = pair_tokenizer_for(ranker)
        encoders = {"serial": serial_windows, "pipelined": encode_windows}
        rounds: dict[str, list[dict]] = {k: [] for k in encoders}
        for r in range(args.rounds):
            digests = {}
            for name in sorted(encoders, reverse=r % 2 == 1):  # each goes first in every other round
                figures, digests[name] = _run(
                    encoders[name], ranker, pt, docs, args.batch_size, tmp / f"share-{name}", device
                )
                rounds[name].append(figures)
                print(
                    f"round {r} {name:9s}: {figures['outside_model_ms_per_batch']:7.1f} ms/batch outside the model, "
                    f"{figures['model_ms_per_batch']:6.1f} in it, {figures['wall_s']:.2f} s for {figures['batches']} "
                    f"batches, {figures['passages_per_s']:.0f} passages/s (other processes {figures['others_cores']} "
                    "cores)",
                    flush=True,
                )
            if digests["serial"] != digests["pipelined"]:
                # the CPU's kernels are deterministic: the same batches must give the same bytes
                message = "the pipelined encoder's batches differ from the serial loop's"
                if device.type == "cpu":
                    raise SystemExit(f"error: {message}")
                print(f"note: {message} (on {device.type}: float rounding of other kernels is possible)")
        pad = _pad_times(pt, docs[: args.batch_size], args.rounds)
    keys = ("outside_model_ms_per_batch", "model_ms_per_batch", "wall_s", "passages_per_s")
    median = {name: {k: statistics.median(f[k] for f in runs) for k in keys} for name, runs in rounds.items()}
    for name, m in median.items():
        print(
            f"median {name:9s}: {m['outside_model_ms_per_batch']:.1f} ms per {args.batch_size}-passage batch outside "
            f"the model ({m['model_ms_per_batch']:.1f} in it), {m['wall_s']:.2f} s in all, "
            f"{m['passages_per_s']:.0f} passages/s"
        )
    print(f"padding one batch: {pad['loop_ms']:.2f} ms row by row, {pad['pad_batch_ms']:.2f} ms by pad_batch")
    result = {
        "settings": {k: str(v) for k, v in vars(args).items()},
        "rounds": rounds,
        "median": median,
        "padding": pad,
    }
    if args.out is not None:
        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
