#!/usr/bin/env bash
# Reproduces docs/results/peer_review.md: a solver rewarded by its judges (experiments/peer_review.py,
# subset_sum, two judges) under each payment rule and audit rate, with and without collusion settings
# (shared reward: pay=team; shared parameters: sharing=shared; a covert channel: channel=2), against
# checker-rewarded training of the same workflow (source=checker) and the single agent on the same task
# (experiments/tasks.py:task=subset_sum); 10 vmapped seeds per cell on two disjoint seed sets (0, 1000).
# Shrunk to fit the shared 2-core CPU (`scale` below):
# 8 problems x 8 samples a step, a 200-step warm start, 100 PPO steps, 256 evaluation problems.
# Every cell starts from its seed set's warm start of the same parameter sets (a base run of step 0
# alone, as the credit benchmark's workflow grid does), so cells are paired seed by seed.
# Cell by cell in the order the page needs them (the baselines and the most informative cells first,
# each on both seed sets before the next), so a partial run holds paired seed sets of the main
# comparisons.  Resumable: a finished cell is not re-run (its checkpoint of the last step is
# there), an interrupted one resumes from its last checkpoint (every 25 steps; a signal
# saves at once).  The last loop prints each seed set's report, each cell against the checker baseline
# (Welch), and the plot of accuracy against audit rate (OUT/seedS/rates.png).
# Usage: [SIZE=tiny] [CELLS="checker team_0 ..."] [SEEDS="0 1000"] scripts/peer_review_results.sh [OUT]
#   SIZE=tiny: the tests' variant (seconds a cell); CELLS: run only these cells (names below); SEEDS:
#   these seed sets (one each in two processes runs them side by side).
set -euo pipefail
out=${1:-workdirs/peer_review}
size=${SIZE:-cpu}
steps=4  # each size's total_steps
if [[ $size == cpu ]]; then
  steps=100
  scale=(--config.num_seeds=10 --config.total_steps=100 --config.rl.batch_size=64 --config.sft.steps=200
         --config.eval.size=256 --config.steps_per_call=5 --config.log_every=5 --config.eval_every=25
         --config.checkpoint_every=25)
else
  scale=(--config.num_seeds=2)
fi
# Cells: NAME BASE EXPERIMENT-ARGUMENT [FLAGS], the most informative first.  A base is a layout's warm
# start, the run of step 0 alone: judges (the solver one parameter set, the judges another), shared (one
# set), channel (the channel's turn in the canvas), single (one agent), clean (as judges, the judges'
# demonstrations without flipped verdicts), long (as judges, a warm start of 600 steps, the published
# size=cpu's, not 200); its reward settings (team pay, no audits) do not act at step 0.  cold_* cells
# sample every role at temperature 0.3, so that the judges' sampled statements keep more of their
# evidence (docs/results/peer_review.md, why the judges stop judging); entropy* cells give the judges
# alone an entropy bonus (0.05 or 0.01), so their policies cannot collapse to one level.  The last cells
# are docs/results/judges.md's: `diagnose_*` logs every step and evaluates every 5 (the judges' AUROC of
# sampled, greedy and expected statements at the warm start, after 5 and 100 steps); `expected*` read
# the judges by the probability they put on right (`verdict=expected`), `*brier*`/`*log*` add that
# probability's proper score on the labelled answers to the judges' loss, `supervised*` use it instead of
# their policy gradient (`judge_pg=False`), `planted*` take their labels from planted answers alone
# (`plant_rate`, no audits: the checker never reaches the loss).  What limits the judge: `*_batch256`
# (four times the labels a step), `width*` (the judges' d_model 128 or 256, the solver's 64: bases of
# their own), `easy_*` (subset_sum of 3 numbers, whose warm-started solver is right far more often than
# the 7 % of 5 numbers); `*supervised_1` with every answer labelled and the solver paid by the checker
# (whether the judges can learn to judge at all), `lr*` with the judges' learning rate a tenth or a
# hundredth of the solver's (Adam's steps are the learning rate's size whatever the loss's), `*epochs4*`
# with four passes over each step's batch (four times the judges' updates), `*replay*` with a replay of
# the last 4096 labelled episodes, a batch of them in each step's update (each label teaches many
# times, `rewards.replay`); collusion with judges that can judge: `planted_*_team_0` (team pay, no audits,
# labels from planted answers only) with shared parameters, the channel and cross-judging by rotation.
cells="
checker judges source=checker
team_0 judges pay=team,audit_rate=0
audited_0.1 judges pay=audited,audit_rate=0.1
audited_balanced_0.1 judges pay=audited_balanced,audit_rate=0.1
audited_1 judges pay=audited,audit_rate=1.0
audited_balanced_1 judges pay=audited_balanced,audit_rate=1.0
clean_checker clean source=checker
clean_audited_0.1 clean pay=audited,audit_rate=0.1
clean_audited_balanced_0.1 clean pay=audited_balanced,audit_rate=0.1
cold_checker judges source=checker --config.rl.temperature=0.3
cold_audited_balanced_0.1 judges pay=audited_balanced,audit_rate=0.1 --config.rl.temperature=0.3
entropy0.05_audited_balanced_1 judges pay=audited_balanced,audit_rate=1.0 --config.rl.entropy_coef=0.05 --config.rl.entropy_roles=judge0,judge1
entropy0.05_audited_balanced_0.1 judges pay=audited_balanced,audit_rate=0.1 --config.rl.entropy_coef=0.05 --config.rl.entropy_roles=judge0,judge1
entropy0.01_audited_balanced_1 judges pay=audited_balanced,audit_rate=1.0 --config.rl.entropy_coef=0.01 --config.rl.entropy_roles=judge0,judge1
entropy0.01_audited_balanced_0.1 judges pay=audited_balanced,audit_rate=0.1 --config.rl.entropy_coef=0.01 --config.rl.entropy_roles=judge0,judge1
long_checker long source=checker
long_audited_balanced_0.1 long pay=audited_balanced,audit_rate=0.1
long_audited_balanced_1 long pay=audited_balanced,audit_rate=1.0
audited_0.02 judges pay=audited,audit_rate=0.02
audited_0.25 judges pay=audited,audit_rate=0.25
peer_prediction_0 judges pay=peer_prediction,audit_rate=0
peer_prediction_0.05 judges pay=peer_prediction,audit_rate=0.05
reputation_0.1 judges pay=reputation,audit_rate=0.1
channel_team_0 channel pay=team,audit_rate=0,channel=2
shared_team_0 shared pay=team,audit_rate=0,sharing=shared
audited_team_0.1 judges pay=audited_team,audit_rate=0.1 --config.reward.share=0.1
channel_audited_team_0.1 channel pay=audited_team,audit_rate=0.1,channel=2 --config.reward.share=0.1
single single -
audited_0.05 judges pay=audited,audit_rate=0.05
team_0.1 judges pay=team,audit_rate=0.1
peer_prediction_0.25 judges pay=peer_prediction,audit_rate=0.25
reputation_0.02 judges pay=reputation,audit_rate=0.02
reputation_0.25 judges pay=reputation,audit_rate=0.25
team_0.02 judges pay=team,audit_rate=0.02
team_0.05 judges pay=team,audit_rate=0.05
team_0.25 judges pay=team,audit_rate=0.25
peer_prediction_0.02 judges pay=peer_prediction,audit_rate=0.02
peer_prediction_0.1 judges pay=peer_prediction,audit_rate=0.1
reputation_0.05 judges pay=reputation,audit_rate=0.05
shared_audited_0.1 shared pay=audited,audit_rate=0.1,sharing=shared
channel_audited_0.1 channel pay=audited,audit_rate=0.1,channel=2
audited_balanced_0.02 judges pay=audited_balanced,audit_rate=0.02
audited_balanced_0.05 judges pay=audited_balanced,audit_rate=0.05
audited_balanced_0.25 judges pay=audited_balanced,audit_rate=0.25
audited_team_0.02 judges pay=audited_team,audit_rate=0.02 --config.reward.share=0.1
audited_team_0.05 judges pay=audited_team,audit_rate=0.05 --config.reward.share=0.1
audited_team_0.25 judges pay=audited_team,audit_rate=0.25 --config.reward.share=0.1
diagnose_audited_balanced_1 judges pay=audited_balanced,audit_rate=1.0 --config.steps_per_call=1 --config.log_every=1 --config.eval_every=5
expected_brier_0.1 judges pay=audited_balanced,audit_rate=0.1 --config.reward.verdict=expected --config.reward.judge_loss=brier
supervised_0.1 judges pay=audited_balanced,audit_rate=0.1 --config.reward.verdict=expected --config.reward.judge_loss=brier --config.reward.judge_pg=False
planted_supervised_0.1 judges pay=audited_balanced,audit_rate=0 --config.reward.plant_rate=0.1 --config.reward.verdict=expected --config.reward.judge_loss=brier --config.reward.judge_pg=False
expected_0.1 judges pay=audited_balanced,audit_rate=0.1 --config.reward.verdict=expected
expected_log_0.1 judges pay=audited_balanced,audit_rate=0.1 --config.reward.verdict=expected --config.reward.judge_loss=log
planted_brier_0.1 judges pay=audited_balanced,audit_rate=0 --config.reward.plant_rate=0.1 --config.reward.verdict=expected --config.reward.judge_loss=brier
supervised_1 judges pay=audited_balanced,audit_rate=1.0 --config.reward.verdict=expected --config.reward.judge_loss=brier --config.reward.judge_pg=False
supervised_0.02 judges pay=audited_balanced,audit_rate=0.02 --config.reward.verdict=expected --config.reward.judge_loss=brier --config.reward.judge_pg=False
supervised_0.25 judges pay=audited_balanced,audit_rate=0.25 --config.reward.verdict=expected --config.reward.judge_loss=brier --config.reward.judge_pg=False
supervised_0.1_batch256 judges pay=audited_balanced,audit_rate=0.1 --config.reward.verdict=expected --config.reward.judge_loss=brier --config.reward.judge_pg=False --config.rl.batch_size=256
supervised_0.02_batch256 judges pay=audited_balanced,audit_rate=0.02 --config.reward.verdict=expected --config.reward.judge_loss=brier --config.reward.judge_pg=False --config.rl.batch_size=256
width128_checker width128 source=checker,judge_width=128
width128_supervised_0.1 width128 pay=audited_balanced,audit_rate=0.1,verdict=expected,judge_loss=brier,judge_pg=false,judge_width=128
width256_checker width256 source=checker,judge_width=256
width256_supervised_0.1 width256 pay=audited_balanced,audit_rate=0.1,verdict=expected,judge_loss=brier,judge_pg=false,judge_width=256
easy_checker easy source=checker
easy_audited_balanced_0.1 easy pay=audited_balanced,audit_rate=0.1
easy_supervised_0.1 easy pay=audited_balanced,audit_rate=0.1,verdict=expected,judge_loss=brier,judge_pg=false
easy_expected_brier_0.1 easy pay=audited_balanced,audit_rate=0.1,verdict=expected,judge_loss=brier
easy_supervised_1 easy pay=audited_balanced,audit_rate=1.0,verdict=expected,judge_loss=brier,judge_pg=false
easy_lr0.01_supervised_1 easy pay=audited_balanced,audit_rate=1.0,verdict=expected,judge_loss=brier,judge_pg=false,judge_lr=0.01
easy_epochs4_supervised_1 easy pay=audited_balanced,audit_rate=1.0,verdict=expected,judge_loss=brier,judge_pg=false --config.rl.epochs=4
lr0.1_supervised_1 judges pay=audited_balanced,audit_rate=1.0,verdict=expected,judge_loss=brier,judge_pg=false,judge_lr=0.1
lr0.01_supervised_1 judges pay=audited_balanced,audit_rate=1.0,verdict=expected,judge_loss=brier,judge_pg=false,judge_lr=0.01
lr0.1_supervised_0.1 judges pay=audited_balanced,audit_rate=0.1,verdict=expected,judge_loss=brier,judge_pg=false,judge_lr=0.1
lr0.1_expected_brier_0.1 judges pay=audited_balanced,audit_rate=0.1,verdict=expected,judge_loss=brier,judge_lr=0.1
width256_supervised_1 width256 pay=audited_balanced,audit_rate=1.0,verdict=expected,judge_loss=brier,judge_pg=false,judge_width=256
replay_supervised_0.1 judges pay=audited_balanced,audit_rate=0.1,verdict=expected,judge_loss=brier,judge_pg=false,replay=4096
easy_replay_supervised_0.1 easy pay=audited_balanced,audit_rate=0.1,verdict=expected,judge_loss=brier,judge_pg=false,replay=4096
planted_team_0 judges pay=team,audit_rate=0,plant_rate=0.1,verdict=expected,judge_loss=brier
planted_shared_team_0 shared pay=team,audit_rate=0,plant_rate=0.1,verdict=expected,judge_loss=brier,sharing=shared
planted_channel_team_0 channel pay=team,audit_rate=0,plant_rate=0.1,verdict=expected,judge_loss=brier,channel=2
planted_rotate_team_0 judges pay=team,audit_rate=0,plant_rate=0.1,verdict=expected,judge_loss=brier,cross=rotate
rotate_team_0 judges pay=team,audit_rate=0,cross=rotate
"
config() {  # config BASE ARG: the --config flag of a cell (ARG '-': the single agent) or of a base (ARG '')
  case $1/$2 in
    single/*) echo "experiments/tasks.py:task=subset_sum,size=$size" ;;
    shared/) echo "experiments/peer_review.py:pay=team,audit_rate=0,sharing=shared,size=$size" ;;
    channel/) echo "experiments/peer_review.py:pay=team,audit_rate=0,channel=2,size=$size" ;;
    judges/|clean/|long/|easy/) echo "experiments/peer_review.py:pay=team,audit_rate=0,size=$size" ;;
    width128/|width256/) echo "experiments/peer_review.py:pay=team,audit_rate=0,judge_width=${1#width},size=$size" ;;
    *) echo "experiments/peer_review.py:$2,size=$size" ;;
  esac
}
base_flags() {  # base_flags BASE: the settings a layout's warm start and its cells share
  case $1 in
    clean) echo "--config.protocol.judge_demo_error_rate=0" ;;
    long) echo "--config.sft.steps=600" ;;
    easy) echo "--config.task.num_numbers=3" ;;
  esac
}
train() {  # train WORKDIR CONFIG [FLAGS...]
  local workdir=$1 config=$2
  shift 2
  python -m marl_jax.main --config="$config" --workdir="$workdir" "${scale[@]}" "$@" > /dev/null
}
done_at() { [[ -d $1/checkpoints/$2 ]]; }  # done_at WORKDIR STEP: its checkpoint of STEP is saved
wanted() { [[ -z ${CELLS:-} || " $CELLS " == *" $1 "* ]]; }
seeds=${SEEDS:-0 1000}
# Programs compiled once serve every cell and both seed sets (the evaluation, a rule's step).
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$out/compilation_cache}
while read -r name base arg flags; do
  [[ -n $name ]] && wanted "$name" || continue
  for seed in $seeds; do
    dir=$out/seed$seed
    done_at "$dir/base_$base" 0 ||
      train "$dir/base_$base" "$(config "$base" "")" --config.seed=$seed --config.total_steps=0 $(base_flags "$base")
    # shellcheck disable=SC2086  # FLAGS: words, none with spaces
    done_at "$dir/$name" $steps ||
      train "$dir/$name" "$(config "$base" "$arg")" --config.seed=$seed --config.init_from="$dir/base_$base" $flags \
        $(base_flags "$base")
  done
done <<< "$cells"
for seed in $seeds; do
  dir=$out/seed$seed
  runs=()
  while read -r name _; do
    [[ -n $name && -d $dir/$name ]] && runs+=("$dir/$name")
  done <<< "$cells"
  echo "## seeds $seed.."
  python -m marl_jax.tools.report --rates="$dir/rates.png" "${runs[@]}"
  for run in "${runs[@]}"; do
    [[ $run == */checker || ! -d $dir/checker ]] || python -m marl_jax.tools.report --compare "$dir/checker" "$run"
  done
done
