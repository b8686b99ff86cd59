"""Operators per training step, ours (train.py's fit) against bench_gpu_speed's bare loop, counted on the CPU.

    python -m bench.bench_ops [tasks=colbert-train] [shapes=minilm,bert-base] [batches=32,64] [buckets=4,1]
                              [precision=fp32|bf16] [record_dir=results] [work_dir=outputs/bench-ops]

Why: on a GPU every operator that does work is a kernel the host launches (PyTorch's dispatch, the caching allocator
and the driver: some microseconds each), and where the GPU's own work per step is small (an H200 runs a MiniLM
ColBERT step of 32 triples in ~12 ms) the launches set the step's time. Counting them needs no GPU: the same model
code calls the same operators on the CPU, with two exceptions handled here: the CPU-only fast dropout is off
(`model.fast_dropout=false`: PyTorch's dropout, as on CUDA), and `model.length_buckets` is given as a number (its
`auto` means 4 groups on the CPU and one block on a GPU, so both are counted here as 4 and 1).

What is counted: torch.profiler's CPU events of one steady-state step (the 4th of 6: from its first hook to the next
one's, so Lightning's loop, the batch transfer, the loss, backward, clipping, the non-finite checks and AdamW's step
are in it; the bare loop: its 4th step). `aten events`: every aten operator call, nested ones included; `leaves`:
those with no aten operator inside them; `work`: leaves that are neither views nor allocations (no kernel on a GPU),
so roughly the kernels a GPU step would launch. The backbone has the shape's depth and a narrow width (hidden 16, 2
heads, FFN 32): the operator graph of a BERT depends on its depth, not its width. Nor does it depend on the batch
(no loop runs over rows; the groups are at most `length_buckets`), so batches 32 and 64 show it: at 256 ColBERT's
in-batch MaxSim alone ([256, 512, 32, 180] similarities) takes minutes a step on a CPU. Data: the synthetic MS
MARCO-shaped files of bench_gpu_speed (its prepare_data), query 32 / passage 180 tokens; ours through `data=tsv`
with given triples, validation and evaluation off, no workers; fp32, or with `precision=bf16` ours in bf16-mixed and
the bare loop under bf16 autocast, as on the GPU (autocast's casts are operators too: the CPU's autocast casts the
same weights for the matrix products that CUDA's does).
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
from pytorch_lightning import Callback
from torch.profiler import ProfilerActivity, profile

from bench import options, record
from bench.bench_gpu_speed import (
    DOC_MAX_LEN,
    MODEL,
    QUERY_MAX_LEN,
    SHAPES,
    bare_loop,
    data_args,
    prepare_data,
    token_lengths,
)
from bench.bench_gpu_speed import Options as SpeedOptions
from bench.bench_scale import parse_list
from bench.bench_speed import machine_info

REPO = Path(__file__).resolve().parents[1]
TASKS = ("colbert-train", "repbert-train", "bertcat-train")
NARROW = dict(hidden_size=16, num_attention_heads=2, intermediate_size=32)
STEPS, COUNTED = 6, 3  # steps run, and the (0-based) step counted
# leaves that launch no kernel on a GPU: views, metadata and allocations
NO_KERNEL = {
    "aten::as_strided",
    "aten::view",
    "aten::_unsafe_view",
    "aten::_reshape_alias",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::detach",
    "aten::detach_",
    "aten::lift_fresh",
    "aten::empty",
    "aten::empty_strided",
    "aten::resize_",
    "aten::expand",
    "aten::transpose",
    "aten::t",
    "aten::permute",
    "aten::slice",
    "aten::select",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::alias",
    "aten::set_",
}
COLUMNS = ["task", "shape", "batch", "side", "aten_events", "leaves", "work", "work_vs_bare"]


@dataclasses.dataclass
class Options:
    tasks: str = "colbert-train"  # comma-separated, of colbert-train, repbert-train, bertcat-train
    shapes: str = "minilm,bert-base"
    batches: str = "32,64"
    buckets: str = "4,1"  # model.length_buckets of ours, as numbers (auto: 4 on the CPU, 1 on a GPU)
    precision: str = "fp32"  # fp32 | bf16 (ours bf16-mixed, the bare loop under bf16 autocast: the GPU runs' setting)
    passages: int = 20_000
    seed: int = 0
    work_dir: str = "outputs/bench-ops"
    record_dir: str | None = None  # null: results/


def counts(prof) -> tuple[int, int, int, Counter]:
    """(aten events, leaves, work leaves, work leaves by operator) of a finished profile."""
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    leaves = [e for e in events if not any(c.name.startswith("aten::") for c in e.cpu_children)]
    work = Counter(e.name for e in leaves if e.name not in NO_KERNEL)
    return len(events), len(leaves), sum(work.values()), work


class CountStep(Callback):
    """Profiles training step `at`, from its first hook to the next step's."""

    def __init__(self, at: int):
        self.at, self.prof, self.result = at, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.at:
            self.prof = profile(activities=[ProfilerActivity.CPU])
            self.prof.__enter__()
        elif batch_idx == self.at + 1 and self.prof is not None:
            self.prof.__exit__(None, None, None)
            self.result, self.prof = counts(self.prof), None


def ours(task: str, backbone: Path, batch: int, buckets: int, data: dict, work: Path, precision: str = "fp32") -> tuple:
    """Counts of our step: train.py's composition, data module, module and trainer (pipeline.stages)."""
    from bench.bench_host import build
    from pipeline.config import compose
    from pipeline.stages import build_trainer

    cfg = compose(
        [
            f"model={MODEL[task]}",
            f"model.backbone={backbone}",
            f"model.query_max_len={QUERY_MAX_LEN}",
            f"model.doc_max_len={DOC_MAX_LEN}",
            "model.fast_dropout=false",
            f"model.length_buckets={buckets}",
            *data_args(data, work / "cache", train=True),
            f"data.batch_size={batch}",
            "data.num_workers=0",
            "data.max_eval_queries=4",
            "trainer.accelerator=cpu",
            f"trainer.precision={'bf16-mixed' if precision == 'bf16' else '32-true'}",
            f"trainer.max_steps={STEPS}",
            "trainer.limit_val_batches=0",
            "trainer.enable_progress_bar=false",
            "eval.before_training=false",
            "eval.isotropy_paper=false",
            "eval.ats_passages=0",
            "logger=none",
            f"output_dir={work / 'runs' / f'{task}-b{batch}-k{buckets}-{precision}'}",
        ]
    )
    dm, module = build(cfg)
    trainer = build_trainer(cfg, None, checkpoints=False)
    step = CountStep(COUNTED)
    trainer.callbacks.append(step)
    trainer.fit(module, datamodule=dm)
    return step.result


def bare(task: str, backbone: Path, batch: int, lengths: dict, seed: int, precision: str = "fp32") -> tuple:
    """Counts of the bare loop's step (bench_gpu_speed.bare_loop on the CPU, fp32 or under bf16 autocast)."""
    opts = SpeedOptions(device="cpu", precision=precision, warmup=COUNTED, steps=STEPS - COUNTED, seed=seed)
    step, batches = bare_loop(task, str(backbone), batch, opts, lengths)
    for b in batches[:COUNTED]:
        step(b)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(batches[COUNTED])
    return counts(prof)


def main(argv: list[str] | None = None) -> dict:
    opts = options.parse(Options, argv, __doc__)
    tasks = parse_list(opts.tasks, "tasks", TASKS)
    shapes = parse_list(opts.shapes, "shapes", SHAPES)
    batches = [int(b) for b in parse_list(opts.batches, "batches") if b.isdigit()]
    buckets = [int(b) for b in parse_list(opts.buckets, "buckets") if b.isdigit()]
    if not batches or not buckets or min(batches + buckets) < 1:
        options.error("batches and buckets must be whole numbers >= 1, e.g. batches=32,256 buckets=4,1")
    if opts.precision not in ("fp32", "bf16"):
        options.error(f"precision is {opts.precision!r}; expected fp32 or bf16")
    started, t_start = record.utc_now(), time.time()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning, module="pytorch_lightning")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from models.rankers.backbone import save_random_bert

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    work = Path(opts.work_dir)
    work = (work if work.is_absolute() else REPO / work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = prepare_data(work, opts.passages, opts.seed, 20, 10)
    rows, top = [], []
    for shape in shapes:
        backbone = work / f"backbone-{shape}-narrow"
        if not (backbone / "config.json").exists():
            depth = SHAPES[shape]["num_hidden_layers"]
            save_random_bert(backbone, seed=opts.seed, num_hidden_layers=depth, **NARROW)
        lengths = token_lengths(AutoTokenizer.from_pretrained(str(backbone)), data, 2000, opts.seed)
        for task in tasks:
            for batch in batches:
                base = bare(task, backbone, batch, lengths, opts.seed, opts.precision)
                measured = [("bare", base)]
                measured += [
                    (f"ours, length_buckets={k}", ours(task, backbone, batch, k, data, work, opts.precision))
                    for k in buckets
                ]
                for side, (events, leaves, work_ops, by_op) in measured:
                    rows.append(
                        dict(
                            task=task,
                            shape=shape,
                            batch=batch,
                            side=side,
                            aten_events=events,
                            leaves=leaves,
                            work=work_ops,
                            work_vs_bare=round(work_ops / base[2], 2),
                        )
                    )
                    print(f"{task} {shape} b{batch} {side}: {events} aten events, {leaves} leaves, {work_ops} work")
                    if side != "bare":
                        diff = by_op.copy()
                        diff.subtract(base[3])
                        most = [f"{op.removeprefix('aten::')} +{n}" for op, n in diff.most_common(6) if n > 0]
                        top.append(f"- {task}, {shape}, batch {batch}, {side}: {', '.join(most) or 'none'}")
    wall = time.time() - t_start
    info = machine_info(torch.get_num_threads())
    columns = [
        ("task", "task"),
        ("shape", "shape"),
        ("batch", "batch"),
        ("side", "step"),
        ("aten_events", "aten events"),
        ("leaves", "leaves"),
        ("work", "work (kernels on a GPU)"),
        ("work_vs_bare", "work / bare's"),
    ]
    body = [
        "## Operators per training step",
        "",
        record.markdown_table(rows, columns),
        "",
        "## Work operators ours calls more often than the bare loop (the six largest differences)",
        "",
        *top,
        "",
        "## How it is counted",
        "",
        __doc__.split("\n\n", 2)[2].strip(),
    ]
    facts = [
        ("Date", f"{started.date().isoformat()}, {started:%H:%M}-{record.utc_now():%H:%M} UTC"),
        ("Command", f"`{record.relative(record.command_line('bench.bench_ops', argv))}`"),
        ("Commit", record.git_commit()),
        (
            "Machine",
            f"{info['cpu_model']}, {info['logical_cpus']} logical CPUs, torch threads 1; torch {info['torch']}, "
            f"transformers {info['transformers']}, Python {info['python']}; no GPU used",
        ),
        (
            "Settings",
            f"{data['passages']:,} synthetic passages; backbones of the shapes' depth, {NARROW}; "
            + ("bf16: ours bf16-mixed, the bare loop under bf16 autocast" if opts.precision == "bf16" else "fp32"),
        ),
        ("Wall time", f"{wall:.0f} s"),
    ]
    md, tsv = record.write_record(
        Path(opts.record_dir) if opts.record_dir else record.RESULTS,
        "ops-per-step" + ("-bf16" if opts.precision == "bf16" else ""),
        "Operators per training step: ours against the bare loop (bench_ops"
        + (", bf16 autocast)" if opts.precision == "bf16" else ")"),
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
