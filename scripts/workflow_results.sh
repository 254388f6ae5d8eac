#!/usr/bin/env bash
# Reproduces the workflow comparison (docs/results/workflows.md, docs/results/subset_sum.md): single
# agent, solver-verifier, vote, best_of_n and debate with and without influence rewards (on subset_sum
# also scored by a verifier role) on subset_sum (checking is easier than solving) and on arithmetic, and delegate with annealed,
# never-annealed and no auxiliary rewards on multi_chain, against one agent alone on that task; 10 vmapped seeds per run on two disjoint seed sets (0 and 1000), then the report per seed
# set and each workflow's Welch comparison with the single agent on its task.
# subset_sum's single agent and solver-verifier runs are scripts/task_results.sh's (read from TASKS),
# and its workflows run at that script's budget (200 steps); arithmetic's are scripts/results.sh's
# (read from RESULTS, 300 steps), the arithmetic workflows' own size=cpu budget.
# A finished run is not re-run; an interrupted one resumes from its last checkpoint (every 50 steps, so
# a run longer than a session loses at most 50 steps when the session ends).
# Usage: scripts/workflow_results.sh [OUT] [RESULTS] [TASKS]
set -euo pipefail
out=${1:-workdirs/workflows}
results=${2:-workdirs/results}
tasks=${3:-workdirs/tasks}
names=()
run() {  # [from=BASE] run NAME EXPERIMENT_ARG [FLAGS...]: both seed sets, the experiment's size=cpu
  local name=$1 experiment=$2 seed
  shift 2
  names+=("$name")
  for seed in 0 1000; do
    local init=()
    [[ -z ${from:-} ]] || init=(--config.init_from="$out/seed$seed/$from")
    python -m marl_jax.main --config="experiments/$experiment" --workdir="$out/seed$seed/$name" \
      --config.seed=$seed --config.checkpoint_every=50 "${init[@]}" "$@"
  done
}
# The warm start alone (step 0) of both seed sets.  Runs that differ only in their rewards (influence
# weights, auxiliary rewards) start from the same base: the same parameters their own warm start would
# give (same seed, same demonstrations), computed once; `report --compare A B --paired` compares them
# seed by seed.
base() {  # base NAME EXPERIMENT_ARG
  local seed
  for seed in 0 1000; do
    python -m marl_jax.main --config="experiments/$2" --workdir="$out/seed$seed/$1" --config.seed=$seed \
      --config.total_steps=0
  done
}
# Cheapest first: arithmetic's workflows (minutes each), delegate, then subset_sum's (its canvas is
# two to three times longer).
run arithmetic_vote vote.py:size=cpu
run arithmetic_best_of_n best_of_n.py:size=cpu
base arithmetic_debate_base debate.py:size=cpu
from=arithmetic_debate_base run arithmetic_debate debate.py:size=cpu
from=arithmetic_debate_base run arithmetic_debate_plain debate.py:size=cpu,alpha=0,beta=0
base delegate_base delegate.py:size=cpu
from=delegate_base run delegate_annealed delegate.py:size=cpu,aux=annealed
from=delegate_base run delegate_never delegate.py:size=cpu,aux=never
from=delegate_base run delegate_none delegate.py:size=cpu,aux=none
run delegate_single delegate.py:size=cpu,workflow=single   # one agent alone: does the task need workers?
run arithmetic_vote_isolated vote.py:size=cpu,sharing=isolated
# The task suite's budget (scripts/task_results.sh), so subset_sum's workflows compare with its runs.
suite=(--config.total_steps=200)
run subset_sum_vote vote.py:size=cpu,task=subset_sum "${suite[@]}"
run subset_sum_best_of_n best_of_n.py:size=cpu,task=subset_sum "${suite[@]}"
base subset_sum_debate_base debate.py:size=cpu,task=subset_sum
from=subset_sum_debate_base run subset_sum_debate debate.py:size=cpu,task=subset_sum "${suite[@]}"
from=subset_sum_debate_base run subset_sum_debate_plain debate.py:size=cpu,task=subset_sum,alpha=0,beta=0 \
  "${suite[@]}"
# Influence rewards scored by a frozen warm-started verifier role instead of the checker (its own warm
# start: the verifier's demonstrations are part of it).
base subset_sum_debate_verifier_base debate.py:size=cpu,task=subset_sum,scorer=verifier
from=subset_sum_debate_verifier_base run subset_sum_debate_verifier debate.py:size=cpu,task=subset_sum,scorer=verifier \
  "${suite[@]}"
for seed in 0 1000; do
  echo "## seeds $seed.."
  dirs=("$tasks/seed$seed/subset_sum_single" "$tasks/seed$seed/subset_sum_sv" "$results/seed$seed/single"
        "$results/seed$seed/sv_shared_team" "${names[@]/#/$out/seed$seed/}")
  python -m marl_jax.tools.report "${dirs[@]}"
  for name in arithmetic_vote arithmetic_vote_isolated arithmetic_best_of_n arithmetic_debate \
      arithmetic_debate_plain; do
    python -m marl_jax.tools.report --compare "$results/seed$seed/single" "$out/seed$seed/$name"
  done
  for name in subset_sum_vote subset_sum_best_of_n subset_sum_debate subset_sum_debate_plain; do
    python -m marl_jax.tools.report --compare "$tasks/seed$seed/subset_sum_single" "$out/seed$seed/$name"
  done
  for task_dir in "$results/seed$seed/sv_shared_team:$out/seed$seed/arithmetic" \
      "$tasks/seed$seed/subset_sum_sv:$out/seed$seed/subset_sum"; do
    python -m marl_jax.tools.report --compare "${task_dir%%:*}" "${task_dir#*:}_vote"      # complementary vs voting
    python -m marl_jax.tools.report --compare "${task_dir#*:}_debate_plain" "${task_dir#*:}_debate"  # influence
  done
  python -m marl_jax.tools.report --compare "$out/seed$seed/subset_sum_debate" "$out/seed$seed/subset_sum_debate_verifier"
  python -m marl_jax.tools.report --compare "$out/seed$seed/arithmetic_vote" "$out/seed$seed/arithmetic_vote_isolated"
  python -m marl_jax.tools.report --compare "$out/seed$seed/delegate_none" "$out/seed$seed/delegate_annealed"
  python -m marl_jax.tools.report --compare "$out/seed$seed/delegate_never" "$out/seed$seed/delegate_annealed"
  python -m marl_jax.tools.report --compare "$out/seed$seed/delegate_single" "$out/seed$seed/delegate_annealed"
done
