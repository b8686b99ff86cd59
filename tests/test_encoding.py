"""The one encoder (models/encoding.py): `EncodedTextsWriter` against a plain per-text dict (any arrival
order, in memory or spilled to a file read back by pread), `encode_collection`'s variants against separate encodings
with and without a head, out-of-memory halving of variant outputs, and the isotropy protocol fed by the evaluation's
own vectors (`RankingModule.keep_vectors`) against the protocol encoding the texts again."""

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from conftest import tiny_ranker_and_data

from callbacks.isotropy import IsotropyCallback
from models.encoding import (
    RAW,
    WITH_HEAD,
    EncodedTextsWriter,
    encode_collection,
    encode_stream,
    variants_forward,
)
from models.rankers.base import Encoded


def _batches(rng, n_texts: int, d: int, with_sequence: bool):
    """Padded batches of random texts in a shuffled order, and each text's real token vectors as reference."""
    lengths = rng.integers(1, 9, size=n_texts)
    ref = {k: torch.tensor(rng.normal(size=(int(lengths[k]), d)), dtype=torch.float32) for k in range(n_texts)}
    seq = {k: torch.tensor(rng.normal(size=d), dtype=torch.float32) for k in range(n_texts)}
    order = rng.permutation(n_texts)
    out = []
    for s in range(0, n_texts, 4):
        rows = order[s : s + 4]
        width = int(lengths[rows].max())
        tokens = torch.full((len(rows), width, d), 7.0)  # padding holds garbage: only the mask may decide
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for r, k in enumerate(rows):
            tokens[r, : lengths[k]] = ref[k]
            mask[r, : lengths[k]] = True
        out.append((rows, Encoded(tokens, mask, torch.stack([seq[k] for k in rows]) if with_sequence else None)))
    return out, ref, seq


@pytest.mark.parametrize("budget", [1 << 30, 0, 300])
def test_writer_keeps_each_texts_real_tokens_in_any_order(tmp_path, budget):
    """Texts arrive in shuffled batches; in memory (a large budget) or spilled to a file at once
    (0) or part-way (300 bytes), each text reads back as its own real token vectors and pooled vector, exactly; the
    spill files are gone from the folder once mapped."""
    rng = np.random.default_rng(0)
    batches, ref, seq = _batches(rng, 23, 5, with_sequence=True)
    spill = tmp_path / "spill"
    spill.mkdir()
    w = EncodedTextsWriter(23, budget_bytes=budget, spill_dir=spill)
    for rows, enc in batches:
        w.add(rows, enc)
    got = w.finish()
    assert len(got) == 23 and got.n_tokens == sum(len(v) for v in ref.values())
    for k in range(23):
        assert torch.equal(got.tokens(k), ref[k])
        assert torch.equal(got.sequence[k], seq[k])
    assert list(spill.iterdir()) == []  # unlinked once mapped: nothing is left behind
    p = got.padded([3, 0])
    assert torch.equal(p.tokens[0, : len(ref[3])], ref[3]) and not p.tokens[0, len(ref[3]) :].any()
    rows, lengths = got.token_rows([5, 2])
    assert torch.equal(got.vecs[torch.from_numpy(rows)], torch.cat([ref[5], ref[2]])) and lengths.tolist() == [
        len(ref[5]),
        len(ref[2]),
    ]
    # spilled: texts read back by pread (rows_file), the same vectors as the map gives
    assert (got.rows_file is not None) == (budget < 1 << 30)
    vecs, lengths = got.text_vectors([5, 2, 5, 22])
    assert torch.equal(vecs, torch.cat([ref[5], ref[2], ref[5], ref[22]])) and lengths.tolist() == [
        len(ref[k]) for k in (5, 2, 5, 22)
    ]
    assert got.text_vectors([])[0].shape == (0, 5)


def test_npy_row_reader_reads_spans_like_slicing(tmp_path):
    """core/npy.NpyRowReader.read_spans against NumPy slicing of the loaded array, with the path unlinked."""
    from core.npy import NpyRowReader, NpyRowWriter

    x = np.random.default_rng(2).normal(size=(50, 7)).astype(np.float32)
    w = NpyRowWriter(tmp_path / "x.npy", np.float32, 7)
    w.write(x[:20])
    w.write(x[20:])
    w.close()
    r = NpyRowReader(tmp_path / "x.npy")
    (tmp_path / "x.npy").unlink()
    starts, lengths = np.array([0, 45, 10, 10, 49]), np.array([3, 5, 0, 4, 1])
    assert np.array_equal(
        r.read_spans(starts, lengths), np.concatenate([x[s : s + n] for s, n in zip(starts, lengths)])
    )
    assert np.array_equal(np.asarray(r.memmap()), x)
    with pytest.raises(OSError, match="short read"):
        r.read_spans(np.array([48]), np.array([5]))


def test_writer_pooled_only_and_unseen_texts():
    rng = np.random.default_rng(1)
    batches, ref, seq = _batches(rng, 9, 3, with_sequence=True)
    w = EncodedTextsWriter(12, keep_tokens=False)  # 3 texts never arrive
    for rows, enc in batches:
        w.add(rows, enc)
    got = w.finish()
    assert got.vecs.shape[0] == 0 and got.lengths.tolist() == [0] * 12
    assert all(torch.equal(got.sequence[k], seq[k]) for k in range(9)) and not got.sequence[9:].any()


@pytest.fixture
def colbert_with_head(tiny_bert_nodropout):
    from lightning_modules.module import RankingModule

    torch.manual_seed(0)
    r = RankingModule({"name": "colbert", "backbone": tiny_bert_nodropout}, {}).eval().ranker
    d = r.encode(torch.tensor([[101, 102]]), torch.ones(1, 2, dtype=torch.long)).tokens.shape[-1]
    r.token_head = torch.nn.Linear(d, d)
    return r


def test_variants_are_one_pass_of_each_reading(colbert_with_head):
    """encode_collection with (WITH_HEAD, RAW) equals two separate encodings, one with the token head and one
    without (1e-6), from one backbone pass per batch (the backbone's forward is counted)."""
    r = colbert_with_head
    tok = r.tokenizer
    ids = tok(["a short one", "a much longer passage about cats and mats", "mid length text", "x"])["input_ids"]
    calls = []
    hook = r.encoder.register_forward_hook(lambda *a: calls.append(1))
    both = encode_collection(r, ids, "doc", batch_size=3, pad_id=tok.pad_token_id, variants=(WITH_HEAD, RAW))
    hook.remove()
    assert len(calls) == 2  # 4 texts in batches of 3: two backbone passes for both readings
    with_head = encode_collection(r, ids, "doc", batch_size=3, pad_id=tok.pad_token_id)
    head, r.token_head = r.token_head, None
    without = encode_collection(r, ids, "doc", batch_size=3, pad_id=tok.pad_token_id)
    r.token_head = head
    for k in range(len(ids)):
        torch.testing.assert_close(both[WITH_HEAD].tokens(k), with_head.tokens(k), atol=1e-6, rtol=0)
        torch.testing.assert_close(both[RAW].tokens(k), without.tokens(k), atol=1e-6, rtol=0)
    assert not torch.allclose(both[WITH_HEAD].tokens(0), both[RAW].tokens(0))


def test_batches_tell_the_backbone_whether_they_are_padded(colbert_with_head, monkeypatch):
    """encode_stream tells each backbone pass whether its batch is padded (the mask is on the host then), so the
    backbone never reads the mask back from the device (a sync per batch on a GPU): an unpadded batch passes no mask,
    a padded one the 4-D mask; the vectors equal those of passes that read the mask themselves, bit for bit."""
    import models.rankers.base as base

    r = colbert_with_head
    tok = r.tokenizer
    ids = [tok("cats sat on mats")["input_ids"], tok("dogs ran to logs")["input_ids"], tok("a b")["input_ids"]]
    ids.append(ids[2][:-2] + ids[2][-1:])  # one token shorter than the third: the second batch is padded
    assert len(ids[0]) == len(ids[1]) > len(ids[2]) > len(ids[3])
    told, masks = [], []
    real = base.backbone_mask
    monkeypatch.setattr(base, "backbone_mask", lambda enc, mask, padded: told.append(padded) or real(enc, mask, padded))
    hook = r.encoder.register_forward_pre_hook(
        lambda m, a, kw: masks.append(kw.get("attention_mask")), with_kwargs=True
    )
    hinted = encode_collection(r, ids, "doc", batch_size=2, pad_id=tok.pad_token_id)
    hook.remove()
    assert told == [False, True]  # longest first: the two equal texts, then the padded pair
    assert masks[0] is None and masks[1] is not None and masks[1].dim() == 4
    told.clear()
    told_nothing = type(r).padding_known

    def unknown(self, padded):  # a ranker that cannot be told: the backbone checks the mask itself
        return told_nothing(self, None)

    monkeypatch.setattr(type(r), "padding_known", unknown)
    plain = encode_collection(r, ids, "doc", batch_size=2, pad_id=tok.pad_token_id)
    assert told == [None, None]
    for k in range(len(ids)):
        assert torch.equal(hinted.tokens(k), plain.tokens(k))


def test_out_of_memory_halves_variant_batches(colbert_with_head, monkeypatch):
    """A batch of more than 2 rows raises torch.OutOfMemoryError: it is retried in halves, with a warning and a
    count, and both variants equal the unsplit encoding (1e-6)."""
    r = colbert_with_head
    tok = r.tokenizer
    ids = tok(["one two three", "four five", "six", "seven eight nine ten"])["input_ids"]
    ((_, want),) = encode_stream(
        r, ids, "doc", batch_size=4, pad_id=tok.pad_token_id, forward=variants_forward(r, "doc", (WITH_HEAD, RAW))
    )
    real, retries = type(r).token_representations, []

    def limited(self, input_ids, attention_mask, side=None):
        if input_ids.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(self, input_ids, attention_mask, side=side)

    monkeypatch.setattr(type(r), "token_representations", limited)
    with pytest.warns(UserWarning, match="out of memory encoding doc texts on 4 rows"):
        split = list(
            encode_stream(
                r,
                ids,
                "doc",
                batch_size=4,
                pad_id=tok.pad_token_id,
                forward=variants_forward(r, "doc", (WITH_HEAD, RAW)),
                on_retry=retries.append,
            )
        )
    assert retries == [4] and len(split) == 1
    ((_, got),) = split
    for v in (WITH_HEAD, RAW):
        L = want[v].tokens.shape[1]
        torch.testing.assert_close(got[v].tokens[:, :L], want[v].tokens, atol=1e-6, rtol=0)
        assert torch.equal(got[v].mask[:, :L], want[v].mask)


def _tiny_test_setup(tmp_path, tiny_bert, model):
    return tiny_ranker_and_data(tmp_path, tiny_bert, model, eval_batch_size=7)


def _test_trainer(cb: IsotropyCallback, root) -> pl.Trainer:
    """A one-process CPU trainer for trainer.test with the isotropy callback `cb` only (no logger, no checkpoints)."""
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
        default_root_dir=str(root),
    )


@pytest.mark.parametrize("model", ["colbert", "repbert"])
def test_protocol_takes_the_evaluations_vectors(tmp_path, tiny_bert_nodropout, model, monkeypatch):
    """trainer.test in one process: the `paper` protocol measures the vectors the evaluation scored (kept by
    RankingModule.keep_vectors) and encodes nothing again; its values equal the protocol encoding every text
    itself (1e-5: the batches pad differently, so float32 sums differ in the last bits)."""
    module, dm = _tiny_test_setup(tmp_path, tiny_bert_nodropout, model)
    cb = IsotropyCallback(batch_pairs=8)
    encoded_again = []
    real = IsotropyCallback._measure_encoding
    monkeypatch.setattr(
        IsotropyCallback, "_measure_encoding", lambda self, *a: (encoded_again.append(1), real(self, *a))[1]
    )
    trainer = _test_trainer(cb, tmp_path / "out")
    trainer.test(module, datamodule=dm, verbose=False)
    got = module.results["test"]["isotropy"]
    assert encoded_again == [] and got["isotropy_paper_batches"] > 2
    assert module._kept == {}  # handed out once, nothing left held
    direct = SimpleNamespace(datamodule=dm, precision_plugin=SimpleNamespace(forward_context=contextlib.nullcontext))
    ref = cb.measure_paper(direct, module)  # no kept vectors now: it encodes the texts
    assert encoded_again == [1]
    paper = {k for k in ref if "paper" in k}
    assert paper and paper <= set(got)
    for key in paper:
        assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key


def test_protocol_encodes_again_when_the_kept_vectors_exceed_their_limit(tmp_path, tiny_bert_nodropout, monkeypatch):
    """With a keep limit smaller than the test's vectors, the evaluation stops keeping them with a warning (and leaves
    no spill file), and the protocol encodes its batches' texts itself: the same values as with the vectors kept."""
    module, dm = _tiny_test_setup(tmp_path, tiny_bert_nodropout, "colbert")
    out = tmp_path / "out"
    out.mkdir()
    results = {}
    for limit in (2**33, 1000):
        cb = IsotropyCallback(batch_pairs=8)
        cb.keep_bytes = limit
        trainer = _test_trainer(cb, out)
        if limit == 1000:
            with pytest.warns(UserWarning, match="scored vectors exceed"):
                trainer.test(module, datamodule=dm, verbose=False)
        else:
            trainer.test(module, datamodule=dm, verbose=False)
        results[limit] = module.results["test"]["isotropy"]
        assert module._kept == {} and not list(out.glob("encoded-*"))
    for key in (k for k in results[1000] if "paper" in k):
        assert results[1000][key] == pytest.approx(results[2**33][key], rel=1e-5, abs=1e-7), key


def test_discarded_writer_leaves_no_spill_file(tmp_path):
    rng = np.random.default_rng(2)
    batches, _, _ = _batches(rng, 10, 4, with_sequence=False)
    w = EncodedTextsWriter(10, budget_bytes=0, spill_dir=tmp_path)
    for rows, enc in batches:
        w.add(rows, enc)
    # spilled to a file that is unlinked as soon as it is made: a killed process leaves nothing in the folder
    assert w.nbytes == 4 * 4 * w.rows > 0 and w._file is not None and list(tmp_path.iterdir()) == []
    w.discard()
    assert list(tmp_path.iterdir()) == [] and w._file is None
