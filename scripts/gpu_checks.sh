#!/usr/bin/env bash
# The checks of docs/throughput.md and docs/language_models.md on one GPU, for a machine with one accelerator and marl_jax's dependencies:
# every experiment's size=gpu config (and the quickstart job) run briefly, all at once, then the
# throughput rows of the relay job, of wider agents and of Qwen3-0.6B-shaped agents (random weights)
# timed one at a time.  Prints a table per part; logs and workdirs go under OUT (default
# /tmp/gpu_checks, which must not hold an earlier run's workdirs).  At most about 12 minutes (its
# time limits; 8.5 minutes on an H200 with shorter ones).
#
#   bash scripts/gpu_checks.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/gpu_checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

# Qwen3-0.6B's shapes: its config.json (the fixture's with the 0.6B sizes) and the fixture's tokenizer
# grown to its 151 936 words (`marl_jax.lm.bench.write_shapes`); with random weights nothing else is read.
QWEN=$OUT/qwen3_0.6b_shapes
python -c "import sys; from marl_jax.lm import bench; bench.write_shapes('qwen3-0.6b', sys.argv[1])" "$QWEN"

SHORT=(--config.total_steps=30 --config.eval_every=30 --config.checkpoint_every=30 --config.log_every=10
       --config.sft.steps=30)
smoke() {  # name, config, flags...: a main job stopped after 4 minutes at most
  local name=$1 config=$2 start=$SECONDS
  shift 2
  timeout -k 15 240 python -m marl_jax.main --config="$config" --workdir="$OUT/wd_$name" "$@" \
      > "$OUT/$name.log" 2>&1
  echo "$name rc=$? wall=$((SECONDS - start))s" >> "$OUT/smoke.txt"
}
smoke quickstart experiments/quickstart.py &
for e in single_agent solver_verifier vote debate delegate best_of_n; do
  smoke "${e}_gpu" "experiments/$e.py:size=gpu" "${SHORT[@]}" &
done
smoke multi_chain_gpu experiments/tasks.py:task=multi_chain,size=gpu "${SHORT[@]}" &
smoke lm_sv_gpu "experiments/lm_solver_verifier.py:size=gpu,checkpoint=$QWEN,random_weights=true" "${SHORT[@]}" &
wait
sort "$OUT/smoke.txt"
python - "$OUT" <<'EOF'
import glob, json, os, sys
for workdir in sorted(glob.glob(f"{sys.argv[1]}/wd_*")):
  path = f"{workdir}/metrics.jsonl"
  rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
  last = {k: v for row in rows for k, v in row.items()}
  shown = {k: last[k] for k in ("step", "accuracy", "eval_accuracy", "tokens_per_s") if k in last}
  print(f"{os.path.basename(workdir)[3:]:>20}: {len(rows)} logged rows, last {json.dumps(shown)}")
EOF

row() {  # name, time limit (s), throughput flags...
  local name=$1 limit=$2
  shift 2
  timeout -k 10 "$limit" python -m marl_jax.throughput --json="$OUT/throughput_$name.json" "$@" \
      > "$OUT/throughput_$name.log" 2>&1
  echo "== throughput $name rc=$?"
  grep -v -E "^[IWE][0-9]{4}|xla_bridge" "$OUT/throughput_$name.log" | tail -6
}
row relay 150 --grid=2/1,4 --credits=team,difference
row wide 90 --grid=2/1 --credits=team --d_model=512 --batch_size=2048 --steps_per_call=5
row qwen3_0.6b 200 --checkpoint="$QWEN" --random_weights --grid=2/1 --credits=team --batch_size=256 \
    --steps_per_call=2 --calls=2
