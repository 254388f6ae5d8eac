"""Quickstart: a solver-verifier team on multi-step arithmetic, from a warm start to joint RL with
counterfactual (difference) credit, in about 5 minutes on 2 CPU cores.

  python -m marl_jax.main --config=experiments/quickstart.py --workdir=workdirs/quickstart

`:size=tiny` is the seconds-long variant the tests run; experiments/solver_verifier.py has the rest.
"""
from marl_jax import configs


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu")
  c = configs.sibling(__file__, "solver_verifier").get_config(f"size={args.size}")
  if args.size == "cpu":
    # One seed, so a newcomer's first run takes minutes (the results configs vmap 10).
    c.num_seeds, c.total_steps, c.eval_every, c.checkpoint_every = 1, 300, 50, 100
  return c
