#!/usr/bin/env bash
# Credit against team size (issue 65): the orchestrator and W workers of experiments/delegate.py on the
# wide task (W two-operation chains, or OPS, answered as the list of their values, scored per part: with
# one operation the warm-started workers are right on 99.7 % of their parts, nothing left to train), every
# worker trained (one shared parameter set) or every worker frozen at its warm start (PARL's setting),
# under each credit estimator: team reward, per-role (a worker's own report), difference (counterfactual
# re-runs), Shapley (Monte Carlo) and the role baseline; at W = 2, 8 and 32 (WORKERS), 10 vmapped seeds
# on two disjoint seed sets (0 and 1000, or SEEDS).  Every cell of one W and seed set starts from that
# W's warm start (a base run of step 0 alone), so cells are paired seed by seed.  Cell by cell, the
# smallest W first and each on both seed sets before the next, so a partial run holds paired sets;
# resumable (a finished cell is not re-run, an interrupted one resumes from its last checkpoint).  Then
# each seed set's table (`python -m marl_jax.tools.report`: final accuracy, each worker's own accuracy,
# PARL's critical steps and the workers used, with TARGET the steps to it) and each trained cell against
# its frozen twin and against team credit (Welch).
# Usage: [SIZE=tiny] [WORKERS="2 8 32"] [CREDITS="team ..."] [SEEDS="0 1000"] [OPS=2] [TARGET=PCT] scripts/wide_credit_results.sh [OUT]
#   SIZE=tiny: the tests' variant (seconds a cell); TARGET: an evaluated accuracy (%) whose steps to reach
#   it each table gives (`report --target`, at the resolution of the evaluations, every 20 steps).
set -euo pipefail
out=${1:-workdirs/wide_credit}
size=${SIZE:-cpu}
steps=4  # the tiny size's total_steps
[[ $size == tiny ]] || steps=100
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$out/compilation_cache}
config() {  # config W CREDIT TRAINED: the cell's --config flag
  echo "--config=experiments/delegate.py:size=$size,task=wide,workers=$1,credit=$2,trainable_workers=$3,ops=${OPS:-2}"
}
done_at() { [[ -d $1/checkpoints/$2 ]]; }  # done_at WORKDIR STEP: its checkpoint of STEP is saved
credits=${CREDITS:-team per_role difference shapley role_baseline}
report=(python -m marl_jax.tools.report ${TARGET:+--target=$TARGET})
for W in ${WORKERS:-2 8 32}; do
  for seed in ${SEEDS:-0 1000}; do
    dir=$out/seed$seed/W$W
    done_at "$dir/base" 0 ||
      python -m marl_jax.main "$(config "$W" team 1)" --workdir="$dir/base" --config.seed="$seed" \
        --config.total_steps=0 > /dev/null
    for name in $credits; do
      for trained in 1 0; do
        cell=$dir/${name}_$([[ $trained == 1 ]] && echo trained || echo frozen)
        done_at "$cell" $steps ||
          python -m marl_jax.main "$(config "$W" "$name" $trained)" --workdir="$cell" --config.seed="$seed" \
            --config.init_from="$dir/base" > /dev/null
      done
    done
    echo "## seeds $seed.., W = $W"
    "${report[@]}" "$dir"/*_trained "$dir"/*_frozen
    for name in $credits; do
      "${report[@]}" --compare "$dir/${name}_frozen" "$dir/${name}_trained"
      [[ $name == team || " $credits " != *" team "* ]] ||
        "${report[@]}" --compare "$dir/team_trained" "$dir/${name}_trained"
    done
  done
done
