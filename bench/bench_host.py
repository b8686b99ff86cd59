"""Host cost per batch, no GPU: the time a batch spends outside the model (reading, tokenising, collating, moving,
Lightning's loop, logging) for training, re-ranking and encoding, at batch 32 and 256 (issue 47, item 7).

    python -m bench.bench_host [batches=32,256] [n=20] [warmup=3] [passages=20000] [pretokenize=both]
                               [model=colbert] [threads=null] [record_dir=results] [work_dir=outputs/bench-host]

The model is a seeded random 1-layer BERT (hidden 32, 2 heads, FFN 64; the all-MiniLM-L6-v2 tokenizer and its
30,522-word vocabulary), so that what the model costs is small and measured apart. Data: a synthetic MS MARCO-shaped
collection (bench/synthetic_msmarco.py; `passages` passages, given id triples) in the `data=tsv` layout, the test
split's candidates a given run (bench_gpu_speed.prepare_data: `test_queries` queries, enough candidates each for
`warmup + n` chunks of the largest batch). Everything goes through the project's own objects: the config composed as
train.py composes it (pipeline.config.compose), the data module as train.py reads it (pipeline.stages.load_data),
`RankingModule`, the trainer with the pipeline's callbacks (pipeline.stages.build_trainer; logger none, progress bar
off, the isotropy protocol and ATS off), on the CPU in fp32, `data.num_workers=0` (so every batch's host work is on
the measured thread).

Measured per batch size and `data.pretokenize` setting (mean over `n` batches after `warmup`):
- `train loader`: `RankingDataModule.train_dataloader()` iterated: reading the triples' texts, tokenising, collating
  (TripletDataset, TripletCollate). No model runs, so all of it is host cost.
- `train fit`: `trainer.fit` of `warmup + n` steps (time between the ends of consecutive training batches, a
  callback) minus the model's time per step: the module's `training_step`, backward and the AdamW + schedule step
  (bench_speed.train_step) on already collated batches of the same loader, timed apart. Host = the data loader,
  Lightning's loop, moving the batch, `self.log`, gradient clipping and the non-finite checks. The loss scores each
  triple's own negative only (`optim.in_batch_negatives=false`): ColBERT's MaxSim of every query against all 2 x 256
  passages of a batch takes seconds on a CPU at any BERT size and would bury the host cost in the model's noise
  (measured: 18.7 s of model per 17.0 s step at batch 256); the host's work per batch does not depend on the loss.
- `rerank loader`: `test_dataloader()` iterated: chunks of `batch` distinct candidate passages tokenised
  (DocChunkDataset; cross-encoders: (query, passage) pairs, PairCollate).
- `rerank test`: `trainer.test` limited to `warmup + n` batches (a callback's batch ends) minus the model's time:
  the chunk's passages encoded (`ranker.encode_docs`) and scored against the split's queries
  (`RankingModule.score_chunk`), timed apart on the same chunks.
- `encode`: `retrieval.encode.encode_docs` (the index builders' path) over the collection's passages in batches of
  `batch` (bi-encoders), time between yielded batches, minus `ranker.encode` of the same length-sorted padded
  batches (models.encoding.pad_batch) timed apart. Host = tokenising, sorting, padding, copying the vectors out.
- `encode host`: the same `encode_docs` with `ranker.encode` replaced by a stub that returns zeros at once: the time
  per batch is the encoder's host work alone (reading, tokenising or gathering, sorting, padding, handing over), with
  no difference of two timings (the `encode` row's host is one, noisy where the model's time is large).

`pretokenize`: `data.pretokenize` (true: batches gathered from token ids cached on disk; false: tokenising each
batch's text) is measured `off` and `on` in the same run when the config has the key (the tsv source's schema
fields); `both` measures what exists ("before" = off, "after" = on, and their ratio), `on` without the key is an
error. `encode` with `on` feeds the collection tokenised once (datamodules/tokenized.py TokenizedCollection, what
evaluate.py's full ranking encodes then), built before the timing as a cache is.

Per batch: the mean over the timed batches (and the model's mean time), so that work done once per several batches
counts (retrieval/encode.py tokenises a window of 8 batches at once; a median would drop it). One torch thread by
default (`threads`): with `data.num_workers=0` the host work is serial anyway, and on a machine whose cores other
processes also use, multi-threaded OpenMP regions wait for descheduled threads (a 1-layer step measured 10-20x
slower with 2 threads than with 1 on this project's shared 2-core CPU). Other processes' CPU during each measurement
is recorded (`others_cores`, bench_speed.Meter): on a shared machine a contended figure can be recognised. The
record: `<record_dir>/<date>-host-cost.md` + `.tsv` (default results/).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pytorch_lightning import Callback

from bench import options, record
from bench.bench_gpu_speed import data_args, prepare_data
from bench.bench_scale import parse_list
from bench.bench_speed import Meter, build_optimizer, machine_info, train_step

REPO = Path(__file__).resolve().parents[1]
TINY_BERT = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64)
PATHS = ("train loader", "train fit", "rerank loader", "rerank test", "encode", "encode host")


@dataclass
class Options:
    batches: str = "32,256"
    n: int = 20  # timed batches per measurement
    warmup: int = 3
    passages: int = 20_000
    test_queries: int = 60
    pretokenize: str = dataclasses.field(default="both", metadata={"choices": ("both", "on", "off")})
    model: str = dataclasses.field(default="colbert", metadata={"choices": ("colbert", "repbert", "bert_cat")})
    threads: int = 1  # torch threads (see the module docstring)
    seed: int = 0
    work_dir: str = "outputs/bench-host"
    data_dir: str | None = None  # null: <work_dir>/data
    record_dir: str | None = None  # null: results/


def pretokenize_exists() -> bool:
    """Whether this code's data config has `data.pretokenize` (the tsv source's schema, DataConfig's fields with it)."""
    from datamodules.sources import SOURCES

    return "pretokenize" in {f.name for f in dataclasses.fields(SOURCES.get("tsv", "data.source").schema)}


def settings(choice: str, exists: bool) -> list[bool | None]:
    """The `data.pretokenize` values to measure: None = the key is absent (today's per-batch tokenisation)."""
    if not exists:
        if choice == "on":
            options.error("pretokenize=on: this code's data config has no key data.pretokenize")
        return [None]
    return {"both": [False, True], "on": [True], "off": [False]}[choice]


class BatchEnds(Callback):
    """time.perf_counter() at the end of every training and test batch."""

    def __init__(self):
        self.times: list[float] = []

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.times.append(time.perf_counter())

    def on_test_batch_end(self, *args, **kwargs) -> None:
        self.times.append(time.perf_counter())


def label(setting: bool | None) -> str:
    return "absent" if setting is None else ("on" if setting else "off")


def per_batch(times: list[float], warmup: int) -> float | None:
    """Mean seconds per batch over the batches after the first `warmup` (times: batch ends)."""
    t = times[warmup - 1 :] if warmup >= 1 else times
    return (t[-1] - t[0]) / (len(t) - 1) if len(t) >= 2 else None


def timed_iter(iterable, count: int) -> list[float]:
    """time.perf_counter() before the first item and after each of `count` items of `iterable`."""
    times = [time.perf_counter()]
    for _ in itertools.islice(iter(iterable), count):
        times.append(time.perf_counter())
    return times


def compose_cfg(opts: Options, data: dict, work: Path, backbone: str, batch: int, pretokenize: bool | None):
    from pipeline.config import compose

    args = [
        f"model={opts.model}",
        f"model.backbone={backbone}",
        *data_args(data, work / "cache", train=True),
        f"data.batch_size={batch}",
        f"data.eval_batch_size={batch}",
        "data.num_workers=0",
        f"data.max_eval_queries={opts.test_queries}",
        "trainer.accelerator=cpu",
        "trainer.precision=32-true",
        f"trainer.max_steps={opts.warmup + opts.n}",
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false",
        "eval.before_training=false",
        "eval.isotropy_paper=false",
        "eval.ats_passages=0",
        "optim.in_batch_negatives=false",
        "logger=none",
        f"seed={opts.seed}",
        f"output_dir={work / 'runs' / f'b{batch}'}",
    ]
    if pretokenize is not None:
        args.append(f"data.pretokenize={str(pretokenize).lower()}")
    return compose(args)


def build(cfg):
    """The data module (read as train.py reads it) and a fresh module wired to it."""
    from omegaconf import OmegaConf

    from lightning_modules.module import RankingModule
    from pipeline.stages import load_data

    dm = load_data(cfg, fit=True)
    torch.manual_seed(int(cfg.seed))
    module = RankingModule(
        OmegaConf.to_container(cfg.model), OmegaConf.to_container(cfg.optim), list(cfg.eval.measures)
    )
    dm.tokenizer = module.pair_tokenizer
    return dm, module


def measure(rows: list, path: str, batch: int, setting: str, fn) -> dict:
    """Run fn() -> (seconds per batch, model seconds per batch or None, examples per batch) under a Meter; add its
    row (`setting`: the data.pretokenize label) to `rows`."""
    with Meter() as meter:
        total, model, examples = fn()
    host = None if total is None else total - (model or 0.0)
    row = {
        "path": path,
        "batch": batch,
        "pretokenize": setting,
        "batch_ms": None if total is None else round(1e3 * total, 3),
        "model_ms": None if model is None else round(1e3 * model, 3),
        "host_ms": None if host is None else round(1e3 * host, 3),
        "host_us_per_example": None if host is None else round(1e6 * host / examples, 2),
        "examples_per_batch": examples,
        "others_cores": meter.others_cores,
    }
    rows.append(row)
    print(
        f"  {path:14s} b{batch:<4d} pretokenize={row['pretokenize']:6s} batch {record.cell(row['batch_ms'])} ms, "
        f"model {record.cell(row['model_ms'])} ms, host {record.cell(row['host_ms'])} ms "
        f"(others {record.cell(meter.others_cores)} cores)",
        flush=True,
    )
    return row


def loader_row(rows, path: str, batch: int, setting, opts: Options, loader) -> None:
    """A loader iterated for warmup + n batches with no model: all of its time per batch is host cost."""

    def run():
        times = timed_iter(loader(), opts.warmup + opts.n)
        return per_batch(times[1:], opts.warmup), None, batch

    measure(rows, path, batch, label(setting), run)


def lightning_row(rows, path: str, batch: int, setting, opts: Options, cfg, loader, model_step, run) -> None:
    """Lightning's time per batch (`run(trainer)`: a fit or test of warmup + n batches, the pipeline's trainer) and
    the model's (`model_step(i, batch)` on warmup + n batches of `loader()`, collated beforehand), each a mean after
    the warm-up."""

    def go():
        from pipeline.stages import build_trainer

        batches = list(itertools.islice(iter(loader()), opts.warmup + opts.n))
        steps = []
        for i, b in enumerate(batches):
            t0 = time.perf_counter()
            model_step(i, b)
            steps.append(time.perf_counter() - t0)
        ends = BatchEnds()
        trainer = build_trainer(cfg, None, checkpoints=False)
        trainer.callbacks.append(ends)
        run(trainer)
        return per_batch(ends.times, opts.warmup), float(np.mean(steps[opts.warmup :])), batch

    measure(rows, path, batch, label(setting), go)


def train_paths(rows, opts: Options, cfg, batch: int, setting) -> None:
    dm, module = build(cfg)
    loader_row(rows, "train loader", batch, setting, opts, dm.train_dataloader)
    module.train()
    opt, sched, _ = build_optimizer(module, opts.warmup + opts.n)
    lightning_row(
        rows,
        "train fit",
        batch,
        setting,
        opts,
        cfg,
        dm.train_dataloader,
        lambda i, b: train_step(module, b, i, opt, sched, "fp32"),
        lambda trainer: trainer.fit(module, datamodule=dm),
    )


def rerank_paths(rows, opts: Options, cfg, batch: int, setting) -> None:
    dm, module = build(cfg)
    loader_row(rows, "rerank loader", batch, setting, opts, dm.test_dataloader)
    module.eval()
    cross = module.ranker.kind == "cross"
    queries = None if cross else module.encode_query_texts(dm.eval_splits["test"].qtexts)

    @torch.inference_mode()
    def model_step(i, b):
        if cross:
            return module.ranker.score(b)
        return module.score_chunk(queries, b, docs=module.ranker.encode_docs(b))

    def test(trainer):
        trainer.limit_test_batches = opts.warmup + opts.n
        trainer.test(module, datamodule=dm, verbose=False)

    lightning_row(rows, "rerank test", batch, setting, opts, cfg, dm.test_dataloader, model_step, test)


def encode_path(rows, opts: Options, cfg, batch: int, data: dict, setting: bool | None) -> None:
    from omegaconf import OmegaConf

    from datamodules.tokenization import length_order
    from models.encoding import eval_mode, pad_batch
    from models.loading import pair_tokenizer_for
    from models.rankers import build_ranker, ranker_config
    from retrieval.encode import encode_docs, window_size

    torch.manual_seed(opts.seed)
    ranker = build_ranker(ranker_config(OmegaConf.to_container(cfg.model)))
    if ranker.kind != "bi":
        print(f"  encode: skipped, {opts.model} is not a bi-encoder")
        return
    pt = pair_tokenizer_for(ranker)
    count = opts.warmup + opts.n
    items = list(itertools.islice(data["docs"].items(), count * batch))
    fed = items
    if setting:  # what evaluate.py's full ranking encodes with data.pretokenize: the collection tokenised once
        from datamodules.tokenized import TokenizedCollection

        collection = TokenizedCollection.of(data["docs"], pt, cfg.data.cache_dir, True)  # built here, not timed
        fed = list(itertools.islice(collection, count * batch))

    def run():
        times = timed_iter(encode_docs(ranker, pt, fed, batch_size=batch, device="cpu", precision="fp32"), count)
        # the same batches: windows of window_size texts, each tokenised, sorted longest first, cut into batches
        steps, window = [], window_size(batch, None)
        with torch.inference_mode(), eval_mode(ranker):
            for w in range(0, len(items), window):
                ids = pt.ids([t for _, t in items[w : w + window]], "doc")
                order = length_order([len(x) for x in ids])
                for s in range(0, len(order), batch):
                    inp, att = pad_batch([ids[i] for i in order[s : s + batch]], pt.tokenizer.pad_token_id)
                    t0 = time.perf_counter()
                    ranker.encode(inp, att, side="doc")
                    steps.append(time.perf_counter() - t0)
        return per_batch(times[1:], opts.warmup), float(np.mean(steps[opts.warmup :])), batch

    measure(rows, "encode", batch, label(setting), run)

    def stub(input_ids, attention_mask, side="doc"):  # no model: the encoder's own work is all that is timed
        from models.rankers.base import Encoded

        return Encoded(tokens=torch.zeros(1, 1, 1).expand(*input_ids.shape, 8), mask=attention_mask.bool())

    def host_only():
        real, ranker.encode = ranker.encode, stub
        try:
            times = timed_iter(encode_docs(ranker, pt, fed, batch_size=batch, device="cpu", precision="fp32"), count)
        finally:
            ranker.encode = real
        return per_batch(times[1:], opts.warmup), None, batch

    measure(rows, "encode host", batch, label(setting), host_only)


COLUMNS = [
    "path",
    "batch",
    "pretokenize",
    "batch_ms",
    "model_ms",
    "host_ms",
    "host_us_per_example",
    "examples_per_batch",
    "others_cores",
]


def ratio_rows(rows: list[dict]) -> list[dict]:
    """Host ms before (off) and after (on) per path and batch, with before / after."""
    by = {(r["path"], r["batch"], r["pretokenize"]): r["host_ms"] for r in rows}
    out = []
    for path, batch in dict.fromkeys((r["path"], r["batch"]) for r in rows):
        off, on = by.get((path, batch, "off")), by.get((path, batch, "on"))
        if off is not None and on is not None:
            out.append(
                {"path": path, "batch": batch, "off": off, "on": on, "ratio": round(off / on, 2) if on else None}
            )
    return out


def main(argv: list[str] | None = None) -> dict:
    opts = options.parse(Options, argv, __doc__)
    batches = [int(b) for b in parse_list(opts.batches, "batches") if b.isdigit()]
    if not batches or opts.n < 2 or opts.warmup < 1:
        options.error("batches must be integers, n >= 2 and warmup >= 1")
    exists = pretokenize_exists()
    values = settings(opts.pretokenize, exists)
    started = record.utc_now()
    t_start = time.time()
    torch.set_num_threads(opts.threads)
    warnings.filterwarnings("ignore", message=".*self.log.*")  # the model timing calls training_step without a loop
    warnings.filterwarnings("ignore", category=UserWarning, module="pytorch_lightning")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as train.py (pipeline/cli.py) sets it
    from transformers.utils import logging as hf_logging  # lazy: heavy, only model building needs it

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    work = Path(opts.work_dir)
    work = (work if work.is_absolute() else REPO / work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    chunks = (opts.warmup + opts.n) * max(batches)
    candidates = min(opts.passages, -(-int(1.3 * chunks) // opts.test_queries))
    data = prepare_data(work, opts.passages, opts.seed, opts.test_queries, candidates, opts.data_dir)
    from models.rankers.backbone import save_random_bert

    backbone = work / "tiny-bert"
    if not (backbone / "config.json").exists():
        save_random_bert(backbone, seed=opts.seed, tokenizer="minilm", **TINY_BERT)
    print(
        f"bench_host: {opts.model}, batches {batches}, {opts.warmup} + {opts.n} batches, data.pretokenize "
        f"{'exists' if exists else 'absent'}: measuring {values}; {data['passages']:,} passages in {data['folder']}"
    )
    rows: list[dict] = []
    for batch in batches:
        for setting in values:
            cfg = compose_cfg(opts, data, work, str(backbone), batch, setting)
            train_paths(rows, opts, cfg, batch, setting)
            rerank_paths(rows, opts, cfg, batch, setting)
            encode_path(rows, opts, cfg, batch, data, setting)
    wall = time.time() - t_start
    info = machine_info(torch.get_num_threads())
    command = record.command_line("bench.bench_host", argv)
    table_cols = [
        ("path", "path"),
        ("batch", "batch"),
        ("pretokenize", "data.pretokenize"),
        ("batch_ms", "per batch ms"),
        ("model_ms", "model ms"),
        ("host_ms", "host ms"),
        ("host_us_per_example", "host us / example"),
        ("others_cores", "others' cores"),
    ]
    ratios = ratio_rows(rows)
    body = ["## Figures", "", record.markdown_table(rows, table_cols), ""]
    if ratios:
        body += [
            "## Before (data.pretokenize=false) and after (true): host ms per batch",
            "",
            record.markdown_table(
                ratios, [("path", "path"), ("batch", "batch"), ("off", "off"), ("on", "on"), ("ratio", "off / on")]
            ),
            "",
        ]
    else:
        body += [
            "data.pretokenize: "
            + ("absent from this code: only today's per-batch tokenisation (before)" if not exists else "one setting")
            + " measured; no before / after ratio.",
            "",
        ]
    body += [
        "Host = per batch minus the model's time per batch (training_step + backward + AdamW step; encode_docs + "
        "score_chunk; ranker.encode), each timed apart on the same batches; the loader rows have no model. "
        "`encode host` runs the same encoder with the model replaced by a stub (no model time to subtract). The "
        "host of a fit, test or encode row is the difference of two quantities timed apart: its error grows with the "
        "model's time and the machine's load (the loader row, no model, is the data part of the fit's and test's "
        "host).",
        "",
        "## How it is measured",
        "",
        "Measured per batch size" + __doc__.split("Measured per batch size", 1)[1].split("\n\n")[0],
    ]
    facts = [
        ("Date", f"{started.date().isoformat()}, {started:%H:%M}-{record.utc_now():%H:%M} UTC"),
        ("Command", f"`{record.relative(command)}`"),
        ("Commit", record.git_commit()),
        (
            "Machine",
            f"{info['cpu_model']} ({info.get('cpu_family_model', '?')}), {info['logical_cpus']} logical CPUs, "
            f"torch threads {torch.get_num_threads()}; torch {info['torch']}, transformers {info['transformers']}, "
            f"Python {info['python']}; no GPU used",
        ),
        (
            "Settings",
            f"model {opts.model} on a random 1-layer BERT ({TINY_BERT}), fp32, data.num_workers=0, {opts.warmup} "
            f"warm-up + {opts.n} timed batches, {data['passages']:,} synthetic passages, rerank: "
            f"{opts.test_queries} queries x {candidates} given candidates",
        ),
        ("Wall time", f"{wall:.0f} s"),
    ]
    md, tsv = record.write_record(
        Path(opts.record_dir) if opts.record_dir else record.RESULTS,
        "host-cost",
        "Host cost per batch: time outside the model in training, re-ranking and encoding (bench_host)",
        facts,
        "\n".join(body),
        rows,
        COLUMNS,
        started,
    )
    print()
    print(record.markdown_table(rows, table_cols))
    print(f"\n{wall:.0f} s; record {md} + {tsv.name}")
    return {"rows": rows, "ratios": ratios, "record": [str(md), str(tsv)], "pretokenize_exists": exists}


if __name__ == "__main__":
    main()
