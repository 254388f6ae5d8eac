r"""Delegate (orchestrator-workers, Kimi's Parallel-Agent RL) on multi_chain: the orchestrator assigns
each chain to a worker slot (or nothing), frozen warm-started workers each read only their assignment
and report, and the orchestrator writes the final answer.  Reward r_task + lambda1 r_parallel +
lambda2 r_finish with the auxiliary weights annealed to 0 (`aux=annealed`), held (`never`) or off
(`none`).

  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,aux=annealed --workdir=/tmp/delegate
  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,aux=never --workdir=/tmp/delegate_never
  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,aux=none --workdir=/tmp/delegate_none
  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,trainable_workers=1,credit=per_role \
      --workdir=/tmp/delegate_trained_workers
  python -m marl_jax.main --config=experiments/delegate.py:size=gpu --workdir=/tmp/delegate_gpu
  python -m marl_jax.main --config=experiments/delegate.py:size=cpu,workflow=single --workdir=/tmp/alone

Arguments: size=tiny|cpu|gpu; workflow=delegate|single (single: one agent answers the same problems
alone, with the same warm start recipe, demonstration errors and budget: the baseline that says
whether the task needs the workers); aux=annealed|never|none (delegate only); credit=ESTIMATOR
(every name in marl_jax.credit.REGISTRY, settings as `--config.credit.KEY=VALUE`);
trainable_workers=0|1 (delegate only; 0: the workers' parameter set, shared by every slot, stays
frozen at the warm start).  The schedule and
weights are `--config.protocol.anneal_steps`, `parallel_weight`, `finish_weight`.  Role map: the
orchestrator is set 0 and every worker set 1 (`--config.roles.sharing=0,1,1`); changing
`config.protocol.workers` needs a sharing entry per slot.
"""
import ml_collections

from marl_jax import configs, credit, protocols

AUX = ("annealed", "never", "none")
WORKFLOWS = ("delegate", "single")


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu", workflow="delegate", aux="annealed", credit="team",
                           trainable_workers="0")
  configs.check_choice("workflow", args.workflow, WORKFLOWS)
  configs.check_choice("aux", args.aux, AUX)
  configs.check_choice("trainable_workers", args.trainable_workers, ("0", "1"))
  if args.workflow == "single" and (args.aux, args.trainable_workers) != ("annealed", "0"):
    raise ValueError("config arguments aux and trainable_workers apply to workflow=delegate only; got "
                     f"workflow=single with aux={args.aux!r}, trainable_workers={args.trainable_workers!r}")
  c = configs.base_config()
  # Two one-operation chains.  Warm-started (1 seed, greedy, 512 problems): one agent answering alone
  # 15% (chance is 10%), a worker on its chain 100%; the orchestrator adds two reports (not three at
  # this scale).  With two-operation chains the workers fail too (38%).
  c.task = ml_collections.ConfigDict(dict(name="multi_chain", num_chains=2, num_ops=1, max_operand=9,
                                          modulus=10, demo_error_rate=0.3))
  c.protocol = ml_collections.ConfigDict(dict(name="delegate", **protocols.knobs("delegate")))
  c.protocol.anneal = "never" if args.aux == "never" else "linear"
  if args.aux == "none":
    c.protocol.parallel_weight = c.protocol.finish_weight = 0.0
  c.roles.sharing = ",".join(["0"] + ["1"] * c.task.num_chains)
  c.roles.trainable = f"1,{args.trainable_workers}"
  c.credit = configs.credit_config(configs.check_choice("credit", args.credit, credit.REGISTRY))
  c.total_steps, c.eval_every = 600, 100
  configs.apply_size(c, args.size)
  if args.size == "cpu":
    # 10 vmapped seeds (the results pages' scale) but 100 steps, not 300: the canvas is twice a
    # solver-verifier's and every worker slot samples through its own view (measured on 2 cores
    # shared with a second run: the warm start 22 minutes, then 100 steps 16 minutes).
    c.num_seeds, c.total_steps, c.eval_every, c.checkpoint_every = 10, 100, 20, 100
  if args.size == "gpu":
    c.task.update(num_chains=3, num_ops=3)
    c.roles.sharing = ",".join(["0"] + ["1"] * c.task.num_chains)
  c.protocol.anneal_steps = c.total_steps // 2
  configs.fit_canvas(c)
  if args.workflow == "single":  # the same model (positions for the delegate canvas), one role
    c.protocol = ml_collections.ConfigDict(dict(name="single", **protocols.knobs("single")))
    c.roles.sharing, c.roles.trainable = "isolated", ""
  return c
