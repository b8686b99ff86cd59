"""Per-tool drivers of bench/bench_peers.py, each run in its own process as `python -m bench.peers.<driver> SPEC OUT`
from the repository root (the peers' with the python of their own venv: `common` and the peer drivers import only
the standard library, torch and the peer)."""
