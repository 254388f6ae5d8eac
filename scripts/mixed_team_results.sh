#!/usr/bin/env bash
# Reproduces the mixed-team comparison (docs/results/mixed_teams.md): solver-verifier on arithmetic with
# isolated parameter sets and team credit, the verifier the solver's model (uniform) or one twice as
# wide and deep (`solver_verifier.py:team=mixed`); 10 vmapped seeds, 300 steps, on two disjoint seed
# sets (0 and 1000, or those in SEEDS), then each set's table and the Welch comparison mixed - uniform.
# A finished run is not re-run; an interrupted one resumes.
# Usage: [SEEDS="0 1000"] scripts/mixed_team_results.sh [OUT]
set -euo pipefail
out=${1:-workdirs/mixed}
for seed in ${SEEDS:-0 1000}; do
  for team in uniform mixed; do
    python -m marl_jax.main --config="experiments/solver_verifier.py:sharing=isolated,credit=team,size=cpu,team=$team" \
      --workdir="$out/seed$seed/$team" --config.seed=$seed
  done
  echo "## seeds $seed.."
  python -m marl_jax.tools.report "$out/seed$seed/uniform" "$out/seed$seed/mixed"
  python -m marl_jax.tools.report --compare "$out/seed$seed/uniform" "$out/seed$seed/mixed"
done
