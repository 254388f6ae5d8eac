r"""Best-of-n: n solvers answer in parallel, then a judge reads every candidate and writes the index of
the one it picks; the final answer is the pick.  Checking is easier than solving on subset_sum and
stack_program, so that is where a judge should pay off.

  python -m marl_jax.main --config=experiments/best_of_n.py:task=subset_sum,size=cpu --workdir=/tmp/bon
  python -m marl_jax.main --config=experiments/best_of_n.py:task=stack_program,credit=per_role \
      --workdir=/tmp/bon_stack
  python -m marl_jax.main --config=experiments/best_of_n.py:task=subset_sum,size=gpu --workdir=/tmp/bon_gpu

Arguments: size=tiny|cpu|gpu; task=arithmetic|subset_sum|stack_program; credit=ESTIMATOR (every name
in marl_jax.credit.REGISTRY; its settings are `--config.credit.KEY=VALUE`); candidates=n (2..7);
sharing=solvers|shared|isolated (solvers: the n solvers one parameter set, the judge its own).  The
judge's warm-start error rate is `--config.protocol.judge_demo_error_rate`.
"""
from marl_jax import configs


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu", task="arithmetic", credit="team", sharing="solvers",
                           candidates=4)
  sharing = dict(solvers=",".join(["0"] * args.candidates + ["1"]), shared="shared", isolated="isolated")
  return configs.workflow_config(__file__, args, "best_of_n", sharing, candidates=args.candidates)
