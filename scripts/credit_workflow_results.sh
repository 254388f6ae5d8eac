#!/usr/bin/env bash
# Reproduces docs/results/credit_workflows.md: the credit benchmark's learning grid on the published
# workflows (experiments/credit_benchmark.py:grid=workflows): team, difference, centred Shapley and the
# role baseline on the single agent, best_of_n, vote, solver-verifier, plain debate and exchange
# (subset_sum / hidden_sum, 200 steps), and on delegate and its single agent (multi_chain, 100 steps),
# 10 vmapped seeds per cell on two disjoint seed sets (0 and 1000).
# Scenario by scenario, both seed sets each, in the order the page needs them (the reference and the
# workflows whose members' gap was measured first), so a partial run still compares paired seed sets.
# Resumable: a finished cell is not re-run, an interrupted one resumes from its last checkpoint (every
# 50 steps; a signal saves at once).  Each workdir's report/ holds the tables and curves; the last loop
# prints every seed set's whole report.
# Usage: scripts/credit_workflow_results.sh [OUT]
set -euo pipefail
out=${1:-workdirs/credit_workflows}
grid=(-m marl_jax.benchmark --config=experiments/credit_benchmark.py:grid=workflows)
subset_sum=(single_subset_sum best_of_n vote sv_subset_sum debate exchange)
multi_chain=(--config.learning.total_steps=100 --config.learning.scenarios=single_multi_chain,delegate)
for scenario in "${subset_sum[@]}"; do
  for seed in 0 1000; do
    python "${grid[@]}" --workdir="$out/seed$seed/subset_sum" --config.seed=$seed \
      --config.learning.scenarios="$scenario" > /dev/null
  done
done
for seed in 0 1000; do
  python "${grid[@]}" --workdir="$out/seed$seed/multi_chain" --config.seed=$seed "${multi_chain[@]}" > /dev/null
done
for seed in 0 1000; do
  echo "## seeds $seed.."
  python "${grid[@]}" --workdir="$out/seed$seed/subset_sum" --config.seed=$seed
  python "${grid[@]}" --workdir="$out/seed$seed/multi_chain" --config.seed=$seed "${multi_chain[@]}"
done
