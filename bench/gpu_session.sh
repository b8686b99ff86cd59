#!/usr/bin/env bash
# On the lent GPU machine: install what `python -m bench.gpu_carry` put in .gpu/ and run a GPU bench into $OUT.
#
#   bash bench/gpu_session.sh [bench_gpu_speed | bench_gpu] [key=value ...]
#   run(command="bash bench/gpu_session.sh only=colbert-train,dense-encode budget_s=450", carry=[".gpu"], timeout_s=600)
#   GPU_CARRY=/tmp/gpu311 bash bench/gpu_session.sh tiny=true ...      # a rehearsal on a CPU (docs/performance.md)
#
# The bench (default bench_gpu_speed) gets the carried tokenizer and places, then the arguments (the last of a key
# wins). Back in $OUT: bench_gpu_speed's dated record (.md, .tsv) and gpu-speed.json, or bench_gpu's gpu.json, and the
# whole log. bench_gpu_speed's budget (budget_s) ends it inside the tool's 10-minute limit; its JSON is copied to $OUT
# every 10 s, so what ran comes back even when the limit cuts the run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu-session-out}
SITE=${GPU_SITE:-/tmp/gpu-site}
WORK=${GPU_WORK:-/tmp/bench-gpu-speed}
PY=${PYTHON:-python3}
C=${GPU_CARRY:-.gpu} # what bench/gpu_carry.py wrote
BENCH=bench_gpu_speed
if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then
    BENCH=$1
    shift
fi
case "$BENCH" in
    bench_gpu_speed)
        ARGS=(tokenizer="$C/tokenizer" pylate_wheelhouse="$C/pylate-wheelhouse" carried="$C/wheels"
            record_dir="$OUT" work_dir="$WORK")
        JSON="$WORK/gpu-speed.json" ;;
    bench_gpu)
        ARGS=(tokenizer="$C/tokenizer" work_dir="$WORK/bench-gpu" out="$OUT/gpu.json")
        JSON="" ;;
    *) echo "gpu_session: no bench '$BENCH': bench_gpu_speed or bench_gpu"; exit 2 ;;
esac
mkdir -p "$OUT" "$WORK"
for need in "$C/wheels" "$C/tokenizer" "$C/COMMIT"; do
    [ -e "$need" ] || { echo "gpu_session: $need missing: run \`python -m bench.gpu_carry\` and carry $C"; exit 2; }
done
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$C"/wheels/*.whl \
    || { echo "gpu_session: installing $C/wheels into $SITE failed"; exit 1; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 BENCH_COMMIT="$(cat "$C/COMMIT")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
copier=""
if [ -n "$JSON" ]; then
    ( while sleep 10; do cp -f "$JSON" "$OUT/" 2>/dev/null; done ) &
    copier=$!
fi
"$PY" -m "bench.$BENCH" "${ARGS[@]}" "$@" 2>&1 | tee "$OUT/$BENCH.log"
rc=${PIPESTATUS[0]}
if [ -n "$copier" ]; then
    kill "$copier" 2>/dev/null
    cp -f "$JSON" "$OUT/" 2>/dev/null
fi
exit "$rc"
