#!/usr/bin/env bash
# Reproduces docs/results/generations.md: generations, newcomers, cross-play and retention on the
# signalling game (experiments/generations.py:task=signalling, k = 2 attributes x v = 4 values, the
# sender's alphabet 4 letters), 10 vmapped seeds per cell on two disjoint seed sets (0 and 1000).
# Shrunk to fit a shared 2-core CPU: 100 RL steps a
# generation at rl.batch_size 128, evaluation every 10 steps on 256 problems, archives of 256 training
# problems per seed and 100 distillation steps; retention on arithmetic (A: additions, B:
# multiplications, mod 10) with 300 warm-start steps and 50 RL steps a task.
# Cell by cell in the order the page needs them, so a partial run holds the paired seed sets of the
# first comparison: generations 0 (from scratch) and 1 (distilled from 0) on both seed sets, then
# cross-play of generation 0's teams, generation 2, the newcomers (to generation 0's team, then fresh
# ones to generations 1 and 2's), and retention.  Resumable: a
# finished cell is not re-run (each command skips what it finished), an interrupted one resumes from
# its last checkpoint.
# Usage: scripts/generations_results.sh [OUT] [CELLS]   CELLS: any of "generations crossplay
# generation2 newcomers later_newcomers retention retention_mul control" (default all of them, in that
# order; later_newcomers: fresh receivers joining generations 1 and 2's teams, after generation2;
# retention_mul: retention with A = multiplications, B = additions; control: the compute-matched
# control, generation 0's run from scratch for as many update steps as generation 2's lineage had,
# distillation steps included, evaluated on the way at each generation's count).  SIZE=tiny runs every cell in
# seconds (2 seeds, 4 steps, the tiny model: tests/generations_test.py); SEEDS="0" runs one seed set.
set -euo pipefail
out=${1:-workdirs/generations}
cells=${2:-generations crossplay generation2 newcomers later_newcomers retention retention_mul control}
size=${SIZE:-cpu}
seed_sets=${SEEDS:-0 1000}
# Each run's settings beside the config's (signalling at lr 1e-3 with the entropy bonus).
if [ "$size" = tiny ]; then
  steps=4 distil=4 archive_size=64 filter=all  # a team trained for seconds is seldom right
  run_settings=(num_seeds=2 total_steps=$steps eval_every=2 log_every=2 checkpoint_every=2 eval.size=16)
  retention_settings=(num_seeds=2 eval.size=16)
else
  steps=100 distil=100 archive_size=256 filter=right
  run_settings=(num_seeds=10 total_steps=$steps eval_every=10 log_every=10 checkpoint_every=50 eval.size=256
                rl.batch_size=128)
  retention_settings=(num_seeds=10 total_steps=50 eval_every=10 log_every=10 checkpoint_every=50 eval.size=256
                      sft.steps=300)
fi
prefixed() {  # prefixed PREFIX [SETTINGS...]: SETTINGS (default run_settings) as --config.PREFIXKEY=VALUE flags
  local prefix=${1:-}
  shift $(( $# > 0 ))
  if [ $# = 0 ]; then set -- "${run_settings[@]}"; fi
  for s in "$@"; do echo "--config.$prefix$s"; done
}
generations() {  # generations SEED N [WORKDIR [SETTINGS...]]: the first N generations of seed set SEED
  local seed=$1 n=$2 workdir=${3:-$out/seed$1}
  shift $(( $# < 3 ? $# : 3 ))
  python -m marl_jax.tools.generations --config=experiments/generations.py:task=signalling,size=$size \
    --workdir="$workdir" --config.generations="$n" --config.distil.steps=$distil \
    --config.archive.size=$archive_size --config.run.seed="$seed" $(prefixed run. "$@")
}
archive() {  # the archive generation 0 of seed set $1 left for the next generation
  echo "$out/seed$1/gen0/transcripts/marl_transcripts/train$archive_size-step$steps-sampled"
}
newcomer() {  # newcomer SEED NAME GEN [FLAGS...]: a fresh receiver joins generation GEN's team, its sender frozen
  local seed=$1 name=$2 gen=$3 dir="$out/seed$1/newcomer_$2"
  [ "$gen" = 0 ] || dir=${dir}_gen$gen
  shift 3
  if [ ! -f "$dir/recovery.json" ]; then
    python -m marl_jax.main --config=experiments/tasks.py:task=signalling,size=$size --workdir="$dir" \
      --config.seed="$seed" --config.rl.entropy_coef=0.01 --config.optim.learning_rate=1e-3 $(prefixed) \
      --config.init_from="$out/seed$seed/gen$gen" --config.newcomers.roles=receiver --config.roles.trainable=0,1 "$@" > /dev/null
    python -m marl_jax.tools.newcomer_report --workdir="$dir" --out="$dir/recovery.json"
  fi
}
retention() {  # retention SEED REPLAY [ORDER]: arithmetic, task A then B (ORDER add_mul: additions then
  # multiplications, the default; mul_add: the other way), B's warm start replaying REPLAY of A's archive
  local seed=$1 replay=$2 order=${3:-add_mul}
  local name=retention stages='task.ops=+;task.ops=*'
  if [ "$order" = mul_add ]; then name=retention_mul stages='task.ops=*;task.ops=+'; fi
  local dir="$out/seed$1/${name}_replay$replay" first="$out/seed$1/${name}_replay0"
  mkdir -p "$dir"
  # Every variant carries on from the same team of task A: the first variant's generation 0.
  if [ "$dir" != "$first" ] && [ ! -d "$dir/gen0" ]; then cp -r "$first/gen0" "$dir/gen0"; fi
  python -m marl_jax.tools.generations --config=experiments/generations.py:task=arithmetic,size=$size --workdir="$dir" \
    --config.generations=2 --config.inherit=team --config.stages="$stages" --config.replay="$replay" \
    --config.distil.filter=$filter \
    --config.archive.size=$archive_size --config.run.seed="$seed" $(prefixed run. "${retention_settings[@]}")
}
for cell in $cells; do
  case $cell in
    generations)
      for seed in $seed_sets; do generations $seed 2; done;;
    crossplay)
      for seed in $seed_sets; do
        [ -f "$out/seed$seed/crossplay.json" ] ||
          python -m marl_jax.tools.crossplay --workdirs="$out/seed$seed/gen0" --out="$out/seed$seed/crossplay.json"
      done;;
    generation2)
      for seed in $seed_sets; do generations $seed 3; done;;
    newcomers)
      for seed in $seed_sets; do
        newcomer $seed fresh 0
        newcomer $seed distilled 0 --config.newcomers.distil=true --config.sft.steps=$distil \
          --config.sft.transcripts="$(archive $seed)" --config.sft.filter=$filter
      done;;
    later_newcomers)  # do conventions get easier to learn generation after generation?
      for seed in $seed_sets; do
        newcomer $seed fresh 1
        newcomer $seed fresh 2
      done;;
    retention)
      for seed in $seed_sets; do
        retention $seed 0
        retention $seed 0.5
      done;;
    retention_mul)  # task A that the budget learns (multiplications), then additions
      for seed in $seed_sets; do
        retention $seed 0 mul_add
        retention $seed 0.5 mul_add
      done;;
    control)  # generation 2's lineage had 3 runs of $steps RL steps and 2 distillations of $distil
      for seed in $seed_sets; do
        generations $seed 1 "$out/seed$seed/control" "${run_settings[@]/#total_steps=*/total_steps=$((3 * steps + 2 * distil))}"
      done;;
    *) echo "unknown cell $cell; allowed: generations crossplay generation2 newcomers later_newcomers retention retention_mul control" >&2
       exit 1;;
  esac
done
