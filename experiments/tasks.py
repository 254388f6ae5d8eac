r"""The task suite, each task on its natural workflow (or `protocol=NAME`): warm start, then PPO.

  python -m marl_jax.main --config=experiments/tasks.py:task=subset_sum,size=cpu --workdir=/tmp/subset_sum
  python -m marl_jax.main --config=experiments/tasks.py:task=subset_sum,protocol=solver_verifier \
      --workdir=/tmp/subset_sum_sv
  python -m marl_jax.main --config=experiments/tasks.py:task=hidden_sum --workdir=/tmp/hidden_sum
  python -m marl_jax.main --config=experiments/tasks.py:task=multi_chain --workdir=/tmp/multi_chain \
      --config.rl.credit=per_role    # orchestrator + parallel workers; protocol=single for one agent
  python -m marl_jax.main --config=experiments/tasks.py:task=stack_program --workdir=/tmp/stack_program
  python -m marl_jax.main --config=experiments/tasks.py:task=matrix_game --workdir=/tmp/penalty \
      --config.task.game=penalty --config.task.k=-50
Task knobs are under `config.task` (every field of the task, so each can be set from the command line).
"""
import dataclasses

import ml_collections

from marl_jax import configs, protocols, tasks

# task -> (natural protocol, task knobs that differ from the task's defaults at size=gpu)
TASKS = {
    "arithmetic": ("single", dict(num_ops=4)),
    "subset_sum": ("single", dict(num_numbers=8, max_number=19)),
    "hidden_sum": ("exchange", dict(max_number=999, modulus=1000)),
    "multi_chain": ("orchestrator", dict(num_chains=4, num_ops=2)),
    "stack_program": ("single", dict(num_ops=3, num_examples=5)),
    "matrix_game": ("matrix_game", {}),
}


def get_config(arg=None):
  args = configs.parse_arg(arg, task="subset_sum", size="cpu", protocol="")
  configs.check_choice("task", args.task, TASKS)
  configs.check_choice("size", args.size, configs.SIZES)
  natural, gpu_knobs = TASKS[args.task]
  c = configs.base_config()
  knobs = {f.name: f.default for f in dataclasses.fields(tasks.REGISTRY[args.task])}
  if args.size == "gpu":
    knobs.update(gpu_knobs)
  c.task = ml_collections.ConfigDict(dict(name=args.task, **knobs))
  c.protocol = ml_collections.ConfigDict(dict(name=args.protocol or natural))
  configs.apply_size(c, args.size)
  # The canvas (prompt and every turn) must fit the model's positions.
  task = tasks.make(args.task, **knobs)
  protocol = protocols.make(c.protocol.name, task)
  c.model.max_len = max(c.model.max_len, protocol.layout(task, (0,) * len(protocol.roles)).length)
  return c
