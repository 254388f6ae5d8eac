r"""Debate (MAPoRL): K agents answer independently, then for `rounds` rounds each reads the others'
previous answers and revises its own; the final answer is the last round's majority.  Influence
rewards: a turn earns `alpha` for fixing its own wrong answer and `beta` per other agent whose next
answer goes wrong -> right (and pays the same for breaking); alpha = beta = 0 is plain co-training.

  python -m marl_jax.main --config=experiments/debate.py:size=cpu --workdir=/tmp/debate
  python -m marl_jax.main --config=experiments/debate.py:alpha=0,beta=0 --workdir=/tmp/debate_plain
  python -m marl_jax.main --config=experiments/debate.py:rounds=2,sharing=isolated,credit=difference \
      --workdir=/tmp/debate_r2
  python -m marl_jax.main --config=experiments/debate.py:size=gpu --workdir=/tmp/debate_gpu

Arguments: size=tiny|cpu|gpu; task=arithmetic|subset_sum|stack_program; credit=ESTIMATOR (every name
in marl_jax.credit.REGISTRY, its settings `--config.credit.KEY=VALUE`; the influence rewards are added
to whatever it gives each turn); agents=K (2..8); rounds=R (>= 1); alpha, beta (>= 0);
sharing=shared|isolated.
"""
from marl_jax import configs


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu", task="arithmetic", credit="team", sharing="shared", agents=3,
                           rounds=1, alpha=0.5, beta=0.25)
  return configs.workflow_config(__file__, args, "debate", dict(shared="shared", isolated="isolated"),
                                 agents=args.agents, rounds=args.rounds, alpha=args.alpha, beta=args.beta)
