"""bench/bench_heads.py (`python -m bench.bench_heads key=value ...`) end to end at tiny sizes: both arms (the
representation cache and re-encoding every epoch) train their epochs on the same token vectors, so the bench keeps
running as the cache's encoder changes (its re-encode arm calls the cache's own `_vectors`)."""

import json
import math

from conftest import require_shared_data

from bench import bench_heads


def test_both_arms_train_from_the_same_vectors(tmp_path, tiny_bert):
    require_shared_data("squad_v1.1_dev/dev-v1.1.json.gz")
    out = tmp_path / "heads.json"
    argv = [f"backbone={tiny_bert}", "paragraphs=3", "questions=4", "heldout_paragraphs=1", "epochs=2"]
    result = bench_heads.main([*argv, "batch_size=64", "encode_batch=4", "threads=1", f"out={out}"])
    assert json.loads(out.read_text())["cache_vectors"] == result["cache_vectors"] > 0
    assert len(result["cached_epoch_s"]) == len(result["reencode_epoch_s"]) == len(result["in_ram_epoch_s"]) == 2
    nll = result["heldout_nll"]
    assert set(nll) == {"untrained", "cached", "reencode"} and all(math.isfinite(v) for v in nll.values())
