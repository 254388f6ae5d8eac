#!/usr/bin/env bash
# Reproduces docs/results/credit_workflows.md: the credit benchmark's learning grid on the published
# workflows (experiments/credit_benchmark.py:grid=workflows, size=cpu): every estimator of the grid on
# the single agent, best_of_n, vote, the shared solver-verifier and plain debate on subset_sum, exchange
# on hidden_sum, and delegate with its single agent on multi_chain, 10 vmapped seeds per cell on two
# disjoint seed sets (0 and 1000).
# Cell by cell in the order the page needs them (scenario, then estimator, then seed set), so a partial
# run still holds paired seed sets of the reference and the first workflows.  Resumable: a finished
# cell is not re-run, an interrupted one resumes from its last checkpoint (every 50 steps; a signal
# saves at once).  The last loop prints each seed set's whole report (also DIR/report/).
# Usage: scripts/credit_workflow_results.sh [OUT]
set -euo pipefail
out=${1:-workdirs/credit_workflows}
config=experiments/credit_benchmark.py:grid=workflows
grid() {  # grid SEED [FLAGS...]
  local seed=$1
  shift
  python -m marl_jax.tools.credit_benchmark --config="$config" --workdir="$out/seed$seed" --config.seed="$seed" "$@"
}
setting() {  # the grid's comma-separated list config.learning.scenarios or config.estimators, one a line
  python -c "from marl_jax import configs; print(configs.sibling('experiments/credit_benchmark.py',
'credit_benchmark').get_config('grid=workflows').$1.replace(',', '\n'))"
}
for scenario in $(setting learning.scenarios); do
  for estimator in $(setting estimators); do
    for seed in 0 1000; do
      grid $seed --config.learning.scenarios="$scenario" --config.estimators="$estimator" > /dev/null
    done
  done
done
for seed in 0 1000; do
  echo "## seeds $seed.."
  grid $seed
done
