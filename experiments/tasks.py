r"""The task suite, each task on its natural workflow (or `protocol=NAME`): warm start, then PPO.

  python -m marl_jax.main --config=experiments/tasks.py:task=subset_sum,size=cpu --workdir=/tmp/subset_sum
  python -m marl_jax.main --config=experiments/tasks.py:task=subset_sum,protocol=solver_verifier \
      --workdir=/tmp/subset_sum_sv
  python -m marl_jax.main --config=experiments/tasks.py:task=hidden_sum --workdir=/tmp/hidden_sum
  python -m marl_jax.main --config=experiments/tasks.py:task=signalling --workdir=/tmp/signalling \
      --config.task.num_attributes=3    # Lewis game, RL from scratch (no warm start)
  python -m marl_jax.main --config=experiments/tasks.py:task=multi_chain,credit=per_role \
      --workdir=/tmp/multi_chain    # orchestrator + parallel workers; protocol=single for one agent
  python -m marl_jax.main --config=experiments/tasks.py:task=stack_program --workdir=/tmp/stack_program
  python -m marl_jax.main --config=experiments/tasks.py:task=matrix_game --workdir=/tmp/penalty \
      --config.task.game=penalty --config.task.k=-50
  python -m marl_jax.main --config=experiments/tasks.py:task=contribution --workdir=/tmp/saboteur \
      --config.task.game=saboteur --config.task.num_roles=4 --config.credit.name=difference
Task knobs are under `config.task`, protocol knobs under `config.protocol` and the credit estimator's
(`credit=NAME`, default team) under `config.credit` (every field, so each can be set from the command
line, e.g. `--config.protocol.rounds=2`, `--config.credit.samples=4`).
"""

import ml_collections

from marl_jax import configs, credit, protocols, tasks

# task -> (natural protocol, task knobs that differ from the task's defaults at size=gpu); any other
# registered symbol task runs on `single` with its defaults at every size.
TASKS = {
    "arithmetic": ("single", dict(num_ops=4)),
    "subset_sum": ("single", dict(num_numbers=8, max_number=19)),
    "hidden_sum": ("exchange", dict(max_number=999, modulus=1000)),
    "multi_chain": ("orchestrator", dict(num_chains=4, num_ops=2)),
    "stack_program": ("single", dict(num_ops=3, num_examples=5)),
    "matrix_game": ("matrix_game", {}),
    "contribution": ("contribution", dict(num_roles=6)),
    "signalling": ("exchange", dict(num_attributes=4, num_values=5)),
}


def get_config(arg=None):
  args = configs.parse_arg(arg, task="subset_sum", size="cpu", protocol="", credit="team")
  configs.check_choice("task", args.task, sorted(n for n, cls in tasks.REGISTRY.items() if not cls.free_text))
  configs.check_choice("size", args.size, configs.SIZES)
  natural, gpu_knobs = TASKS.get(args.task, ("single", {}))
  c = configs.base_config()
  task_knobs = tasks.knobs(args.task)
  if args.size == "gpu":
    task_knobs.update(gpu_knobs)
  c.task = ml_collections.ConfigDict(dict(name=args.task, **task_knobs))
  name = args.protocol or natural
  configs.check_choice("protocol", name, protocols.REGISTRY)
  # Every knob of the protocol (e.g. `rounds`), so each can be set from the command line.
  protocol_knobs = protocols.knobs(name)
  c.protocol = ml_collections.ConfigDict(dict(name=name, **protocol_knobs))
  c.credit = configs.credit_config(configs.check_choice("credit", args.credit, credit.REGISTRY))
  configs.apply_size(c, args.size)
  if not tasks.REGISTRY[args.task].demonstrated:  # a convention game: RL from scratch
    c.sft.steps = 0
  # The canvas (prompt and every turn) must fit the model's positions (a longer protocol set from
  # the command line, e.g. more rounds, also needs --config.model.max_len: the run says how many).
  task = tasks.make(args.task, **task_knobs)
  protocol = protocols.make(name, task, **protocol_knobs)
  c.model.max_len = max(c.model.max_len, protocol.layout(task, (0,) * len(protocol.roles)).length)
  return c
