"""bench/bench_peers.py: the FLOP count it divides by, and one alternation round of our driver end to end."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_peers  # noqa: E402


def test_forward_flops_by_hand():
    cfg = {"hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 2}
    # per layer and token: Q, K, V, O (4 x 4x4) and the feed-forward (4x8, 8x4): 2 flops per multiply-add;
    # attention: QK^T and AV, L x L x d multiply-adds each
    per_layer = 3 * 2 * (4 * 16 + 2 * 32) + 2 * 2 * 3 * 3 * 4
    assert bench_peers.forward_flops(cfg, 3) == 2 * per_layer


def test_minilm_triplet_costs_about_25_gflop():
    cfg = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6}  # all-MiniLM-L6-v2
    # one 32-token and two 180-token forwards: linear 6 * 2 * 392 * 1769472 = 8.32e9, attention
    # 6 * 4 * 384 * (32^2 + 2 * 180^2) = 0.61e9; training = 3 x forward
    assert bench_peers.unit_flops(cfg, "colbert_train", 100) / 1e9 == pytest.approx(26.79, abs=0.01)


def test_unknown_tool_is_an_error():
    with pytest.raises(SystemExit):
        bench_peers.parse_args(["--tools", "ours,colbertv9"])


@pytest.mark.slow  # two driver processes (~30 s on the shared 2-core machine)
def test_one_round_of_ours(tiny_bert, tmp_path, capsys):
    out = tmp_path / "peers.json"
    res = bench_peers.main(["--tools", "ours", "--tasks", "colbert_train,rerank", "--backbone", tiny_bert, "--steps", "1",
                            "--warmup", "0", "--rounds", "1", "--rerank-queries", "1", "--candidates", "3",
                            "--matmul-n", "64", "--batch", "2", "--out", str(out)])
    saved = json.loads(out.read_text())
    for task in ("colbert_train", "rerank"):
        s = saved["summary"][task]["bf16"]["ours"]
        assert s["rate"] > 0 and s["peak_rss_mib"] > 0, s
        assert s["rate"] == pytest.approx(res["summary"][task]["bf16"]["ours"]["rate"])
    train = saved["runs"]["colbert_train"]["bf16"]["ours"][0]
    assert train["units"] == 2 and len(train["times"]) == 1
    assert "| colbert_train | bf16 |" in capsys.readouterr().out
