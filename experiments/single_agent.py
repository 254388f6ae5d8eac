"""Single-agent RL on multi-step arithmetic: a warm-started agent, then PPO with a group baseline.

  python -m marl_jax.main --config=experiments/single_agent.py:size=cpu --workdir=/tmp/single
  python -m marl_jax.main --config=experiments/single_agent.py:size=gpu --workdir=/tmp/single_gpu
  python -m marl_jax.main --config=experiments/single_agent.py:model=doubled --workdir=/tmp/single_doubled

Arguments: size=tiny|cpu|gpu, model=base|doubled (doubled: twice as wide and deep, the size of
solver_verifier.py:team=mixed's verifier, so the mixed team can be compared with one agent of either size).
"""
from marl_jax import configs


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu", model="base")
  c = configs.base_config()
  c.total_steps, c.eval_every = 600, 100
  configs.apply_size(c, args.size)
  if args.size == "cpu":  # the results pages' scale: 10 vmapped seeds, about 3 minutes on 2 cores
    c.num_seeds, c.total_steps, c.eval_every, c.checkpoint_every = 10, 300, 50, 300
  if args.size == "gpu":
    c.task.num_ops = 4
  if configs.check_choice("model", args.model, ("base", "doubled")) == "doubled":
    c.model.update(configs.doubled(c.model))
  return c
