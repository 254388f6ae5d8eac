r"""Debate (MAPoRL): K agents answer independently, then for `rounds` rounds each reads the others'
previous answers and revises its own; the final answer is the last round's majority.  Influence
rewards: a turn earns `alpha` for fixing its own wrong answer and `beta` per other agent whose next
answer goes wrong -> right (and pays the same for breaking); alpha = beta = 0 is plain co-training.

  python -m marl_jax.main --config=experiments/debate.py:size=cpu --workdir=/tmp/debate
  python -m marl_jax.main --config=experiments/debate.py:alpha=0,beta=0 --workdir=/tmp/debate_plain
  python -m marl_jax.main --config=experiments/debate.py:rounds=2,sharing=isolated,credit=difference \
      --workdir=/tmp/debate_r2
  python -m marl_jax.main --config=experiments/debate.py:size=gpu --workdir=/tmp/debate_gpu
  python -m marl_jax.main --config=experiments/debate.py:task=subset_sum,scorer=verifier \
      --workdir=/tmp/debate_verifier

Arguments: size=tiny|cpu|gpu; task=arithmetic|subset_sum|stack_program; credit=ESTIMATOR (every name
in marl_jax.credit.REGISTRY, its settings `--config.credit.KEY=VALUE`; the influence rewards are added
to whatever it gives each turn); agents=K (2..8, 2..7 with a verifier); rounds=R (>= 1); alpha, beta
(>= 0); sharing=shared|isolated (the debaters'); scorer=checker|verifier: what judges the answers for
the influence rewards, the task's checker or a verifier role that reads the debate and writes a
verdict per answer (its own parameter set, warm-started on the checker's verdicts, flipped at
`--config.protocol.verifier_demo_error_rate`, then frozen unless train_verifier=true).
"""
from marl_jax import configs
from marl_jax.protocols.debate import SCORERS


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu", task="arithmetic", credit="team", sharing="shared", agents=3,
                           rounds=1, alpha=0.5, beta=0.25, scorer="checker", train_verifier=False)
  configs.check_choice("scorer", args.scorer, SCORERS)
  sharing = dict(shared="shared", isolated="isolated")
  knobs = dict(agents=args.agents, rounds=args.rounds, alpha=args.alpha, beta=args.beta, scorer=args.scorer)
  if args.scorer == "verifier":  # the last role, with a parameter set of its own after the debaters'
    debater_sets = dict(shared=[0] * args.agents, isolated=list(range(args.agents)))
    sharing = {k: ",".join(map(str, sets + [sets[-1] + 1])) for k, sets in debater_sets.items()}
  c = configs.workflow_config(__file__, args, "debate", sharing, **knobs)
  if args.scorer == "verifier":
    debaters = len(set(debater_sets[args.sharing]))
    c.roles.trainable = ",".join(["1"] * debaters + ["1" if args.train_verifier else "0"])
  return c
