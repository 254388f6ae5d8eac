#!/usr/bin/env bash
# Reproduces the results table (docs/results/single_agent_and_solver_verifier.md): single-agent RL and the solver-verifier pair on arithmetic,
# 10 vmapped seeds per run (the size=cpu default), 300 steps, on two disjoint seed sets (0 and 1000).
# A finished run is not re-run.  Usage: scripts/results.sh [OUT]
set -euo pipefail
out=${1:-workdirs/results}
runs=(single sv_shared_team sv_shared_difference sv_isolated_team sv_shared_per_role)
config() {  # the experiment argument of a run name
  case $1 in
    single) echo "experiments/single_agent.py:size=cpu" ;;
    sv_*_*) IFS=_ read -r _ sharing credit <<< "$1"
            echo "experiments/solver_verifier.py:size=cpu,sharing=$sharing,credit=$credit" ;;
  esac
}
for run in "${runs[@]}"; do
  for seed in 0 1000; do
    python -m marl_jax.main --config="$(config "$run")" --workdir="$out/seed$seed/$run" --config.seed=$seed
  done
done
for seed in 0 1000; do
  echo "## seeds $seed.."
  python -m marl_jax.tools.report "${runs[@]/#/$out/seed$seed/}"
  for run in sv_shared_team sv_shared_difference sv_isolated_team sv_shared_per_role; do
    python -m marl_jax.tools.report --compare "$out/seed$seed/single" "$out/seed$seed/$run"
  done
  python -m marl_jax.tools.report --compare "$out/seed$seed/sv_shared_team" "$out/seed$seed/sv_shared_difference"
  python -m marl_jax.tools.report --compare "$out/seed$seed/sv_shared_team" "$out/seed$seed/sv_shared_per_role"
  python -m marl_jax.tools.report --compare "$out/seed$seed/sv_isolated_team" "$out/seed$seed/sv_shared_team"
  python -m marl_jax.tools.report --split "$out/seed$seed/single" "$out/seed$seed/sv_shared_team"
done
