#!/usr/bin/env bash
# Reproduces the mixed-team comparison (docs/results/mixed_teams.md): solver-verifier on arithmetic with
# isolated parameter sets and team credit, the verifier the solver's model (uniform) or one twice as
# wide and deep (`solver_verifier.py:team=mixed`), against one agent of the solver's size (single) and
# of the verifier's (`single_agent.py:model=doubled`), each given the same steps and samples; 10
# vmapped seeds, 300 steps, on two disjoint seed sets (0 and 1000, or those in SEEDS), then each set's
# table and the Welch comparisons of the mixed team against the other three.
# A finished run is not re-run; an interrupted one resumes.
# Usage: [SEEDS="0 1000"] scripts/mixed_team_results.sh [OUT]
set -euo pipefail
out=${1:-workdirs/mixed}
config() {  # config ARM: the --config flag of an arm
  case $1 in
    uniform|mixed) echo "experiments/solver_verifier.py:sharing=isolated,credit=team,size=cpu,team=$1" ;;
    single) echo "experiments/single_agent.py:size=cpu" ;;
    single_doubled) echo "experiments/single_agent.py:size=cpu,model=doubled" ;;
  esac
}
arms="uniform mixed single single_doubled"
for seed in ${SEEDS:-0 1000}; do
  for arm in $arms; do
    python -m marl_jax.main --config="$(config $arm)" --workdir="$out/seed$seed/$arm" --config.seed=$seed
  done
  echo "## seeds $seed.."
  python -m marl_jax.tools.report $(for arm in $arms; do echo "$out/seed$seed/$arm"; done)
  for other in uniform single single_doubled; do
    python -m marl_jax.tools.report --compare "$out/seed$seed/$other" "$out/seed$seed/mixed"
  done
done
