#!/usr/bin/env bash
# One prepared GPU run (5 minutes on one H200 on 2026-12-04, before the lstm_cell=fused runs were
# added). Runs from the repository root with
# the machine's own jax/flax/optax/orbax (no install; ml_collections, which the device image of
# 2026-12 lacks, installed first from its wheel): PYTHONPATH=. bash benchmarks/gpu.sh
#   - train-step throughput of the original size in bfloat16 at 128 and 512 rows with a profile
#     of 3 traced steps (top ops by device time, the shares of the LSTM loops, token encoder,
#     softmax, sampler and optimizer, ops launched per step) and peak device memory, with the
#     defaults (the wavefront schedule, our Pallas LSTM cell and char CNN, after the tests,
#     run here on the GPU (Triton), that they compute what XLA's cell and char CNN do, to
#     $OUT/pallas_tests.txt, the sampled softmax's kernels' too) beside the gates' matmul fused
#     into our cell (lstm_cell=fused, never run on a device before: the first run settles it
#     against today's default), XLA's sampled softmax (softmax_kernel=xla: the default's before
#     2026-12-06, its kernels never run on a device either), XLA's cell and XLA's char CNN at 128
#     and 512 rows and a loop per layer (XLA's cell) at 128; the first run's trace and program
#     are kept for reading offline;
#     then the other sizes, float32, and the embedding path (Embedder, 2,000 Zipfian sentences);
#     one process per measurement, each result line appended to $OUT/throughput.jsonl and each
#     full log kept in $OUT/logs.tgz (with the trace);
#   - beside each measured train step, `elmo-jax plan`'s floor and expected step of the same
#     compiled program (throughput.py reads it), the table of them to
#     $OUT/estimate_vs_measured.txt, and for each profiled run its measured and expected
#     milliseconds per kernel class (in the logs: "by kernel class"). Then, on the machine with
#     the repository's history, refit the plan's rates with this run added (and say in
#     docs/PERFORMANCE.md which classes moved):
#       python -m benchmarks.speed.plan_rates --add=$OUT/throughput.jsonl --commit=SHA --date=YYYY-MM-DD
#   - the compiled step's loops under both schedules (critical_path.py) to $OUT/critical_path.txt;
#   - the LSTM stacks, wavefront against layer after layer, and the loop step's floor
#     (benchmarks/speed/recurrence.py) to $OUT/recurrence.txt.
# CPU mode (GPU_SH_CPU=1; `make gpu-cpu` runs it, and CI): every step of this script at toy sizes
# on the CPU (cpu_peer at 2 rows, one step each, the tests interpreted, the host path and `train`
# on a small text), so that the day a device is lent the script runs the first time and all of
# its time goes to measuring. Its numbers mean nothing.
set -u
dir="${OUT:-.}"
out="$dir/throughput.jsonl"
mkdir -p "$dir/logs"
export PYTHONPATH=.
# Allocate on demand, so peak_bytes_in_use is what the step needs, not a preallocated pool.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
cpu="${GPU_SH_CPU:-0}"
platform=cuda
python="${PYTHON:-python3}"
if [ "$cpu" = 1 ]; then platform=cpu; export JAX_PLATFORMS=cpu; fi
# The flags of a measurement, one a line; in CPU mode the same at toy sizes ($toy_steps: the
# flags that make a measuring script's steps few).
toy_steps=()
[ "$cpu" = 1 ] && toy_steps=(--steps=1)
sized() {
  if [ "$cpu" != 1 ]; then printf '%s\n' "$@"; return; fi
  for arg in "$@"; do
    case "$arg" in
      --config=*) echo --config=cpu_peer ;;
      --per_device_batch=*) echo --per_device_batch=2 ;;
      --profile=*) echo --profile=1 ;;
      --steps=*) ;;
      --lstm_cell=fused) echo --lstm_cell=xla ;;  # a CPU cannot run our kernels inside the data-parallel step
      *) echo "$arg" ;;
    esac
  done
  echo --unroll_steps=4
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$python -c "import jax; print('jax', jax.__version__, jax.devices())"
n=0
run() {
  n=$((n + 1))
  log="$dir/logs/$n.log"
  echo "$*" > "$log"
  mapfile -t flags < <(sized --steps=15 "$@")
  [ "$cpu" = 1 ] && flags+=("${toy_steps[@]}" --warmup=1 --plan_target=h200)
  timeout 150 $python -m benchmarks.speed.throughput "${flags[@]}" >> "$log" 2>&1
  grep -E 'tokens/s|^profile|Error' "$log"
  tail -1 "$log" | grep '^{' >> "$out" || echo "FAILED: $*" | tee -a "$dir/failures.txt"
}
# (tests/conftest.py runs the tests on the CPU unless JAX_PLATFORMS says otherwise)
{
  JAX_PLATFORMS=$platform timeout 240 $python -m pytest -q -p no:cacheprovider tests/test_lstm.py -k pallas 2>&1 | tail -3
  JAX_PLATFORMS=$platform timeout 240 $python -m pytest -q -p no:cacheprovider tests/test_softmax.py \
    -k pallas_sampled 2>&1 | tail -3
  JAX_PLATFORMS=$platform timeout 240 $python -m pytest -q -p no:cacheprovider tests/test_bilm.py \
    -k "pallas or many_blocks" 2>&1 | tail -3
} | tee "$dir/pallas_tests.txt"
grep -qE 'failed|error|no tests ran' "$dir/pallas_tests.txt" && echo "FAILED: the kernel tests" | tee -a "$dir/failures.txt"
run --config=original --per_device_batch=128 --dtype=bf16 --profile=3 --trace_dir="$dir/trace_128"
run --config=original --per_device_batch=128 --dtype=bf16 --profile=3 --lstm_schedule=wavefront --lstm_cell=fused
run --config=original --per_device_batch=128 --dtype=bf16 --profile=3 --softmax_kernel=xla
run --config=original --per_device_batch=128 --dtype=bf16 --profile=3 --lstm_cell=xla
run --config=original --per_device_batch=128 --dtype=bf16 --profile=3 --char_conv=xla
run --config=original --per_device_batch=128 --dtype=bf16 --profile=3 --lstm_schedule=layers
run --config=original --per_device_batch=512 --dtype=bf16 --profile=3
run --config=original --per_device_batch=512 --dtype=bf16 --profile=3 --lstm_schedule=wavefront --lstm_cell=fused
run --config=original --per_device_batch=512 --dtype=bf16 --softmax_kernel=xla
run --config=original --per_device_batch=512 --dtype=bf16 --lstm_cell=xla
run --config=original --per_device_batch=512 --dtype=bf16 --char_conv=xla
run --config=original --per_device_batch=256 --dtype=bf16
run --config=original --per_device_batch=128 --dtype=f32
run --config=original --per_device_batch=512 --dtype=f32
run --config=medium --per_device_batch=256 --dtype=bf16
run --config=small --per_device_batch=256 --dtype=bf16
run --config=original --per_device_batch=256 --mode=embed --dtype=bf16 --steps=3
for schedule in wavefront layers; do
  mapfile -t flags < <(sized --config=original --per_device_batch=128)
  timeout 120 $python -m benchmarks.speed.critical_path "${flags[@]}" --dtype=bf16 \
    --lstm_schedule=$schedule 2>&1 | grep -E '^matmul loop|dependent loop' | tee -a "$dir/critical_path.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || echo "FAILED: critical_path $schedule" | tee -a "$dir/failures.txt"
done
mapfile -t flags < <(sized --config=original --per_device_batch=128)
timeout 120 $python -m benchmarks.speed.recurrence "${flags[@]}" "${toy_steps[@]}" 2>&1 | tail -5 \
  | tee "$dir/recurrence.txt"
[ "${PIPESTATUS[0]}" = 0 ] || echo "FAILED: recurrence" | tee -a "$dir/failures.txt"
# The host's input path on this machine's cores (CPU devices: text to batches, against the
# plan's step times), then `train` end to end on the GPU at 512 rows over the same LM1B-layout
# text: its log windows' tokens/s and input-bound share, beside the step alone above.
text=(--shards=100 --tokens=20000000 --vocab=793471)
train=(--config=elmo_original --config.train.per_device_batch_size=512 --config.train.max_steps=300
  --config.train.log_every=50)
if [ "$cpu" = 1 ]; then
  text=(--shards=3 --tokens=30000 --vocab=3000 --shapes=1x4,2x4)
  train=(--config=demo --config.train.per_device_batch_size=4 --config.train.max_steps=3 --config.train.log_every=1)
fi
timeout 300 env JAX_PLATFORMS=cpu $python -m benchmarks.speed.host_path "${text[@]}" --batches=60 2>&1 \
  | grep -E 'rows:|^\{' | tee "$dir/host_path.txt"
[ "${PIPESTATUS[0]}" = 0 ] || echo "FAILED: host_path" | tee -a "$dir/failures.txt"
tmp=$($python -c 'import tempfile; print(tempfile.gettempdir())')  # where host_path made its text
lm1b="$tmp/elmo_jax_host_path_${text[0]#--shards=}_${text[1]#--tokens=}_${text[2]#--vocab=}"
timeout 420 $python launch.py train "${train[@]}" --workdir="$dir/train_e2e" --config.data.train="lm1b:$lm1b" \
  --config.data.vocab="$lm1b/vocab.txt" --config.data.heldout= --config.train.compute_dtype=bfloat16 \
  --config.train.checkpoint_every=100000 2>&1 | grep -E 'step [0-9]+/|input|Error' | tee "$dir/train_e2e.txt"
grep -q 'step [0-9]*/' "$dir/train_e2e.txt" || echo "FAILED: train end to end" | tee -a "$dir/failures.txt"
rm -rf "$dir/train_e2e"
# The same run with the gates' matmul fused into the cell (lstm_cell=fused, which CPUs cannot run
# inside the data-parallel step: on a GPU only).
if [ "$cpu" != 1 ]; then
  timeout 420 $python launch.py train "${train[@]}" --workdir="$dir/train_e2e" --config.data.train="lm1b:$lm1b" \
    --config.data.vocab="$lm1b/vocab.txt" --config.data.heldout= --config.train.compute_dtype=bfloat16 \
    --config.train.checkpoint_every=100000 --config.train.lstm_schedule=wavefront --config.train.lstm_cell=fused \
    2>&1 | grep -E 'step [0-9]+/|input|Error' | tee "$dir/train_e2e_fused.txt"
  grep -q 'step [0-9]*/' "$dir/train_e2e_fused.txt" || echo "FAILED: train end to end, fused" | tee -a "$dir/failures.txt"
  rm -rf "$dir/train_e2e"
fi
# Each measured train step beside the plan's estimate of the same program.
$python - "$out" <<'EOF' | tee "$dir/estimate_vs_measured.txt"
import json, sys

print("config | dtype | rows | LSTM schedule | LSTM cell | char CNN | softmax | measured ms | floor ms | "
      "measured / floor | expected ms | measured / expected")
for line in open(sys.argv[1]):
    r = json.loads(line)
    e = r.get("estimate")
    if r["mode"] == "train" and e:
        print(
            f"{r['config']} | {r['dtype']} | {r['per_device_batch']} | {r['lstm_schedule']} | {r.get('lstm_cell', 'xla')} | "
            f"{r.get('char_conv', 'xla')} | {r.get('softmax_kernel', 'xla')} | "
            f"{1000 * r['step_time_s']:.1f} | {1000 * e['step_s']:.1f} | {e['measured_over_estimate']:.2f} | "
            f"{1000 * (e.get('expected_step_s') or float('nan')):.1f} | {e.get('measured_over_expected') or float('nan'):.2f}"
        )
EOF
[ "$(wc -l < "$dir/estimate_vs_measured.txt")" -gt 1 ] || echo "FAILED: no step beside its estimate" \
  | tee -a "$dir/failures.txt"
# The device tool brings back at most 8 files: the logs and the first run's trace, packed.
tar czf "$dir/logs.tgz" -C "$dir" logs trace_128 && rm -rf "$dir/logs" "$dir/trace_128"
