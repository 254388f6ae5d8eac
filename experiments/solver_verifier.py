"""Solver-verifier (Eval-Opt) on multi-step arithmetic: the verifier accepts the solver's answer or
rejects it with a revision; how the team outcome is credited decides what the verifier learns.

  python -m marl_jax.main --config=experiments/solver_verifier.py:sharing=isolated,credit=difference,size=cpu --workdir=/tmp/sv
  python -m marl_jax.main --config=experiments/solver_verifier.py:size=gpu --workdir=/tmp/sv_gpu

Arguments: sharing=shared|isolated, credit=team|per_role|difference, size=tiny|cpu|gpu.
"""
from marl_jax import configs

SIZES = ("tiny", "cpu", "gpu")


def get_config(arg=None):
  args = configs.parse_arg(arg, sharing="isolated", credit="difference", size="cpu")
  c = configs.base_config()
  c.protocol.update(name="solver_verifier", rounds=1, verifier_demo_error_rate=0.3)
  c.roles.sharing = configs.check_choice("sharing", args.sharing, ("shared", "isolated"))
  c.rl.credit = configs.check_choice("credit", args.credit, ("team", "per_role", "difference"))
  configs.check_choice("size", args.size, SIZES)
  c.total_steps, c.eval_every = 600, 100
  if args.size == "gpu":
    c.model.update(d_model=256, n_layers=4, n_heads=8, d_ff=1024)
    c.task.update(num_ops=4)
    c.protocol.rounds = 2
    c.rl.update(batch_size=2048, minibatches=4)
    c.sft.update(steps=3000, batch_size=512)
    c.total_steps, c.checkpoint_every = 2000, 500
  elif args.size == "tiny":  # for tests: seconds, not minutes
    c.model.update(d_model=32, n_layers=1, n_heads=2, d_ff=64)
    c.rl.update(batch_size=32, group_size=4, minibatches=1)
    c.sft.update(steps=20, batch_size=32)
    c.eval.size = 64
    c.total_steps, c.steps_per_call, c.log_every, c.eval_every, c.checkpoint_every = 4, 2, 2, 2, 2
  return c
