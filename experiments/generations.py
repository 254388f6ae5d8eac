r"""Generations: a team trained, its transcripts of training problems archived, and each next generation
distilled from the last one's archive (fresh parameters, each role its own messages) before RL.

  python -m marl_jax.tools.generations --config=experiments/generations.py:task=signalling --workdir=workdirs/gen_signalling
  python -m marl_jax.tools.generations --config=experiments/generations.py:task=hidden_sum,size=cpu --workdir=/tmp/gen_hidden_sum
  python -m marl_jax.tools.generations --config=experiments/generations.py:size=tiny --workdir=/tmp/gen_tiny

`task` is signalling (the Lewis game: generation 0 learns from scratch, so its code is its own
convention), hidden_sum (exchange) or arithmetic (one agent); generation 0 warm-starts as
experiments/tasks.py does.  Settings: --config.generations=N, --config.archive.size (training problems
per seed), --config.archive.greedy, --config.distil.filter=right|all|credit, --config.distil.steps,
--config.inherit=distil|team, --config.replay, --config.stages, and any setting of each generation's
run as --config.run.KEY=VALUE.  Across tasks (retention of A after B, with half of B's warm start
replaying A's archive):

  python -m marl_jax.tools.generations --config=experiments/generations.py:task=arithmetic --workdir=/tmp/ab \
      --config.generations=2 --config.inherit=team --config.stages='task.ops=+;task.ops=*' --config.replay=0.5
"""
import ml_collections

from marl_jax import configs

TASKS = ("signalling", "hidden_sum", "arithmetic")


def get_config(arg=None):
  args = configs.parse_arg(arg, task="signalling", size="cpu")
  configs.check_choice("task", args.task, TASKS)
  c = ml_collections.ConfigDict()
  c.run = configs.sibling(__file__, "tasks").get_config(f"task={args.task},size={args.size}")
  c.generations = 3
  # Each seed's team plays `size` training problems, sampled (greedy: its mode), for the next to distil.
  c.archive = ml_collections.ConfigDict(dict(size=512, greedy=False))
  # The next generation's warm start on the archive: `steps` at config.run.sft's batch and optimiser,
  # from the transcripts `filter` keeps (right: the checker scored the team right; all; credit: each
  # role's tokens weighted by its positive difference credit).
  c.distil = ml_collections.ConfigDict(dict(steps=max(c.run.sft.steps, 300), filter="right"))
  # What generation g + 1 starts from: `distil` (fresh parameters, distilled from g's archive) or `team`
  # (g's team carries on, through its run's own warm start, which replays `replay` of each batch from
  # g's archive).  `stages`: each generation's overrides of config.run, ';'-separated ('KEY=VALUE,...';
  # the last serves every later one): a sequence of tasks, e.g. 'task.ops=+;task.ops=*' trains task A
  # then B, and the summary evaluates each later team on A again (retention).
  c.inherit, c.replay, c.stages = "distil", 0.0, ""
  if args.task == "signalling" and args.size != "tiny":
    # From scratch: more steps than a warm-started task, and an entropy bonus that keeps the receiver
    # from settling on one answer before the sender's messages mean anything (k=2, v=4, one seed, 1500
    # steps: final eval accuracy 0.351 without it, 0.400 with it, 0.451 with it at learning rate 1e-3;
    # chance 0.25; docs/generations.md).
    c.run.total_steps, c.run.eval_every, c.run.checkpoint_every = 1000, 100, 500
    c.run.rl.entropy_coef, c.run.optim.learning_rate = 0.01, 1e-3
  if args.size == "tiny":
    c.generations, c.archive.size, c.distil.steps = 2, 64, 20
    c.distil.filter = "all"  # a team trained for seconds is seldom right
  elif args.size == "gpu":
    c.archive.size = 2048
  return c
