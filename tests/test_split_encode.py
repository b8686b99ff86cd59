"""The collection's encoding split across processes (retrieval/split.py): each rank encodes every world-th window,
rank 0 reads the shares back as one process's batches, so the index is the one process's index.

In-process tests simulate the ranks (a share per rank, then the merge); the slow tests run `evaluate.py
retrieval=dense retrieval.devices=2` as two gloo processes and compare with one process."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cpu_windows, run_script, tiny_bi_encoders

from datamodules.docstore import fingerprint, open_store
from models.rankers import build_ranker
from models.rankers.repbert import RepBERTConfig
from retrieval.colbert_e2e import ColBERTIndex
from retrieval.dense import DenseIndex
from retrieval.encode import encode_docs, window_size
from retrieval.split import ShareWriter, read_shares, share_windows, split_encode


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 30))) for _ in range(n)]


DOCS = {f"d{i}": t for i, t in enumerate(_texts(53, 1))}  # 53: the last window is short


@pytest.fixture(scope="module")
def rankers(tiny_bert):
    return tiny_bi_encoders(tiny_bert)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """DOCS as a document store (row access: each rank reads only its windows' rows)."""
    folder = tmp_path_factory.mktemp("store")
    path = folder / "docs.tsv"
    path.write_text("".join(f"{k}\t{v}\n" for k, v in DOCS.items()))
    records = lambda: ((i, k, v) for i, (k, v) in enumerate(DOCS.items()))  # noqa: E731
    return open_store(folder / "cache", fingerprint("tsv-collection", [path]), records, str(path))


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_share_windows_cover_the_collection_once(store, world):
    """Rank r's windows are r, r + world, ...; all ranks together give every window once, the same from the store
    (rows read directly) as from a dict (walked)."""
    window = 8
    expected = [list(DOCS.items())[s : s + window] for s in range(0, len(DOCS), window)]
    for source in (store, DOCS):
        got = {}
        for rank in range(world):
            for w, items in share_windows(source, window, rank, world):
                assert w % world == rank and w not in got
                got[w] = items
        assert [got[w] for w in sorted(got)] == expected


def _shares(ranker, docs, parts: Path, world: int, output: str, batch_size: int = 4, sort_window: int = 10) -> None:
    """Every rank's share written in this process, as `split_encode` writes it in each rank."""
    window = window_size(batch_size, sort_window)
    for rank in range(world):
        writer = ShareWriter(parts / f"rank-{rank}")
        numbered = share_windows(docs, window, rank, world)
        for w, ids, out in cpu_windows(ranker, numbered, output=output, batch_size=batch_size):
            writer.add(w, ids, out)
        writer.finish()


@pytest.mark.parametrize("name,output", [("repbert", "sequence"), ("colbert", "tokens")])
@pytest.mark.parametrize("world", [2, 3])
def test_merged_shares_are_one_process_batches(rankers, store, tmp_path, name, output, world):
    """The merge yields the batches `encode_docs` yields in one process: same ids, same order, equal vectors (token
    vectors: the real tokens equal, the mask equal)."""
    ranker = rankers[name]
    one = list(encode_docs(ranker, None, DOCS, batch_size=4, sort_window=10, output=output))
    _shares(ranker, store, tmp_path, world, output)
    merged = list(read_shares(tmp_path, world))
    assert [ids for ids, _ in merged] == [ids for ids, _ in one]
    for (_, a), (_, b) in zip(merged, one):
        if output == "sequence":
            assert torch.equal(a, b)
        else:
            assert torch.equal(a.mask, b.mask)
            assert torch.equal(a.tokens[a.mask], b.tokens[b.mask])


@pytest.mark.parametrize("name", ["repbert", "colbert"])
def test_index_from_merged_shares_equals_one_process_index(rankers, store, tmp_path, name):
    """`build(encoded=...)` from the merged shares: the same rows, ids and search results as encoding in one process."""
    ranker = rankers[name]
    queries = {f"q{i}": t for i, t in enumerate(_texts(4, 2))}
    if name == "colbert":
        _shares(ranker, store, tmp_path, 2, "tokens", batch_size=4, sort_window=10)
        opts = dict(batch_size=4, sort_window=10, store_dtype="float32", store_dir=tmp_path / "stores")
        a = ColBERTIndex.build(ranker, DOCS, **opts)
        b = ColBERTIndex.build(ranker, DOCS, encoded=read_shares(tmp_path, 2), **opts)
        assert a.doc_ids == b.doc_ids and np.array_equal(a.offsets, b.offsets)
        assert np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
        search = dict(k=5, k_tokens=100000, depth=None)
    else:
        _shares(ranker, store, tmp_path, 2, "sequence", batch_size=4, sort_window=10)
        a = DenseIndex.build(ranker, DOCS, batch_size=4, sort_window=10)
        b = DenseIndex.build(ranker, DOCS, batch_size=4, sort_window=10, encoded=read_shares(tmp_path, 2))
        assert a.doc_ids == b.doc_ids
        assert np.array_equal(a.index.reconstruct_n(0, len(DOCS)), b.index.reconstruct_n(0, len(DOCS)))
        search = dict(k=5)
    assert a.search(queries, **search) == b.search(queries, **search)


def test_one_process_split_encode_is_encode_docs(rankers, tmp_path):
    """Without a process group the share is the whole collection and the parts folder is gone after the merge."""
    ranker = rankers["repbert"]
    parts = tmp_path / "parts"
    merged = list(split_encode(ranker, None, DOCS, parts, batch_size=4, sort_window=10, output="sequence"))
    one = list(encode_docs(ranker, None, DOCS, batch_size=4, sort_window=10, output="sequence"))
    assert [i for i, _ in merged] == [i for i, _ in one]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(merged, one))
    assert not parts.exists()


def test_incomplete_share_is_one_line(rankers, tmp_path):
    _shares(rankers["repbert"], DOCS, tmp_path, 2, "sequence")
    (tmp_path / "rank-1" / "done.json").unlink()
    with pytest.raises(Exception, match=r"rank-1.*not a complete share"):
        list(read_shares(tmp_path, 2))


COMMON = [
    "retrieval=dense",
    "data=synthetic",
    "data.num_docs=70",
    "data.num_train_queries=4",
    "data.num_val_queries=2",
    "data.num_test_queries=6",
    "logger=none",
    "retrieval.k=10",
    "retrieval.batch_size=8",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["repbert", "colbert"])
def test_two_processes_give_the_one_process_run(tiny_bert, tmp_path, name):
    """`evaluate.py retrieval=dense retrieval.devices=2`: two gloo processes encode a share each and rank 0 indexes:
    run.trec, metrics.json and the index's ids equal one process's; only rank 0 writes; no parts folder is left."""
    extra = (
        ["retrieval.k_tokens=100000", "retrieval.depth=null", "retrieval.store_dtype=float32"]
        if name == "colbert"
        else []
    )
    outs = {}
    for devices in (1, 2):
        out = tmp_path / f"d{devices}"
        run_script(
            "evaluate.py",
            *COMMON,
            *extra,
            f"model={name}",
            f"model.backbone={tiny_bert}",
            f"output_dir={out}",
            f"retrieval.devices={devices}",
            "seed=3",
        )
        outs[devices] = out
    one, two = outs[1], outs[2]
    assert (two / "run.trec").read_text() == (one / "run.trec").read_text()
    m1, m2 = (json.loads((o / "metrics.json").read_text()) for o in (one, two))
    assert {k: v for k, v in m1.items() if k != "retrieval"} == {k: v for k, v in m2.items() if k != "retrieval"}
    assert json.loads((one / "index" / "doc_ids.json").read_text()) == json.loads(
        (two / "index" / "doc_ids.json").read_text()
    )
    assert sorted(p.name for p in two.iterdir() if p.name.startswith(".")) == []  # the parts folder was removed


def _rank_main(rank: int, backbone: str, parts: str, port: int, fail_rank: int, results: str) -> None:
    """One gloo rank of `test_a_failed_rank_stops_every_rank`: rank `fail_rank` crashes in its encoder."""
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    ranker = build_ranker(RepBERTConfig(backbone=backbone)).eval()
    if rank == fail_rank:

        def broken(*a, **k):
            raise RuntimeError("simulated encoder fault")

        ranker.encode = broken
    try:
        out = split_encode(ranker, None, DOCS, parts, batch_size=4, sort_window=10, output="sequence")
        said = "merged" if out is not None else "none"
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        said = f"{type(e).__name__}: {e}"
    Path(results, f"rank-{rank}.txt").write_text(said)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("fail_rank", [0, 1])
def test_a_failed_rank_stops_every_rank(tiny_bert, tmp_path, fail_rank):
    """A rank whose encoding fails tells the others (no rank waits for it): rank 0 stops with one line naming the
    split encoding, the failed rank with its own error; the parts folder is removed."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parts, results = tmp_path / "parts", tmp_path / "results"
    results.mkdir()
    mp.spawn(_rank_main, args=(tiny_bert, str(parts), port, fail_rank, str(results)), nprocs=2, join=True)
    said = {r: (results / f"rank-{r}.txt").read_text() for r in (0, 1)}
    assert "simulated encoder fault" in said[fail_rank]
    if fail_rank == 1:
        assert said[0].startswith("InputError") and "rank 1 failed while encoding" in said[0]
    assert not parts.exists()
