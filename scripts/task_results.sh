#!/usr/bin/env bash
# Reproduces the README's task-suite table (CPU scale, 3 vmapped seeds, 200 steps per run).
# Usage: scripts/task_results.sh [OUT]
set -euo pipefail
out=${1:-workdirs/tasks}
common="--config.num_seeds=3 --config.eval_every=50"
run() {  # run NAME TASK PROTOCOL [FLAGS...]
  local name=$1 task=$2 protocol=$3
  shift 3
  python -m marl_jax.main --config=experiments/tasks.py:task=$task,size=cpu,protocol=$protocol \
    --workdir=$out/$name $common "$@"
}
run subset_sum_single subset_sum single
run subset_sum_sv subset_sum solver_verifier --config.roles.sharing=shared
run subset_sum_sv_difference subset_sum solver_verifier --config.roles.sharing=shared --config.credit.name=difference
run subset_sum_sv_two_rounds subset_sum solver_verifier --config.roles.sharing=shared --config.protocol.rounds=2 \
  --config.model.max_len=48
run hidden_sum_single hidden_sum single
run hidden_sum_exchange hidden_sum exchange
run multi_chain_single multi_chain single
run multi_chain_orchestrator multi_chain orchestrator
run multi_chain_orchestrator_per_role multi_chain orchestrator --config.credit.name=per_role
run multi_chain_orchestrator_difference multi_chain orchestrator --config.credit.name=difference
run stack_program_single stack_program single
run stack_program_sv stack_program solver_verifier --config.roles.sharing=shared
run matrix_game_single matrix_game single
run matrix_game_two_players matrix_game matrix_game
python -m marl_jax.report "$out"/*
