"""What a run checks and says before and while it runs (issue 22): data is read and checked before any model weights
are loaded; training that will train nothing says so; the progress bar counts epochs to a finite end under
max_steps; judged queries without candidates are listed, scored 0 and left out of run.trec (trec_eval -c)."""

from __future__ import annotations

import json
import warnings

import pytest
import pytorch_lightning as pl
import torch
from conftest import small_run

from callbacks.progress import RankingProgressBar, last_epoch
from pipeline.cli import main
from pipeline.config import compose
from pipeline.run import evaluate, train
from pipeline.stages import load_data

SMALL = small_run(
    "eval.before_training=false",
    "eval.start_candidate=false",
    "eval.ats_passages=0",
    "eval.isotropy_paper=false",
    "data.batch_size=8",
    triples=16,
    eval_queries=6,
    depth=10,
    probe_queries=4,
    probe_docs=8,
)


def tsv(tmp_path, qrels: str = "q1 0 d1 1\nq2 0 d2 1\nq3 0 d3 1\n") -> list[str]:
    """A TSV collection whose query q3 is punctuation only (no BM25 candidate); `qrels` for every split."""
    (tmp_path / "collection.tsv").write_text(
        "d1\tthe cat sat on the mat\nd2\tdogs bark at night\nd3\tbirds sing\nd4\ta cat and a dog\n"
    )
    (tmp_path / "queries.tsv").write_text("q1\tcat\nq2\tdogs\nq3\t?!\n")
    (tmp_path / "qrels.txt").write_text(qrels)
    args = [f"data.collection={tmp_path / 'collection.tsv'}", "data.train_triples=null"]
    for split in ("train", "val", "test"):
        args += [
            f"data.{split}_queries={tmp_path / 'queries.tsv'}",
            f"data.{split}_qrels={tmp_path / 'qrels.txt'}",
            f"data.{split}_run=null",
        ]
    return ["data=tsv", *args, "logger=none", f"data.cache_dir={tmp_path / 'cache'}"]


# ---- data before models ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "job, extra, first",
    [
        (lambda cfg, _: train(cfg), [], "qrels.txt:2"),
        (evaluate, [], "qrels.txt:2"),
        # a checkpoint's existence and header come before the data (pipeline/jobs.check_files): no data is read
        (evaluate, ["ckpt=/no/such/checkpoint.ckpt"], "ckpt: checkpoint '/no/such/checkpoint.ckpt' does not exist"),
    ],
)
def test_bad_data_is_reported_before_any_weights_are_loaded(tmp_path, capsys, job, extra, first):
    """A backbone folder without weights would fail as soon as weights are loaded: the data error wins. (A backbone
    path that does not exist is refused before both, by the job's first checks.)"""
    bad = tsv(tmp_path, qrels="q1 0 d1 1\nq2 0 d2\n")  # line 2 lacks the grade
    out = tmp_path / "run"
    empty = tmp_path / "empty-backbone"
    empty.mkdir()
    assert main([*bad, f"model.backbone={empty}", *extra, f"output_dir={out}"], job) == 2
    err = capsys.readouterr().err
    where = str(tmp_path / first) if first.startswith("qrels") else first
    assert err.count("\n") == 1 and where in err, err
    assert not out.exists()


# ---- nothing to train --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_nothing_to_train_is_said(tmp_path, tiny_bert):
    base = [*SMALL, f"model.backbone={tiny_bert}", "trainer.val_check_interval=2"]
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train(compose([*base, "trainer.max_steps=2", f"output_dir={out}"]))
    assert not [w for w in seen if "nothing will be trained" in str(w.message)]
    last = out / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 2
    for steps in (1, 2):  # at and below the checkpoint's step
        with pytest.warns(
            UserWarning,
            match=rf"^nothing will be trained: trainer.max_steps={steps} and ckpt_path is already at step 2; "
            r"raise trainer.max_steps to train on$",
        ):
            train(compose([*base, f"trainer.max_steps={steps}", f"ckpt_path={last}", f"output_dir={out}"]))
    with pytest.warns(UserWarning, match=r"^nothing will be trained: trainer.max_steps=0$"):
        train(compose([*base, "trainer.max_steps=0", f"output_dir={tmp_path / 'zero'}"]))
    assert (tmp_path / "zero" / "metrics.json").is_file()


# ---- progress bar ------------------------------------------------------------------------------------------------


class _Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(2, 1)

    def training_step(self, batch, _):
        return self.w(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(5, 2)), batch_size=1)


@pytest.mark.parametrize("accumulate, epochs", [(1, 3), (2, 4)])  # 5 batches an epoch: 5 or 3 optimiser steps
def test_progress_bar_counts_epochs_to_max_steps(accumulate, epochs):
    shown = []

    class Spy(RankingProgressBar):
        def _get_train_description(self, current_epoch):
            shown.append(super()._get_train_description(current_epoch).strip())
            return shown[-1]

    trainer = pl.Trainer(
        max_steps=12,
        accumulate_grad_batches=accumulate,
        callbacks=[Spy()],
        logger=False,
        enable_checkpointing=False,
        accelerator="cpu",
        enable_model_summary=False,
    )
    trainer.fit(_Tiny())
    assert trainer.max_epochs == -1 and trainer.global_step == 12 and trainer.current_epoch == epochs
    assert shown == [f"Epoch {e}/{epochs - 1}" for e in range(epochs)]
    assert last_epoch(-1, 5, 1) is None and last_epoch(12, float("inf"), 1) is None


# ---- queries without candidates ----------------------------------------------------------------------------------


def test_query_without_candidates_warned_in_reranking(tmp_path):
    with pytest.warns(
        UserWarning,
        match=r"data 'tsv', split 'test': 1 judged query has no candidate .*: 'q3'; scored 0 on every measure and "
        r"absent from run.trec \(as trec_eval -c counts them\)",
    ):
        dm = load_data(compose(tsv(tmp_path)))
    test = dm.eval_splits["test"]
    assert "q3" in test.qids and test.qids.index("q3") not in set(test.pairs[:, 0].tolist())


def test_judged_query_left_out_of_a_given_run_is_scored_zero(tmp_path):
    """A candidate run file (data.test_run) that ranks nothing for a judged query: the query stays in the split
    (trec_eval -c), with the same warning as a query without BM25 candidates, not silently dropped."""
    (tmp_path / "run.txt").write_text("q1 Q0 d1 1 2.0 x\nq1 Q0 d4 2 1.0 x\nq3 Q0 d3 1 1.0 x\n")  # no line for judged q2
    args = [a for a in tsv(tmp_path) if not a.startswith("data.test_run=")] + [f"data.test_run={tmp_path / 'run.txt'}"]
    with pytest.warns(
        UserWarning,
        match=r"data 'tsv', split 'test': 1 judged query has no candidate "
        r"\(the given run ranks no document for it\): 'q2'",
    ):
        dm = load_data(compose(args))
    test = dm.eval_splits["test"]
    assert test.qids == ["q1", "q2", "q3"]
    assert [test.qids[i] for i in test.pairs[:, 0]] == ["q1", "q1", "q3"]


def test_query_without_candidates_in_bm25_run(tmp_path):
    out = tmp_path / "bm25"
    with pytest.warns(UserWarning, match=r"model=bm25, split 'test': 1 judged query has no candidate .*: 'q3'"):
        means = evaluate(compose(["model=bm25", *tsv(tmp_path), f"output_dir={out}"]), False)
    per_query = json.loads((out / "per_query.json").read_text())
    assert set(per_query) == {"q1", "q2", "q3"} and set(per_query["q3"].values()) == {0}
    assert {ln.split()[0] for ln in (out / "run.trec").read_text().splitlines()} == {"q1", "q2"}
    # the mean is over every judged query, q3 as 0: trec_eval -c on run.trec (without -c: over q1 and q2 only)
    for measure, value in means.items():
        assert value == pytest.approx(sum(q[measure] for q in per_query.values()) / 3), measure
