"""bf16 on a CPU without bf16 kernels: core/precision.py's test of the CPU, and the warning of every bf16 setting."""

from __future__ import annotations

import platform
import warnings
from pathlib import Path

import pytest
import torch

import core.precision
from core.precision import cpu_bf16_native, warn_emulated_bf16


def test_native_bf16_follows_the_cpu_flags():
    """oneDNN has bf16 kernels where the CPU has AVX-512 F/BW/VL/DQ (its `avx512_core`) or AMX-BF16: read here from
    /proc/cpuinfo, independently of PyTorch."""
    info = Path("/proc/cpuinfo")
    if platform.machine() not in ("x86_64", "AMD64") or not info.is_file():
        pytest.skip("reads the x86 flags of /proc/cpuinfo (Linux on x86-64)")
    flags = set(next(ln for ln in info.read_text().splitlines() if ln.startswith("flags")).split(":", 1)[1].split())
    want = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags or "amx_bf16" in flags
    assert cpu_bf16_native() is want


@pytest.mark.parametrize("native", [False, True])
def test_every_bf16_setting_warns_on_a_cpu_without_kernels(tmp_path, monkeypatch, native):
    """trainer.precision (the trainer), retrieval precision (encoding) and analysis.bf16 (the MLM head fit) each name
    their key and the fp32 value in one warning on a CPU without bf16 kernels, however often a run asks (the head
    stage asks for its representations and its trainer); none on one with them, or on a GPU."""
    from analyses.vocab.fit_mlm_head import train_head
    from analyses.vocab.mlm_head import MLMHead
    from pipeline.config import compose
    from pipeline.stages import build_trainer
    from retrieval.encode import autocast

    monkeypatch.setattr(core.precision, "cpu_bf16_native", lambda: native)
    monkeypatch.setattr(core.precision, "_warned", set())
    head = MLMHead(torch.randn(20, 8))
    runs = {
        "trainer.precision=bf16-mixed": lambda: build_trainer(
            compose(["trainer.precision=bf16-mixed", "trainer.accelerator=cpu", f"output_dir={tmp_path}"]), None, False
        ),
        "precision=bf16": lambda: autocast(torch.device("cpu"), "bf16"),
        "analysis.bf16=true": lambda: train_head(
            head, torch.randn(4, 8), torch.tensor([1, 2, 3, 4]), 1, 1e-3, 4, 0, log=lambda *_: None, bf16=True
        ),
    }
    fast = {"trainer.precision=bf16-mixed": "32-true", "precision=bf16": "fp32", "analysis.bf16=true": "false"}
    for setting, run in runs.items():
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            run()
            run()
        ours = [str(w.message) for w in got if "no bf16 kernels" in str(w.message)]
        if native:
            assert ours == [], setting
        else:
            key = setting.split("=")[0]
            assert len(ours) == 1 and ours[0].startswith(f"{setting} on this CPU"), (setting, ours)
            assert ours[0].endswith(f"{key}={fast[setting]} is faster here") and "\n" not in ours[0]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert warn_emulated_bf16("trainer.precision", "bf16-mixed", "cuda", "32-true") is False
    assert not got


# ---- trainer.float32_matmul_precision ----------------------------------------------------------------------------
def test_float32_matmul_precision_auto_is_high_on_cuda_only(monkeypatch):
    """`auto` sets torch's "high" (TF32) for a CUDA run and nothing on the CPU, where the setting would reach oneDNN;
    any other value is set as given."""
    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    assert core.precision.set_matmul_precision("auto", "cpu") is None and calls == []
    assert core.precision.set_matmul_precision("auto", "cuda") == "high" and calls == ["high"]
    assert core.precision.set_matmul_precision("medium", "cpu") == "medium" and calls == ["high", "medium"]


@pytest.mark.parametrize("value,want", [("auto", []), ("highest", ["highest"]), ("medium", ["medium"])])
def test_float32_matmul_precision_reaches_the_trainer(tmp_path, monkeypatch, value, want):
    """build_trainer applies the key (not a Lightning argument: a Trainer given it would refuse to start)."""
    from conftest import small_run

    from pipeline.config import compose
    from pipeline.stages import build_trainer

    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    cfg = compose(small_run(f"trainer.float32_matmul_precision={value}", f"output_dir={tmp_path}"))
    trainer = build_trainer(cfg, None, checkpoints=False)
    assert trainer.strategy.root_device.type == "cpu" and calls == want
