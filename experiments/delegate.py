r"""Delegate (orchestrator-workers, Kimi's Parallel-Agent RL) on multi_chain or wide: the orchestrator
assigns each chain to a worker slot (or nothing), warm-started workers (frozen on multi_chain by
default, trained on wide) each read only their assignment and report, and the orchestrator writes the
final answer.  Reward r_task + lambda1 r_parallel +
lambda2 r_finish with the auxiliary weights annealed to 0 (`aux=annealed`), held (`never`) or off
(`none`).

  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,aux=annealed --workdir=/tmp/delegate
  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,aux=never --workdir=/tmp/delegate_never
  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,aux=none --workdir=/tmp/delegate_none
  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,trainable_workers=1,credit=per_role \
      --workdir=/tmp/delegate_trained_workers
  python -m marl_jax.main --config=experiments/delegate.py:size=gpu --workdir=/tmp/delegate_gpu
  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,workflow=single --workdir=/tmp/alone

Many trained workers on the wide task (W chains answered as a list, every slot trainable):

  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,task=wide,workers=16 \
      --workdir=/tmp/delegate_wide16
  python -m marl_jax.main --config=experiments/delegate.py:size=gpu,task=wide,workers=64,worker_sets=4 \
      --workdir=/tmp/delegate_wide64

Arguments: size=tiny|cpu|gpu; workflow=delegate|single (single: one agent answers the same problems
alone, with the same warm start recipe, demonstration errors and budget: the baseline that says
whether the task needs the workers); task=multi_chain|wide (wide: `tasks/wide.py`, scored per part;
`--config.task.all_right=true` for the all-right variant); workers=W (the task's parts, one worker
slot each; 0: multi_chain's 2, 3 at size=gpu, wide's 4; at most 64); aux=annealed|never|none (delegate
only); credit=ESTIMATOR (every name in marl_jax.credit.REGISTRY, settings as
`--config.credit.KEY=VALUE`); trainable_workers=0|1 (delegate only; 0: the workers' parameter sets
stay frozen at the warm start; default 0 on multi_chain, 1 on wide); worker_sets=shared|per_slot|G
(delegate only; how worker slots map to parameter sets: one set for every slot, one per slot, or G
groups of consecutive slots; the orchestrator is always set 0); ops=N (the operations in each chain; 0:
the task's, 1 on wide and multi_chain at sizes tiny and cpu).  The schedule and weights are
`--config.protocol.anneal_steps`, `parallel_weight`, `finish_weight`.
"""
import ml_collections

from marl_jax import configs, credit, protocols, tasks
from marl_jax.protocols import delegate

AUX = ("annealed", "never", "none")
WORKFLOWS = ("delegate", "single")
TASKS = ("multi_chain", "wide")
DEFAULT_WORKERS = {"multi_chain": 2, "wide": 4}


def worker_sharing(worker_sets: str, workers: int) -> tuple[int, ...]:
  """The parameter set of the orchestrator (0) and of each worker slot, from `worker_sets`."""
  named = {"shared": 1, "per_slot": workers}
  groups = named.get(worker_sets)
  if groups is None:
    groups = int(worker_sets) if worker_sets.isdigit() else 0
  if not 1 <= groups <= workers:
    raise ValueError(f"config argument worker_sets={worker_sets!r} for {workers} workers; allowed: shared, "
                     f"per_slot, or a number of groups in 1..{workers}")
  return (0,) + tuple(1 + s * groups // workers for s in range(workers))


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu", workflow="delegate", aux="annealed", credit="team",
                           trainable_workers="", task="multi_chain", workers=0, worker_sets="shared", ops=0)
  configs.check_choice("workflow", args.workflow, WORKFLOWS)
  configs.check_choice("aux", args.aux, AUX)
  configs.check_choice("task", args.task, TASKS)
  configs.check_choice("trainable_workers", args.trainable_workers, ("", "0", "1"))
  delegate_only = dict(aux="annealed", trainable_workers="", worker_sets="shared")
  if args.workflow == "single" and any(args[k] != v for k, v in delegate_only.items()):
    raise ValueError("config arguments aux, trainable_workers and worker_sets apply to workflow=delegate "
                     "only; got workflow=single with " + ", ".join(f"{k}={args[k]!r}" for k in delegate_only))
  trainable_workers = args.trainable_workers or ("1" if args.task == "wide" else "0")
  c = configs.base_config()
  # Two one-operation chains.  Warm-started (1 seed, greedy, 512 problems): one agent answering alone
  # 15% (chance is 10%), a worker on its chain 100%; the orchestrator adds two reports (not three at
  # this scale).  With two-operation chains the workers fail too (38%).
  c.task = ml_collections.ConfigDict(dict(name="multi_chain", num_chains=2, num_ops=1, max_operand=9,
                                          modulus=10, demo_error_rate=0.3))
  if args.task == "wide":
    c.task = ml_collections.ConfigDict(dict(tasks.knobs("wide"), name="wide"))
    c.task.update(num_chains=DEFAULT_WORKERS["wide"], num_ops=1, demo_error_rate=0.3)
  c.protocol = ml_collections.ConfigDict(dict(name="delegate", **protocols.knobs("delegate")))
  c.protocol.anneal = "never" if args.aux == "never" else "linear"
  if args.aux == "none":
    c.protocol.parallel_weight = c.protocol.finish_weight = 0.0
  c.credit = configs.credit_config(configs.check_choice("credit", args.credit, credit.REGISTRY))
  c.total_steps, c.eval_every = 600, 100
  configs.apply_size(c, args.size)
  if args.size == "cpu":
    # 10 vmapped seeds (the results pages' scale) but 100 steps, not 300: the canvas is twice a
    # solver-verifier's and every worker slot samples through its own view (measured on 2 cores
    # shared with a second run: the warm start 22 minutes, then 100 steps 16 minutes).
    c.num_seeds, c.total_steps, c.eval_every, c.checkpoint_every = 10, 100, 20, 100
  if args.size == "gpu" and args.task == "multi_chain":
    c.task.update(num_chains=3, num_ops=3)
  if args.workers:
    low = 2 if args.task == "wide" else 1
    if not low <= args.workers <= delegate.MAX_WORKERS:
      raise ValueError(f"config argument workers={args.workers} for task={args.task}; allowed: 0 (the "
                       f"default) or {low}..{delegate.MAX_WORKERS}")
    c.task.num_chains = args.workers
  if args.ops < 0:
    raise ValueError(f"config argument ops={args.ops}; allowed: 0 (the task's) or a number of operations >= 1")
  if args.ops:  # before the canvas is fitted: a longer chain is a longer prompt
    c.task.num_ops = args.ops
  role_set = worker_sharing(args.worker_sets, c.task.num_chains)
  c.roles.sharing = ",".join(map(str, role_set))
  c.roles.trainable = ",".join(["1"] + [trainable_workers] * max(role_set))
  c.protocol.anneal_steps = c.total_steps // 2
  configs.fit_canvas(c)
  if args.workflow == "single":  # the same model (positions for the delegate canvas), one role
    c.protocol = ml_collections.ConfigDict(dict(name="single", **protocols.knobs("single")))
    c.roles.sharing, c.roles.trainable = "isolated", ""
  return c
