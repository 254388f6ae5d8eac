r"""The credit-assignment benchmark: every estimator graded against exact contributions (fidelity)
and trained on the same workflows (learning), seeds vmapped, resumable.

  python -m marl_jax.benchmark --config=experiments/credit_benchmark.py:size=cpu --workdir=workdirs/credit
  python -m marl_jax.benchmark --config=experiments/credit_benchmark.py:size=tiny --workdir=/tmp/credit
  python -m marl_jax.benchmark --config=experiments/credit_benchmark.py:size=gpu --workdir=/tmp/credit_gpu

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
GAMES = "additive,synergy,redundancy,free_rider,saboteur,weighted"


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


def scenario_config(name: str, size: str) -> ml_collections.ConfigDict:
  """The run config of one learning scenario (the benchmark sets its credit group and seeds)."""
  experiment, arg, overrides = scenarios(size)[name]
  c = configs.sibling(__file__, experiment).get_config(arg)
  for key, value in overrides.items():
    group, _, field = key.partition(".")
    c[group][field] = value
  for key in configs.BENCHMARK_SETS:
    del c[key]
  return c


def get_config(arg=None):
  args = configs.parse_arg(arg, size="cpu")
  size = configs.check_choice("size", args.size, configs.SIZES)
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
  # scenario; `target` is the training batch's accuracy whose first crossing is steps-to-target.
  c.learning = ml_collections.ConfigDict(dict(
      scenarios=",".join(scenarios(size)), num_seeds=10, total_steps=100, eval_every=20,
      target=0.9))
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
  c.runs = ml_collections.ConfigDict({name: scenario_config(name, size) for name in scenarios(size)})
  if size == "cpu":
    # 40 minutes on 2 CPU cores.  Fidelity at R = 2 only (R = 4 alone took 7.6 of 43 minutes; add it with
    # `--config.fidelity.roles=2,4`).  Learning: smaller batches than the scenarios' own runs (8
    # problems x 8 samples per step, a 200-step warm start), half their evaluation set (evaluating 512
    # problems every 20 steps took a quarter of a cell's time), and only the scenarios that learn within
    # 40 such steps: on seeds 0-9 (all six scenarios, 100 steps, 108 minutes) the orchestrator and
    # exchange cells did not move with any estimator and the solver-verifier separated per-role credit
    # only after 100 steps; penalty, free rider and saboteur reached 0.96+ training accuracy by step 30.
    # The others run with `--config.learning.scenarios=...` (and all six at size=gpu).
    c.fidelity.roles = "2"
    c.learning.update(scenarios="penalty,free_rider,saboteur", total_steps=40)
    for run in c.runs.values():
      run.rl.batch_size, run.sft.steps, run.eval.size = 64, 200, 256
  return c
