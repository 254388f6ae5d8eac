#!/usr/bin/env bash
# Reproduces docs/results/judges.md's generator-verifier table: does the solver-verifier pair, its
# verifier read by probability and taught by a proper score, beat one agent given the same samples and
# steps?  On arithmetic, at the built-in model's d_model 64, 128 and 256 (d_ff 4x, every role and the
# single agent alike), 10 vmapped seeds, 300 steps, on two disjoint seed sets (0 and 1000, or SEEDS):
#   single        experiments/single_agent.py: RL alone
#   pair          solver_verifier, isolated sets, per-role credit, the checker's reward (today's pair)
#   pair_brier    that, the verifier also taught by the Brier score of its P(ACCEPT) on every episode
#   pair_final    pair, the verifier paid the final answer's score (what its verdict and revision make
#                 of the solver's answer), not its verdict's being right
#   pair_final_brier  that, with the Brier score of pair_brier
#   pair_peer     the solver rewarded by the verifier (audited_balanced, 10 % audits), read by its
#                 expected verdict and taught by the Brier score on the audited episodes
# then each width's table and each pair against the single agent (Welch).  A finished run is not re-run;
# an interrupted one resumes.
# Usage: [SIZE=tiny] [WIDTHS="64 128 256"] [RUNS="single pair ..."] [SEEDS="0 1000"] scripts/judge_pair_results.sh [OUT]
set -euo pipefail
out=${1:-workdirs/judge_pair}
size=${SIZE:-cpu}
config() {  # config RUN: the run's --config flag and its settings
  case $1 in
    single) echo "--config=experiments/single_agent.py:size=$size" ;;
    pair) echo "--config=experiments/solver_verifier.py:sharing=isolated,credit=per_role,size=$size" ;;
    pair_brier) echo "--config=experiments/solver_verifier.py:sharing=isolated,credit=per_role,judge_loss=brier,size=$size" ;;
    pair_final) echo "--config=experiments/solver_verifier.py:sharing=isolated,credit=per_role,verifier_signal=final,size=$size" ;;
    pair_final_brier) echo "--config=experiments/solver_verifier.py:sharing=isolated,credit=per_role,verifier_signal=final,judge_loss=brier,size=$size" ;;
    pair_peer) echo "--config=experiments/solver_verifier.py:sharing=isolated,credit=per_role,size=$size
      --config.reward.pay=audited_balanced --config.reward.source=peer --config.reward.audit_rate=0.1
      --config.reward.verdict=expected --config.reward.judge_loss=brier" ;;
  esac
}
runs=${RUNS:-single pair pair_brier pair_final pair_final_brier pair_peer}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$out/compilation_cache}
for seed in ${SEEDS:-0 1000}; do
  for width in ${WIDTHS:-64 128 256}; do
    dir=$out/seed$seed/d$width
    for run in $runs; do
      # shellcheck disable=SC2046  # the flags: words, none with spaces
      python -m marl_jax.main $(config "$run") --workdir="$dir/$run" --config.seed="$seed" \
        --config.model.d_model="$width" --config.model.d_ff=$((4 * width)) > /dev/null
    done
    echo "## seeds $seed.., d_model $width"
    python -m marl_jax.tools.report $(for run in $runs; do echo "$dir/$run"; done)
    for run in $runs; do
      [[ $run == single ]] || python -m marl_jax.tools.report --compare "$dir/single" "$dir/$run"
    done
  done
done
