r"""Vote: K voters answer the same problem in parallel, none reading another; the final answer is their
majority (ties go to the earliest voter's answer), or with `aggregator=true` the answer of an
aggregator that reads all K.  The workflow that complementary roles (solver_verifier, best_of_n) are
measured against.

  python -m marl_jax.main --config=experiments/vote.py:size=cpu --workdir=/tmp/vote
  python -m marl_jax.main --config=experiments/vote.py:aggregator=true,sharing=voters --workdir=/tmp/vote_agg
  python -m marl_jax.main --config=experiments/vote.py:task=subset_sum,credit=per_role,size=gpu \
      --workdir=/tmp/vote_gpu

Arguments: size=tiny|cpu|gpu; task=arithmetic|subset_sum|stack_program; credit=ESTIMATOR (every name
in marl_jax.credit.REGISTRY; its settings are `--config.credit.KEY=VALUE`); voters=K (2..8, 2..7 with
an aggregator); aggregator=false|true; sharing=shared|isolated|voters (the voters one parameter set,
the aggregator its own).  Any other role map: `--config.roles.sharing=0,0,1,2`.
"""
from marl_jax import configs


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu", task="arithmetic", credit="team", sharing="shared", voters=3,
                           aggregator=False)
  sharing = dict(shared="shared", isolated="isolated",
                 voters=",".join(["0"] * args.voters + ["1"] * args.aggregator))
  return configs.workflow_config(__file__, args, "vote", sharing, voters=args.voters,
                                 aggregator=args.aggregator)
