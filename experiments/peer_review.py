r"""Peer review without a verifier: a solver answers, `judges` judges state how likely the answer is right
(the solver-verifier pair with graded verdicts and several verifiers, protocol `peer_review`), and the
solver is rewarded by the judges' verdict instead of the task's checker, which reaches the loss only on
audited episodes.  How the judges are paid decides whether the reward stays true (docs/peer_review.md).

  python -m marl_jax.main --config=experiments/peer_review.py:pay=audited,audit_rate=0.1,size=cpu --workdir=/tmp/pr_audited
  python -m marl_jax.main --config=experiments/peer_review.py:pay=peer_prediction,audit_rate=0 --workdir=/tmp/pr_ca
  python -m marl_jax.main --config=experiments/peer_review.py:pay=reputation,judges=3 --workdir=/tmp/pr_reputation
  python -m marl_jax.main --config=experiments/peer_review.py:source=checker --workdir=/tmp/pr_checker
  python -m marl_jax.main --config=experiments/peer_review.py:pay=team,audit_rate=0,channel=2 --workdir=/tmp/pr_channel
  python -m marl_jax.main --config=experiments/peer_review.py:pay=team,cross=frozen --workdir=/tmp/pr_frozen
  python -m marl_jax.main --config=experiments/peer_review.py:pay=audited_balanced,verdict=expected,judge_loss=brier --workdir=/tmp/pr_brier
  python -m marl_jax.main --config=experiments/peer_review.py:audit_rate=0,plant_rate=0.1,verdict=expected,judge_loss=brier,judge_pg=false --workdir=/tmp/pr_planted
  python -m marl_jax.main --config=experiments/peer_review.py:pay=audited_balanced,verdict=expected,judge_loss=brier,judge_pg=false,replay=4096 --workdir=/tmp/pr_replay

Arguments: task=subset_sum|arithmetic|stack_program;
pay=team|audited|audited_team|audited_balanced|peer_prediction|reputation (every name in
marl_jax.rewards.REGISTRY; its settings are `--config.reward.KEY=VALUE`); audit_rate (the share
of episodes the checker audits; 0: no ground truth reaches the loss); penalty (charged to the solver
when an audit catches an accepted wrong answer); judges=K (1..7); source=peer|checker (checker: the
usual checker reward, the baseline; pay and penalty must then stay at their defaults, audit_rate is
not read); credit=ESTIMATOR (one that gives each role its own reward: per_role, or role_baseline /
role_normalized with --config.credit.signal=role); sharing=judges|shared|isolated (judges: the solver
one parameter set, the judges another); cross=none|other_set|frozen|rotate (cross-judging: other_set
refuses a role map in which a judge shares the solver's parameters, frozen also freezes the judges' sets
at their warm start, a reference judge; rotate moves the judges' sets on to the next seed's team after
every step, so each seed's solver is judged by, and trains, another seed's judges: needs num_seeds >= 2);
channel=C (a covert channel: C free tokens the solver writes after its answer, read by the judges,
ignored by the checker; 0: none); verdict=sampled|expected (what the solver's reward reads of a judge:
its sampled statement, or the probability it puts on the answer being right); judge_loss=none|brier|log
(that probability's proper score on the labelled answers, a term of the judges' loss); judge_pg=true|false
(false: the judge loss instead of the judges' policy gradient, a supervised judge); plant_rate (the share
of problems whose judged answer is planted, the reference or a corrupted one, its truth known by
construction: labels without the checker); judge_width (the judges' d_model, their own model with the
solver's depth and d_ff / d_model; 0: the solver's model); judge_lr (the judges' sets' factor on the
learning rate, `config.roles.lr_scale`; 1: the solver's); replay=N (a replay of the last N labelled
episodes, as many of them as the step's batch added to each step's update for the judge loss alone:
`config.reward.replay` and `replay_rows`; 0: none); size=tiny|cpu|gpu.
"""
from marl_jax import configs, experiment


def get_config(arg=None):
  args = configs.parse_arg(arg, task="subset_sum", pay="team", audit_rate=0.1, penalty=0.0, judges=2,
                           source="peer", credit="per_role", sharing="judges", cross="none", channel=0,
                           verdict="sampled", judge_loss="none", judge_pg=True, plant_rate=0.0, judge_width=0,
                           judge_lr=1.0, replay=0, size="cpu")
  sharing = dict(judges=",".join(["0"] + ["1"] * args.judges), shared="shared", isolated="isolated")
  c = configs.workflow_config(__file__, args, "peer_review", sharing, judges=args.judges, channel=args.channel)
  if configs.check_choice("source", args.source, ("peer", "checker")) == "peer":
    c.reward = configs.reward_config(args.pay, source="peer", audit_rate=args.audit_rate, penalty=args.penalty,
                                     cross=args.cross, verdict=args.verdict, judge_loss=args.judge_loss,
                                     judge_pg=args.judge_pg, plant_rate=args.plant_rate)
  elif (args.pay, args.penalty, args.cross, args.verdict, args.plant_rate) != ("team", 0.0, "none", "sampled", 0.0):
    raise ValueError(f"config arguments pay={args.pay!r}, penalty={args.penalty}, cross={args.cross!r}, verdict="
                     f"{args.verdict!r}, plant_rate={args.plant_rate} act only with source=peer; allowed with "
                     "source=checker: pay=team, penalty=0, cross=none, verdict=sampled, plant_rate=0")
  else:  # the checker's reward; its judges may still be taught by a proper score on every answer
    c.reward = configs.reward_config("team", judge_loss=args.judge_loss, judge_pg=args.judge_pg)
  if args.replay:
    c.reward.update(replay=args.replay, replay_rows=c.rl.batch_size)
  role_set_R = experiment.role_map(range(1 + args.judges), c.roles.sharing)
  judge_set_S = [s != role_set_R[0] for s in range(max(role_set_R) + 1)]
  for name, value, default in (("judge_width", args.judge_width, 0), ("judge_lr", args.judge_lr, 1.0)):
    if value != default and args.sharing == "shared":
      raise ValueError(f"config argument {name} sets the judges' parameter sets apart from the solver's; "
                       f"allowed with sharing=judges or isolated, not shared")
  if args.judge_width:  # the judges a model of their own, wider (or narrower) than the solver's
    m = c.model
    configs.add_model(c, "judge", d_model=args.judge_width, d_ff=args.judge_width * m.d_ff // m.d_model)
    c.roles.models = ",".join("judge" if judge else "model" for judge in judge_set_S)
  if args.judge_lr != 1.0:
    c.roles.lr_scale = ",".join(str(args.judge_lr) if judge else "1" for judge in judge_set_S)
  if args.cross == "frozen":  # the judges' sets keep their warm start
    c.roles.trainable = ",".join("0" if judge else "1" for judge in judge_set_S)
  return c
