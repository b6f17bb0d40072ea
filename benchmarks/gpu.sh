#!/usr/bin/env bash
# One prepared GPU run (about 8 minutes on one H200): train-step throughput of the published
# sizes in float32 and bfloat16 and the embedding path (Embedder over 2,000 Zipfian sentences), one
# process per measurement, each line of
# results appended to $OUT/throughput.jsonl (or ./throughput.jsonl), and the LSTM loop's per-step
# floor (benchmarks/recurrence.py) to $OUT/recurrence.txt. Runs from the repository
# root with the machine's own jax/flax/optax (no install): PYTHONPATH=. bash benchmarks/gpu.sh
set -u
out="${OUT:-.}/throughput.jsonl"
export PYTHONPATH=.
# Allocate on demand, so peak_bytes_in_use is what the step needs, not a preallocated pool.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
run() {
  timeout 150 python3 benchmarks/throughput.py --steps=15 "$@" 2>&1 | tee /tmp/bench.log | tail -2
  tail -1 /tmp/bench.log | grep '^{' >> "$out" || echo "FAILED: $*" | tee -a "${OUT:-.}/failures.txt"
}
for dtype in bf16 f32; do
  run --config=original --per-device-batch=128 --dtype=$dtype
  run --config=original --per-device-batch=256 --dtype=$dtype
  run --config=original --per-device-batch=512 --dtype=$dtype
  run --config=medium --per-device-batch=256 --dtype=$dtype
  run --config=small --per-device-batch=256 --dtype=$dtype
  run --config=original --per-device-batch=256 --mode=embed --dtype=$dtype --steps=3
done
run --config=original --per-device-batch=256 --dtype=bf16 --scan-unroll=2
run --config=original --per-device-batch=256 --dtype=bf16 --scan-unroll=5
# The latency floor of the LSTM time loop (recurrent matmul + tanh per step, f32).
timeout 60 python3 benchmarks/recurrence.py --config=original --per-device-batch=256 2>&1 | tail -3 | tee -a "${OUT:-.}/recurrence.txt"
