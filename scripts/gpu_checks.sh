#!/usr/bin/env bash
# The checks of docs/lm_speed.md, docs/throughput.md and docs/language_models.md on one GPU, in parts:
#   lm          language-model agents at Qwen3-0.6B's shapes (random weights, bfloat16): tools.lm_bench's
#               prefill, decode, update and step rows against the chip's bounds and transformers, then
#               the word-problem job (experiments/lm_word_problems.py:size=gpu) through its warm start,
#               first evaluation and three train steps, with its peak memory.  At most 7.5 minutes.
#   lm_sv       the same job with protocol=solver_verifier, the largest that size=gpu fits on 80 GB.
#               At most 4 minutes.
#   lm_blocks   whether a KV cache in blocks pays on the GPU (on CPU it does): tools.lm_bench's step rows at a
#               384-position canvas with the cache in one block (the GPU's default) and in blocks of 64.
#               At most 2.5 minutes.
#   smoke       every experiment's size=gpu config (and the quickstart job) run briefly, all at once.
#               At most 4 minutes.
#   throughput  the throughput rows of the relay job, of wider agents and of Qwen3-0.6B-shaped agents,
#               one at a time.  At most 7.5 minutes.
#   workers     the wide job's rows at W = 2, 16 and 64 in one run (docs/throughput.md, many workers):
#               the cost per worker-episode at W = 64 against W = 2, whose goal is 1.5x.  At most 5 minutes.
# Prints a table per part; logs, JSON rows and workdirs go under OUT (default /tmp/gpu_checks, which
# must not hold an earlier run's workdirs).  On a device machine, carry .whl (scripts/gpu_wheels.sh):
# where the packages its image lacks do not import, they are installed from it first.
#
#   bash scripts/gpu_checks.sh [OUT [PART ...]]     (default parts: lm smoke throughput)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/gpu_checks}
shift $(($# > 0 ? 1 : 0))
PARTS=("${@:-lm smoke throughput}")
for part in ${PARTS[@]}; do  # a bad part is refused before anything runs
  case $part in lm|lm_sv|lm_blocks|smoke|throughput|workers) ;; *)
    echo "unknown part $part; allowed: lm lm_sv lm_blocks smoke throughput workers"; exit 2 ;; esac
done
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PY:-python3}
if [ -d .whl ] && ! $PY -c "import ml_collections, tensorflow_datasets, grain" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
echo "device: $($PY -c 'from marl_jax.tools import bounds; print(bounds.device_name())')"

# Qwen3-0.6B's shapes: its config.json (the fixture's with the 0.6B sizes) and the fixture's tokenizer
# grown to its 151 936 words (`marl_jax.tools.lm_bench.write_shapes`); with random weights nothing else is read.
QWEN=$OUT/qwen3_0.6b_shapes
$PY -c "import sys; from marl_jax.tools import lm_bench; lm_bench.write_shapes('qwen3-0.6b', sys.argv[1])" "$QWEN"

run_job() {  # name, time limit (s), config, flags...: a main job, its exit status and wall time
  local name=$1 limit=$2 config=$3 start=$SECONDS
  shift 3
  timeout -k 15 "$limit" $PY -m marl_jax.main --config="$config" --workdir="$OUT/wd_$name" "$@" \
      > "$OUT/$name.log" 2>&1
  echo "$name rc=$? wall=$((SECONDS - start))s" >> "$OUT/jobs.txt"
}
last_metrics() {  # the last value of each headline metric in each workdir named
  $PY - "$@" <<'EOF'
import json, os, sys
for workdir in sys.argv[1:]:
  path = f"{workdir}/metrics.jsonl"
  rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
  last = {k: v for row in rows for k, v in row.items()}
  shown = {k: last[k] for k in ("step", "accuracy", "eval_accuracy", "tokens_per_s", "device_peak_gib")
           if k in last}
  print(f"{os.path.basename(workdir)[3:]:>20}: {len(rows)} logged rows, last {json.dumps(shown)}")
EOF
}
# The word-problem job at size=gpu, briefly: 560 questions (the fixture's seven, repeated) so that an
# evaluation of 64 fits, a warm start of 10 steps, evaluations at steps 0 and 3.
word_problems() {  # name, time limit (s), protocol
  local data=$OUT/word_problems.jsonl
  [ -f "$data" ] || for _ in $(seq 80); do cat tests/fixtures/word_problems/gsm8k_tiny.jsonl; done > "$data"
  run_job "$1" "$2" "experiments/lm_word_problems.py:size=gpu,protocol=$3,checkpoint=$QWEN,path=$data" \
      --config.model.random_weights=true --config.steps_per_call=1 --config.total_steps=3 --config.eval_every=3 \
      --config.checkpoint_every=3 --config.log_every=1 --config.sft.steps=10 --config.eval.size=64
  grep "$1 rc" "$OUT/jobs.txt"
  grep -E "FATAL|Error" "$OUT/$1.log" | tail -3
  last_metrics "$OUT/wd_$1"
}

part_lm() {
  echo "== tools.lm_bench, Qwen3-0.6B's shapes, bfloat16, against transformers"
  timeout -k 10 270 $PY -m marl_jax.tools.lm_bench --shapes=qwen3-0.6b --batch=32 --prompt=160 --answer=160 \
      --dtype=bfloat16 --microbatch=8 --rows prefill decode update step --peer=transformers \
      --out="$OUT/lm_bench.json" > "$OUT/lm_bench.log" 2>&1
  echo "tools.lm_bench rc=$?"
  grep -v -E "^[IWE][0-9]{4}|xla_bridge|Warning|warn" "$OUT/lm_bench.log" | tail -14
  echo "== the word-problem job, size=gpu, single"
  word_problems wp_single 170 single
}
part_lm_sv() {
  echo "== the word-problem job, size=gpu, solver_verifier"
  word_problems wp_solver_verifier 230 solver_verifier
}
part_lm_blocks() {
  for block in 384 64; do
    echo "== tools.lm_bench step rows, Qwen3-0.6B's shapes, bfloat16, batch 32, KV cache in blocks of $block"
    timeout -k 10 70 $PY -m marl_jax.tools.lm_bench --shapes=qwen3-0.6b --batch=32 --prompt=7 --answer=376 \
        --dtype=bfloat16 --rows step --repeats=5 --cache_block=$block > "$OUT/lm_blocks_$block.log" 2>&1
    echo "tools.lm_bench rc=$?"
    grep -E "^\| step|costs" "$OUT/lm_blocks_$block.log"
  done
}
part_smoke() {
  SHORT=(--config.total_steps=30 --config.eval_every=30 --config.checkpoint_every=30 --config.log_every=10
         --config.sft.steps=30)
  run_job quickstart 240 experiments/quickstart.py &
  for e in single_agent solver_verifier vote debate delegate best_of_n; do
    run_job "${e}_gpu" 240 "experiments/$e.py:size=gpu" "${SHORT[@]}" &
  done
  run_job multi_chain_gpu 240 experiments/tasks.py:task=multi_chain,size=gpu "${SHORT[@]}" &
  run_job lm_sv_gpu 240 "experiments/lm_solver_verifier.py:size=gpu,checkpoint=$QWEN,random_weights=true" "${SHORT[@]}" &
  wait
  echo "== smoke"
  grep -E "gpu rc|quickstart rc" "$OUT/jobs.txt" | sort
  last_metrics "$OUT"/wd_*_gpu "$OUT/wd_quickstart"
}
row() {  # name, time limit (s), throughput flags...
  local name=$1 limit=$2
  shift 2
  timeout -k 10 "$limit" $PY -m marl_jax.tools.throughput --json="$OUT/throughput_$name.json" "$@" \
      > "$OUT/throughput_$name.log" 2>&1
  echo "== throughput $name rc=$?"
  grep -v -E "^[IWE][0-9]{4}|xla_bridge" "$OUT/throughput_$name.log" | tail -6
}
part_throughput() {
  row relay 150 --grid=2/1,4 --credits=team,difference
  row wide 90 --grid=2/1 --credits=team --d_model=512 --batch_size=2048 --steps_per_call=5
  row qwen3_0.6b 200 --checkpoint="$QWEN" --random_weights --grid=2/1 --credits=team --batch_size=256 \
      --steps_per_call=2 --calls=2
}
part_workers() {
  row workers 300 --workers=2,16,64 --calls=2
}

for part in ${PARTS[@]}; do
  "part_$part"
done
