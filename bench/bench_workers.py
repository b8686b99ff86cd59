"""The main thread's time per training batch received from DataLoader workers: shipped as NumPy arrays (now) against
PyTorch's shared-memory tensors (before), and the time to make the batch in the process.

    python -m bench.bench_workers [batches=32,256] [workers=2] [n=60] [pause_ms=30] [record_dir=results]

Each way iterates `RankingDataModule.train_dataloader()` of bench_host's configuration (synthetic MS MARCO-shaped
files, ColBERT's tokenizer, `data.pretokenize` on, fp32, a random 1-layer BERT that never runs) and times each
`next()` on the main thread, `n` batches after 10, with a pause of `pause_ms` between batches (a model step's time,
in which workers prepare the next batches, so that what is timed is the hand-over, not the workers' pace):
- `in process`: `data.num_workers=0`, the batch made on the main thread;
- `workers, tensors`: `workers` workers, the batch's tensors sent as PyTorch sends them (a shared-memory file
  descriptor per tensor, fetched from the worker over a socket): datamodules/guarded.py's shipping turned off;
- `workers, shipped`: the same workers, the batch sent as a `ShippedBatch` (its tensors as NumPy arrays).
Pinned memory is off (no GPU here): on a GPU machine the pin-memory thread receives the batch instead of the main
thread. Medians and means per batch; other processes' CPU is recorded (bench_speed.Meter).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
import time
from pathlib import Path

import torch

from bench import options, record
from bench.bench_gpu_speed import prepare_data
from bench.bench_host import TINY_BERT, build, compose_cfg
from bench.bench_host import Options as HostOptions
from bench.bench_scale import parse_list
from bench.bench_speed import Meter, machine_info

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ["batch", "how", "median_ms", "mean_ms", "others_cores"]


@dataclasses.dataclass
class Options:
    batches: str = "32,256"
    workers: int = 2
    n: int = 60
    pause_ms: float = 30.0
    passages: int = 20_000
    seed: int = 0
    work_dir: str = "outputs/bench-workers"
    record_dir: str | None = None  # null: results/


def receive_times(dm, n: int, pause_s: float) -> list[float]:
    """Seconds of each of `n` `next()` calls on the training loader, after 10, with `pause_s` between them."""
    it = iter(dm.train_dataloader())
    for _ in itertools.islice(it, 10):
        pass
    out = []
    for _ in range(n):
        t = time.perf_counter()
        batch = next(it)
        out.append(time.perf_counter() - t)
        assert isinstance(batch["d_input_ids"], torch.Tensor)
        time.sleep(pause_s)
    return out


def measure(cfg, workers: int, ship: bool, opts: Options) -> tuple[list[float], float | None]:
    from datamodules import guarded

    cfg.data.num_workers = workers
    dm, _ = build(cfg)
    real = guarded._ShippingCollate.__call__
    if not ship:  # before: the worker hands back the batch as it is (tensors as PyTorch sends them)
        guarded._ShippingCollate.__call__ = lambda self, items: self.collate(items)
    try:
        with Meter() as meter:
            times = receive_times(dm, opts.n, opts.pause_ms / 1000)
    finally:
        guarded._ShippingCollate.__call__ = real
    return times, meter.others_cores


def main(argv: list[str] | None = None) -> dict:
    opts = options.parse(Options, argv, __doc__)
    batches = [int(b) for b in parse_list(opts.batches, "batches") if b.isdigit()]
    if not batches or opts.workers < 1 or opts.n < 2:
        options.error("batches must be whole numbers, workers >= 1 and n >= 2")
    started, t_start = record.utc_now(), time.time()
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    from models.rankers.backbone import save_random_bert

    hf_logging.set_verbosity_error()
    work = Path(opts.work_dir)
    work = (work if work.is_absolute() else REPO / work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = prepare_data(work, opts.passages, opts.seed, 20, 10)
    backbone = work / "tiny-bert"
    if not (backbone / "config.json").exists():
        save_random_bert(backbone, seed=opts.seed, tokenizer="minilm", **TINY_BERT)
    rows = []
    for batch in batches:
        cfg = compose_cfg(HostOptions(seed=opts.seed), data, work, str(backbone), batch, True)
        for how, workers, ship in (
            ("in process", 0, True),
            ("workers, tensors (before)", opts.workers, False),
            ("workers, shipped (now)", opts.workers, True),
        ):
            times, others = measure(cfg, workers, ship, opts)
            row = dict(
                batch=batch,
                how=how,
                median_ms=round(1e3 * statistics.median(times), 3),
                mean_ms=round(1e3 * statistics.fmean(times), 3),
                others_cores=others,
            )
            rows.append(row)
            print(f"b{batch} {how}: median {row['median_ms']} ms, mean {row['mean_ms']} ms", flush=True)
    wall = time.time() - t_start
    info = machine_info(1)
    columns = [
        ("batch", "batch"),
        ("how", "how the batch reaches the main thread"),
        ("median_ms", "median ms"),
        ("mean_ms", "mean ms"),
        ("others_cores", "others' cores"),
    ]
    body = [
        "## Main thread's time per training batch",
        "",
        record.markdown_table(rows, columns),
        "",
        "## How it is measured",
        "",
        __doc__.split("\n\n", 2)[2].strip(),
    ]
    facts = [
        ("Date", f"{started.date().isoformat()}, {started:%H:%M}-{record.utc_now():%H:%M} UTC"),
        ("Command", f"`{record.relative(record.command_line('bench.bench_workers', argv))}`"),
        ("Commit", record.git_commit()),
        (
            "Machine",
            f"{info['cpu_model']}, {info['logical_cpus']} logical CPUs; torch {info['torch']}, "
            f"Python {info['python']}; no GPU used",
        ),
        (
            "Settings",
            f"{opts.workers} workers, {opts.n} batches after 10, {opts.pause_ms:g} ms between batches, "
            f"{data['passages']:,} synthetic passages, data.pretokenize on",
        ),
        ("Wall time", f"{wall:.0f} s"),
    ]
    md, tsv = record.write_record(
        Path(opts.record_dir) if opts.record_dir else record.RESULTS,
        "worker-batches",
        "Training batches from DataLoader workers: the main thread's time per batch (bench_workers)",
        facts,
        "\n".join(body),
        rows,
        COLUMNS,
        started,
    )
    print(f"\n{wall:.0f} s; record {md} + {tsv.name}")
    return {"rows": rows, "record": [str(md), str(tsv)]}


if __name__ == "__main__":
    main()
