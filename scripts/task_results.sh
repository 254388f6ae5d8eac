#!/usr/bin/env bash
# Reproduces the task-suite table (docs/results/tasks.md): every task alone (single agent) and on its workflows,
# 10 vmapped seeds per run, 200 steps, on two disjoint seed sets (0 and 1000), then the report per
# seed set and each workflow's Welch comparison with the single agent on its task.
# A finished run is not re-run; an interrupted one resumes from its last checkpoint (every 50 steps).
# Usage: scripts/task_results.sh [OUT]
set -euo pipefail
out=${1:-workdirs/tasks}
common="--config.num_seeds=10 --config.eval_every=50 --config.checkpoint_every=50"
names=()
run() {  # run NAME TASK PROTOCOL [FLAGS...]: both seed sets
  local name=$1 task=$2 protocol=$3
  shift 3
  names+=("$name")
  for seed in 0 1000; do
    python -m marl_jax.main --config=experiments/tasks.py:task=$task,size=cpu,protocol=$protocol \
      --workdir=$out/seed$seed/$name --config.seed=$seed $common "$@"
  done
}
# Each task alone and on its natural workflow first (the table's columns), then the variants.
run subset_sum_single subset_sum single
run subset_sum_sv subset_sum solver_verifier --config.roles.sharing=shared
run hidden_sum_single hidden_sum single
run hidden_sum_exchange hidden_sum exchange
run multi_chain_single multi_chain single
run multi_chain_orchestrator multi_chain orchestrator
run stack_program_single stack_program single
run stack_program_sv stack_program solver_verifier --config.roles.sharing=shared
run matrix_game_single matrix_game single
run matrix_game_two_players matrix_game matrix_game
run subset_sum_sv_difference subset_sum solver_verifier --config.roles.sharing=shared --config.credit.name=difference
run subset_sum_sv_two_rounds subset_sum solver_verifier --config.roles.sharing=shared --config.protocol.rounds=2 \
  --config.model.max_len=48
run multi_chain_orchestrator_per_role multi_chain orchestrator --config.credit.name=per_role
run multi_chain_orchestrator_difference multi_chain orchestrator --config.credit.name=difference
for seed in 0 1000; do
  echo "## seeds $seed.."
  python -m marl_jax.tools.report "${names[@]/#/$out/seed$seed/}"
  for name in "${names[@]}"; do
    task=$(sed -E 's/_(single|sv.*|exchange|orchestrator.*|two_players)$//' <<< "$name")
    [[ $name == "${task}_single" ]] || python -m marl_jax.tools.report --compare "$out/seed$seed/${task}_single" "$out/seed$seed/$name"
  done
done
