"""Single-agent RL on multi-step arithmetic: a warm-started agent, then PPO with a group baseline.

  python -m marl_jax.main --config=experiments/single_agent.py:size=cpu --workdir=/tmp/single
  python -m marl_jax.main --config=experiments/single_agent.py:size=gpu --workdir=/tmp/single_gpu
"""
from marl_jax import configs


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu")
  c = configs.base_config()
  configs.check_choice("size", args.size, ("tiny", "cpu", "gpu"))
  if args.size == "gpu":
    c.model.update(d_model=256, n_layers=4, n_heads=8, d_ff=1024)
    c.task.update(num_ops=4)
    c.rl.update(batch_size=2048, minibatches=4)
    c.sft.update(steps=3000, batch_size=512)
    c.total_steps, c.eval_every, c.checkpoint_every = 2000, 100, 500
  elif args.size == "tiny":  # for tests: seconds, not minutes
    c.model.update(d_model=32, n_layers=1, n_heads=2, d_ff=64)
    c.rl.update(batch_size=32, group_size=4, minibatches=1)
    c.sft.update(steps=20, batch_size=32)
    c.eval.size = 64
    c.total_steps, c.steps_per_call, c.log_every, c.eval_every, c.checkpoint_every = 4, 2, 2, 2, 2
  return c
