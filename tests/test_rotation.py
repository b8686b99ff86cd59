"""Rotation debiasing (position-bias paper Eq. 7): word rotation, span mapping, deterministic rotation index,
`data.rotation` (per_passage: one cut per passage across epochs, triples, ranks, workers, training and evaluation;
per_epoch: a new cut every epoch), and the answer-position distribution before/after rotation (SQuAD from
../shared/data, synthetic "start")."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, shared_data, synthetic_data
from scipy import stats

from datamodules.rotation import (
    normalize,
    passage_rotation_index,
    relative_answer_positions,
    rotate,
    rotate_seeded,
    rotation_index,
    word_starts,
)
from datamodules.sources import load_dataset
from datamodules.sources.synthetic import SyntheticConfig


def _random_text(rng: np.random.Generator) -> tuple[str, list[tuple[int, int]], list[str]]:
    """Text with messy whitespace and random character spans (possibly starting/ending on spaces)."""
    words = ["".join(rng.choice(list("abcdefgh.,"), size=rng.integers(1, 7))) for _ in range(rng.integers(1, 25))]
    seps = [rng.choice([" ", "  ", "\n", "\t ", " \u00a0", "\u3000", "\x1c", "\u2009\r\n"]) for _ in words]
    text = rng.choice(["", " ", "\n"]) + "".join(w + s for w, s in zip(words, seps))
    spans = []
    for _ in range(3):
        s = int(rng.integers(0, len(text)))
        e = int(rng.integers(s, len(text) + 1))
        spans.append((s, e))
    return text, spans, words


def test_normalize_collapses_whitespace_and_maps_spans():
    text = "  The  quick\n brown\t\tfox  "
    norm, spans = normalize(text, [(2, 5), (7, 19), (12, 14), (5, 9)])
    assert norm == "The quick brown fox"
    # (12, 14) is whitespace only: dropped; (5, 9) = "  qu": leading whitespace trimmed
    assert spans == [(0, 3), (4, 15), (4, 6)]
    rng = np.random.default_rng(0)
    for _ in range(300):
        text, spans, _ = _random_text(rng)
        norm, mapped = normalize(text, spans)
        assert norm == " ".join(text.split())
        expected = [" ".join(text[s:e].split()) for s, e in spans if text[s:e].strip()]
        assert [norm[s:e] for s, e in mapped] == expected
        assert normalize(norm, mapped) == (norm, mapped)  # idempotent


def test_rotate_is_a_word_rotation_and_maps_spans():
    rng = np.random.default_rng(1)
    for _ in range(300):
        text, spans, _ = _random_text(rng)
        norm, nspans = normalize(text, spans)
        words = norm.split(" ")
        for r in range(len(words)):
            rotated, rspans = rotate(text, r, spans)
            assert rotated.split(" ") == words[r:] + words[:r]
            assert len(rotated) == len(norm)
            cut = word_starts(norm)[r] if r else 0
            pieces = [rotated[s:e] for s, e in rspans]
            for s, e in nspans:
                answer = norm[s:e]
                if r == 0 or s >= cut or e <= cut - 1:  # not split by the cut: one span, same text
                    assert answer in pieces
                else:  # split: the tail part now opens the passage, the head part closes it
                    head, tail = answer[: cut - 1 - s], answer[cut - s :]
                    assert (tail == "" or (0, len(tail)) in rspans) and (head == "" or rotated.endswith(head))
                    assert (head + " " + tail).strip() == answer
    assert rotate("a b c d", 0) == ("a b c d", [])
    assert rotate(" a  b\nc d ", 2, [(1, 2), (6, 7)]) == ("c d a b", [(0, 1), (4, 5)])
    # a span over the cut becomes two spans: "b c" cut before "c"
    assert rotate("a b c d", 2, [(2, 5)]) == ("c d a b", [(0, 1), (6, 7)])


def test_rotate_paper_example():
    # Eq. 7 with 1-based r = 3: [p_3:n ; p_1:2]
    assert rotate("p1 p2 p3 p4 p5", 2)[0] == "p3 p4 p5 p1 p2"


def test_rotation_index_is_deterministic_across_processes():
    keys = [f"q{i}:d{i}" for i in range(400)]
    a = [rotation_index(42, 3, k, 50) for k in keys]
    assert a == [rotation_index(42, 3, k, 50) for k in keys]
    assert all(0 <= r < 50 for r in a)
    other_epoch = [rotation_index(42, 4, k, 50) for k in keys]
    assert np.mean(np.array(a) == np.array(other_epoch)) < 0.1
    other_seed = [rotation_index(7, 3, k, 50) for k in keys]
    assert np.mean(np.array(a) == np.array(other_seed)) < 0.1
    counts = np.bincount([rotation_index(0, 0, f"k{i}", 10) for i in range(5000)], minlength=10)
    assert stats.chisquare(counts).pvalue > 0.001
    assert rotation_index(0, 0, "x", 1) == 0 and rotation_index(0, 0, "x", 0) == 0
    # per_passage: (seed, passage id) only, the epoch-0 cut of the passage id
    b = [passage_rotation_index(42, f"d{i}", 50) for i in range(400)]
    assert b == [rotation_index(42, 0, f"d{i}", 50) for i in range(400)]
    code = (
        "from datamodules.rotation import rotation_index as f, passage_rotation_index as g; "
        "print([[f(42, 3, f'q{i}:d{i}', 50) for i in range(400)], [g(42, f'd{i}', 50) for i in range(400)]])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [a, b]


def test_relative_answer_positions_are_word_based():
    assert relative_answer_positions("a bb  ccc d", [(0, 1), (2, 4), (6, 9), (10, 11)]) == [0.0, 0.25, 0.5, 0.75]
    assert relative_answer_positions("", []) == []


def _ks_uniform(values) -> float:
    return stats.kstest(values, "uniform").pvalue


@pytest.mark.data("squad_v1.1_dev/dev-v1.1.json.gz")
def test_rotation_makes_squad_answer_positions_uniform():
    path = shared_data("squad_v1.1_dev", "dev-v1.1.json.gz")
    raw = json.load(gzip.open(path))
    before, after = [], []
    checked = 0
    for a in raw["data"]:
        for p in a["paragraphs"]:
            context = p["context"]
            for qa in p["qas"]:
                ans = qa["answers"][0]
                span = (ans["answer_start"], ans["answer_start"] + len(ans["text"]))
                before += relative_answer_positions(context, [span])
                rotated, spans = rotate_seeded(context, seed=0, epoch=0, key=qa["id"], spans=[span])
                assert sorted(rotated.split()) == sorted(context.split())
                if len(spans) == 1:  # not split by the cut: the slice is the (whitespace-normalised) answer
                    assert rotated[spans[0][0] : spans[0][1]] == " ".join(ans["text"].split())
                    checked += 1
                # the answer starts in the last span: a span split by the cut keeps its first words at the end
                after.append(relative_answer_positions(rotated, spans[-1:])[0])
    assert len(before) == len(after) == 10570
    assert checked > 0.95 * len(after)
    p_before, p_after = _ks_uniform(before), _ks_uniform(after)
    print(
        f"\nSQuAD relative answer start (word-based): before mean {np.mean(before):.3f} (KS p={p_before:.2g}), "
        f"after rotation mean {np.mean(after):.3f} (KS p={p_after:.2g})"
    )
    assert p_after > 0.01
    assert abs(np.mean(after) - 0.5) < 0.02
    deciles = np.bincount(np.minimum((np.array(after) * 10).astype(int), 9), minlength=10)
    assert np.all(np.abs(deciles - len(after) / 10) < 0.1 * len(after) / 10)


def test_rotation_debiases_synthetic_start_bias():
    ds = load_dataset(SyntheticConfig(answer_position="start"), 0)
    before, after = [], []
    for (qid, doc), spans in ds.answers.items():
        before += relative_answer_positions(ds.docs[doc], spans)
        rotated, rspans = rotate_seeded(ds.docs[doc], 0, 0, f"{qid}:{doc}", spans)
        after.append(relative_answer_positions(rotated, rspans[-1:])[0])
    print(f"\nsynthetic 'start': before mean {np.mean(before):.3f}, after rotation mean {np.mean(after):.3f}")
    assert np.mean(before) < 0.25 and _ks_uniform(before) < 1e-6
    assert _ks_uniform(after) > 0.01


class _Indexed:
    """A dataset that also returns the (epoch, index) it was asked for and the worker that answered."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, item):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        return item, self.ds[item], None if info is None else info.id


def _as_list(items):
    return items


def _module(tmp_path, rotate_train: bool, rotate_eval: bool, seed: int = 5, rotation: str = "per_passage"):
    sizes = dict(num_docs=80, num_train_queries=30, num_val_queries=6, num_test_queries=6)
    return synthetic_data(
        tmp_path, seed, **sizes, rotate_train=rotate_train, rotate_eval=rotate_eval, rotation=rotation
    )


def _triplets(dm):
    from datamodules.datamodule import TripletDataset

    train = dm.dataset.split("train")
    return TripletDataset(
        dm.dataset,
        dm.triples,
        train.queries,
        dm.cfg.rotate_train,
        dm.seed,
        rotation_mode=dm.cfg.rotation,
        qrels=train.qrels,
    )


def test_datamodule_switches_rotate_train_and_eval_separately(tmp_path):
    """Through the data module: `rotate_train` rotates both passages of every training triplet, with a cut that
    repeats with the seed and (per_epoch) changes with the epoch; `rotate_eval` rotates the evaluation passages;
    each switch leaves the other side as the normalised original (same spacing, word order untouched)."""

    def module(rotate_train: bool, rotate_eval: bool, seed: int = 5, rotation: str = "per_epoch"):
        return _module(tmp_path, rotate_train, rotate_eval, seed, rotation)

    plain, train_only, eval_only = module(False, False), module(True, False), module(False, True)
    ds = _triplets

    a, b = ds(plain), ds(train_only)
    changed_epoch = moved = 0
    for i in range(len(a)):
        q0, p0, n0, _ = a[(0, i)]
        q1, p1, n1, _ = b[(0, i)]
        assert q1 == q0
        for orig, rot in ((p0, p1), (n0, n1)):
            w, r = orig.split(" "), rot.split(" ")
            assert orig == normalize(orig, [])[0]  # unrotated text gets the same whitespace handling
            assert any(r == w[k:] + w[:k] for k in range(len(w))), (orig, rot)
            moved += rot != orig
        changed_epoch += b[(1, i)][1] != p1
        assert b[(0, i)] == ds(module(True, False))[(0, i)]  # same seed, same rotation
    assert moved > len(a) and changed_epoch > len(a) // 2
    assert eval_only.triples == plain.triples and ds(eval_only)[(0, 0)] == a[(0, 0)]
    for split in ("val", "test"):
        for orig, rot in zip(plain.eval_splits[split].dtexts, eval_only.eval_splits[split].dtexts):
            w = orig.split(" ")
            assert any(rot.split(" ") == w[k:] + w[:k] for k in range(len(w)))
        assert train_only.eval_splits[split].dtexts == plain.eval_splits[split].dtexts
        assert sum(x != y for x, y in zip(plain.eval_splits[split].dtexts, eval_only.eval_splits[split].dtexts)) > 0


def test_per_passage_is_one_cut_per_passage_everywhere(tmp_path):
    """data.rotation=per_passage (default): every occurrence of a passage, in any triple, at any epoch, on either of
    two DDP ranks, in any of two dataloader workers, in a fresh (resumed) process state, and in evaluation, is the
    passage rotated at passage_rotation_index(seed, doc id): one debiased instance per passage (Sec. 4.2)."""
    from torch.utils.data import DataLoader

    from datamodules.samplers import DistributedTrainBatchSampler

    dm = _module(tmp_path, True, True)
    assert dm.cfg.rotation == "per_passage"

    def instance(doc_id: str) -> str:
        norm = normalize(dm.dataset.docs[doc_id])[0]
        return rotate(norm, passage_rotation_index(dm.seed, doc_id, len(word_starts(norm))))[0]

    tds = _triplets(dm)
    visits, workers = 0, set()
    for rank in range(2):
        sampler = DistributedTrainBatchSampler(len(tds), 4, dm.seed, rank, 2)
        loader = DataLoader(_Indexed(tds), batch_sampler=sampler, collate_fn=_as_list, num_workers=2)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for batch in loader:
                for (e, i), (_, pos_text, neg_text, _), worker in batch:
                    _, pos, neg = dm.triples[i]
                    assert e == epoch and pos_text == instance(pos) and neg_text == instance(neg), (rank, worker, e, i)
                    visits += 1
                    workers.add((rank, worker))
    assert visits == 3 * len(tds)  # both ranks together saw every triple at every epoch
    assert workers == {(r, w) for r in range(2) for w in range(2)}
    moved = sum(instance(d) != normalize(dm.dataset.docs[d])[0] for d in dm.dataset.docs)
    assert moved > len(dm.dataset.docs) // 2
    for split in ("val", "test"):  # evaluation cuts the same passages alike
        es = dm.eval_splits[split]
        assert es.dtexts == [instance(d) for d in es.doc_ids]
    # a resumed run (a new data module, a new dataset object) and the other rotation setting's evaluation agree
    again = _triplets(_module(tmp_path, True, True))
    assert [again[(7, i)] for i in range(len(dm.triples))] == [tds[(0, i)] for i in range(len(dm.triples))]
    assert (
        _module(tmp_path, True, True, rotation="per_epoch").eval_splits["test"].dtexts == dm.eval_splits["test"].dtexts
    )


def test_per_epoch_redraws_the_cut_every_epoch(tmp_path):
    """data.rotation=per_epoch: training passages get a new cut every epoch (and per triple), reproducible from the
    seed; a bad mode is a one-line config error naming the key."""
    from core.errors import InputError
    from pipeline.config import compose

    dm = _module(tmp_path, True, False, rotation="per_epoch")
    tds = _triplets(dm)
    n = len(dm.triples)
    per_epoch = [[tds[(epoch, i)][1] for i in range(n)] for epoch in range(3)]
    for a, b in ((0, 1), (1, 2), (0, 2)):
        assert sum(x != y for x, y in zip(per_epoch[a], per_epoch[b])) > n // 2
    assert [_triplets(_module(tmp_path, True, False, rotation="per_epoch"))[(1, i)][1] for i in range(n)] == per_epoch[
        1
    ]
    # per_passage on the same module: every epoch equals epoch 0
    per_passage = _module(tmp_path, True, False)
    same = _triplets(per_passage)
    assert all(same[(e, i)] == same[(0, i)] for e in (1, 2) for i in range(n))
    # the training loader builds its dataset with the configured setting
    for module in (dm, per_passage):
        loader = module.train_dataloader()
        assert (
            loader.dataset.rotation_mode == module.cfg.rotation and loader.dataset[(2, 3)] == _triplets(module)[(2, 3)]
        )
    assert (
        compose(["data.rotation=per_epoch"]).data.rotation == "per_epoch" and compose([]).data.rotation == "per_passage"
    )
    with pytest.raises(InputError, match=r"data\.rotation"):
        compose(["data.rotation=per_triple"])


def test_the_rotation_mode_cuts_training_passages_alone(tmp_path):
    """Why train.py refuses data.rotation without data.rotate_train (pipeline/jobs.py): the mode changes no
    evaluation passage (one cut per passage either way) and, unrotated, no training passage."""
    for rotate_eval in (False, True):
        per_passage = _module(tmp_path, False, rotate_eval)
        per_epoch = _module(tmp_path, False, rotate_eval, rotation="per_epoch")
        for split in ("val", "test"):
            assert per_passage.eval_splits[split].dtexts == per_epoch.eval_splits[split].dtexts
        a, b = _triplets(per_passage), _triplets(per_epoch)
        assert all(a[(e, i)] == b[(e, i)] for e in (0, 1) for i in range(len(per_passage.triples)))
    rotated = [_triplets(_module(tmp_path, True, False, rotation=r)) for r in ("per_passage", "per_epoch")]
    assert any(rotated[0][(1, i)] != rotated[1][(1, i)] for i in range(10))  # rotated, the mode tells
