r"""The credit-assignment benchmark: every estimator graded against exact contributions (fidelity)
and trained on the same workflows (learning), seeds vmapped, resumable.

  python -m marl_jax.tools.credit_benchmark --config=experiments/credit_benchmark.py:size=cpu --workdir=workdirs/credit
  python -m marl_jax.tools.credit_benchmark --config=experiments/credit_benchmark.py:size=tiny --workdir=/tmp/credit
  python -m marl_jax.tools.credit_benchmark --config=experiments/credit_benchmark.py:size=gpu --workdir=/tmp/credit_gpu

The workflow grid (`grid=workflows`): the learning grid on the published workflows, each team against
the single agent on its task, no fidelity grid (scripts/credit_workflow_results.sh: both seed sets):
  python -m marl_jax.tools.credit_benchmark --config=experiments/credit_benchmark.py:grid=workflows \
      --config.learning.scenarios=single_subset_sum,vote --workdir=workdirs/credit_workflows/seed0

Lists are comma-separated strings, so each can be narrowed from the command line:
  --config.estimators=team,difference,shapley  --config.fidelity.games=synergy  --config.fidelity.roles=2,4
  --config.learning.scenarios=penalty,free_rider  --config.fidelity.adapt_curve=0,20,50,100,200,400,800
Fidelity: on the `contribution` task (each role copies its own hidden digit; the game decides how the
roles' successes make the team outcome), for every game x number of roles, the warm-started policy's
episodes are credited by every estimator, and each estimator's per-role credit is compared with the
exact Shapley value (roles outside a coalition absent) and the exact expected difference credit (the
role's message resampled from its policy).  Learning: every estimator trains every scenario from one
shared warm start per scenario.
"""
import ml_collections

from marl_jax import configs

ESTIMATORS = "team,per_role,role_normalized,role_baseline,difference,shapley,critic"
# The workflow grid's: the team reward, the counterfactual estimators (Shapley centred: uncentred it
# was slower than the team reward on the penalty game, docs/benchmark.md) and the cheapest baseline.
WORKFLOW_ESTIMATORS = "team,difference,shapley:centre=rloo,role_baseline"
GAMES = "additive,synergy,redundancy,free_rider,saboteur,weighted"
GRIDS = ("toys", "workflows")


def scenarios(size: str) -> dict:
  """scenario -> (experiment, its argument, overrides): the runs of the learning grid."""
  tasks = f"size={size},task="
  return {
      "solver_verifier": ("solver_verifier", f"size={size},sharing=isolated", {}),
      "orchestrator": ("tasks", tasks + "multi_chain", {}),
      "exchange": ("tasks", tasks + "hidden_sum", {}),
      "penalty": ("tasks", tasks + "matrix_game", {"task.game": "penalty", "task.k": -50.0}),
      # Systematic mistakes in most demonstrations (0.6, not the task's 0.4), so that the base writes
      # the mistake greedily and the team has to learn to copy: at 0.4 the base already copies every
      # digit greedily (eval accuracy 100% at step 0), and the cell could not tell estimators apart.
      "free_rider": ("tasks", tasks + "contribution", {"task.game": "free_rider", "task.num_roles": 3,
                                                       "task.demo_error_rate": 0.6}),
      "saboteur": ("tasks", tasks + "contribution", {"task.game": "saboteur", "task.num_roles": 3}),
  }


def workflow_scenarios(size: str) -> dict:
  """The published workflows (docs/results: workflows, subset_sum), as their tables ran them: on
  subset_sum where the members' gap to the single agent was measured, debate plain (no influence
  rewards, so credit is the estimator's alone), delegate on multi_chain with its auxiliary rewards
  annealed, and the single agent on each task, the reference every team is compared with."""
  subset_sum = f"size={size},task=subset_sum"
  return {
      "sv_subset_sum": ("tasks", subset_sum + ",protocol=solver_verifier", {"roles.sharing": "shared"}),
      "best_of_n": ("best_of_n", subset_sum, {}),
      "vote": ("vote", subset_sum, {}),
      "debate": ("debate", subset_sum + ",alpha=0,beta=0", {}),
      "delegate": ("delegate", f"size={size},aux=annealed", {}),
      "single_subset_sum": ("tasks", subset_sum, {}),
      "single_multi_chain": ("delegate", f"size={size},workflow=single", {}),
  }


def every_scenario(size: str) -> dict:
  """Both grids' scenarios: name -> (experiment, its argument, overrides)."""
  return {**scenarios(size), **workflow_scenarios(size)}


def scenario_config(name: str, size: str) -> ml_collections.ConfigDict:
  """The run config of one learning scenario (the benchmark sets its credit group and seeds)."""
  experiment, arg, overrides = every_scenario(size)[name]
  c = configs.sibling(__file__, experiment).get_config(arg)
  for key, value in overrides.items():
    group, _, field = key.partition(".")
    c[group][field] = value
  for key in configs.BENCHMARK_SETS:
    del c[key]
  return c


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu", grid="toys")
  size = configs.check_choice("size", args.size, configs.SIZES)
  grid = configs.check_choice("grid", args.grid, GRIDS)
  c = ml_collections.ConfigDict()
  c.size = size
  c.seed = 0
  c.estimators = ESTIMATORS
  # Fidelity grid: estimator x game x number of roles, on the warm-started policy.  Stateful estimators
  # adapt on `adapt_steps` batches first; `adapt_curve` (counts, comma-separated) grades them after
  # each count as well (docs/benchmark.md: the critic needs hundreds).
  c.fidelity = ml_collections.ConfigDict(dict(
      games=GAMES, roles="2,4", num_seeds=10, batch_size=256, sft_steps=150, adapt_steps=20,
      demo_error_rate=0.5, adapt_curve=""))
  # Learning grid: estimator x scenario, `num_seeds` vmapped seeds each, from one warm start per
  # scenario; `target` is the training batch's accuracy whose first crossing is steps-to-target;
  # `reference`: scenarios (comma-separated) whose `team` cell every team and member on the same task is
  # compared with (Welch).
  c.learning = ml_collections.ConfigDict(dict(
      scenarios=",".join(scenarios(size)), num_seeds=10, total_steps=100, eval_every=20,
      target=0.9, reference=""))
  if size == "tiny":  # the seconds-long variant the tests run: one cell of each grid, two estimators
    c.estimators = "team,shapley"
    c.fidelity.update(games="synergy", roles="2", num_seeds=2, batch_size=32, sft_steps=10,
                      adapt_steps=1)
    c.learning.update(scenarios="free_rider", num_seeds=2, total_steps=2, eval_every=2)
  elif size == "gpu":
    c.fidelity.update(roles="2,3,4,6,8", num_seeds=20, batch_size=1024, sft_steps=600, adapt_steps=100)
    c.learning.update(num_seeds=20, total_steps=1000, eval_every=100)
  # Every scenario's whole run config, so any of its keys can be set from the command line
  # (`--config.runs.penalty.rl.batch_size=64`); `learning.scenarios` picks the ones to run.
  c.runs = ml_collections.ConfigDict({name: scenario_config(name, size) for name in every_scenario(size)})
  if grid == "workflows":
    # Each team is compared with the single agent on its task (`learning.reference`).  In this order a
    # partial run has the reference and the workflows whose members' gap was measured first.
    c.estimators = WORKFLOW_ESTIMATORS
    c.fidelity.update(games="", roles="")
    c.learning.update(scenarios="single_subset_sum,best_of_n,vote,sv_subset_sum,debate,exchange,"
                                "single_multi_chain,delegate", reference="single_subset_sum,single_multi_chain")
    if size == "tiny":
      c.estimators = "team,shapley:centre=rloo"
    elif size == "cpu":
      # Shrunk from the tables' scale (batch 256, a 600-step warm start, 200 steps, 512 evaluation
      # problems), where one cell takes hours on 2 cores: on best_of_n the team reward took 11.3 s a
      # step and difference credit (10 re-runs) 48.8 s, 2.7 hours for 200 steps.  Here 8 problems x 8
      # samples a step, a 200-step warm start, 256 evaluation problems, 100 steps; one difference
      # re-run per role; Shapley exact up to 3 roles, over 2 orders above (best_of_n: 9 re-runs, not 31).
      c.estimators = ("team,difference:samples=1,shapley:centre=rloo:max_exact_roles=3:num_permutations=2,"
                      "role_baseline")
      c.learning.update(total_steps=100, eval_every=25)
      for name in [*workflow_scenarios(size), "exchange"]:
        run = c.runs[name]
        run.rl.batch_size, run.sft.steps, run.eval.size = 64, 200, 256
  elif size == "cpu":
    # 40 minutes on 2 CPU cores.  Fidelity at R = 2 only (R = 4 alone took 7.6 of 43 minutes; add it with
    # `--config.fidelity.roles=2,4`).  Learning: smaller batches than the scenarios' own runs (8
    # problems x 8 samples per step, a 200-step warm start), half their evaluation set (evaluating 512
    # problems every 20 steps took a quarter of a cell's time), and only the scenarios that learn within
    # 40 such steps: on seeds 0-9 (all six scenarios, 100 steps, 108 minutes) the orchestrator and
    # exchange cells did not move with any estimator and the solver-verifier separated per-role credit
    # only after 100 steps; penalty, free rider and saboteur reached 0.96+ training accuracy by step 30.
    # The others run with `--config.learning.scenarios=...` (and all six at size=gpu); the published
    # workflows at their own scale with `grid=workflows`.
    c.fidelity.roles = "2"
    c.learning.update(scenarios="penalty,free_rider,saboteur", total_steps=40)
    for name in scenarios(size):
      run = c.runs[name]
      run.rl.batch_size, run.sft.steps, run.eval.size = 64, 200, 256
  return c
