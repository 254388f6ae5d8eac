"""Solver-verifier (Eval-Opt) on multi-step arithmetic: the verifier accepts the solver's answer or
rejects it with a revision; how the team outcome is credited decides what the verifier learns.

  python -m marl_jax.main --config=experiments/solver_verifier.py:sharing=isolated,credit=difference,size=cpu --workdir=/tmp/sv
  python -m marl_jax.main --config=experiments/solver_verifier.py:size=gpu --workdir=/tmp/sv_gpu

  python -m marl_jax.main --config=experiments/solver_verifier.py:team=mixed,size=cpu --workdir=/tmp/sv_mixed

Arguments: sharing=shared|isolated, credit=ESTIMATOR (team, per_role, difference, ...: every name in
marl_jax.credit.REGISTRY; its settings are then `--config.credit.KEY=VALUE`), size=tiny|cpu|gpu,
team=uniform|mixed (mixed: the verifier is a model twice as wide and deep as the solver's,
`config.models.verifier`, each of its keys settable as `--config.models.verifier.KEY`; needs
sharing=isolated), judge_loss=none|brier|log (the verifier also taught by the proper score of the
probability it puts on ACCEPT against the checker's verdict on the solver's answer, every episode).
verifier_signal=verdict|final: what per-role credit pays the verifier, its verdict being right or the
final answer it lets stand or writes (marl_jax/protocols/solver_verifier.py).
"""
from marl_jax import configs, credit


def get_config(arg=None):
  args = configs.parse_arg(arg, sharing="isolated", credit="difference", size="cpu", team="uniform", judge_loss="none",
                           verifier_signal="verdict")
  c = configs.base_config()
  c.protocol.update(name="solver_verifier", rounds=1, verifier_demo_error_rate=0.3, verifier_signal=args.verifier_signal)
  c.roles.sharing = configs.check_choice("sharing", args.sharing, ("shared", "isolated"))
  c.credit = configs.credit_config(configs.check_choice("credit", args.credit, credit.REGISTRY))
  c.reward = configs.reward_config("team", judge_loss=args.judge_loss)
  c.total_steps, c.eval_every = 600, 100
  configs.apply_size(c, args.size)
  if args.size == "cpu":  # the results pages' scale: 10 vmapped seeds, 5-12 minutes on 2 cores
    c.num_seeds, c.total_steps, c.eval_every, c.checkpoint_every = 10, 300, 50, 300
  if args.size == "gpu":
    c.task.num_ops = 4
    c.protocol.rounds = 2
  if configs.check_choice("team", args.team, ("uniform", "mixed")) == "mixed":
    if args.sharing != "isolated":
      raise ValueError("config argument team=mixed gives the verifier its own model; it needs "
                       "sharing=isolated")
    configs.add_model(c, "verifier", **configs.doubled(c.model))
    c.roles.models = "model,verifier"
  return c
