#!/usr/bin/env bash
# Reproduces the README's results table (CPU scale, 3 vmapped seeds per run). Usage: scripts/results.sh [OUT]
set -euo pipefail
out=${1:-workdirs/results}
common="--config.num_seeds=3 --config.total_steps=300 --config.eval_every=50 --config.checkpoint_every=300"
python -m marl_jax.main --config=experiments/single_agent.py:size=cpu --workdir=$out/single $common
for sharing in isolated shared; do
  for credit in team per_role difference; do
    python -m marl_jax.main --config=experiments/solver_verifier.py:size=cpu,sharing=$sharing,credit=$credit \
      --workdir=$out/sv_${sharing}_${credit} $common
  done
done
python -m marl_jax.report $out/single $out/sv_*
