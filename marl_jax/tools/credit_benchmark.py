r"""Credit-assignment benchmark: fidelity against exact contributions, and learning, for every estimator.

  python -m marl_jax.tools.credit_benchmark --config=experiments/credit_benchmark.py:size=cpu --workdir=DIR

Fidelity (`DIR/fidelity/GAME-rR.json`, one per game x number of roles): a policy warm-started on the
`contribution` task plays a batch; every estimator credits the same episodes (stateful ones first
adapt on `adapt_steps` batches of the same policy), and its per-role credit is compared with the exact
Shapley value (roles outside a coalition absent) and the exact expected difference credit (a role's
message resampled from its policy), both computed from the success mask and the policy's exact success
probabilities.  Per estimator: bias and standard deviation of credit − exact, Spearman rank
correlation, and cost (re-runs and turns generated per episode); each over seeds with a 95% interval.
With `fidelity.adapt_curve` (counts of adaptation batches), the same credited batch is also graded
after each count, with the estimator's metrics on it (the critic's loss): fidelity against adaptation.

Learning (`DIR/learning/SCENARIO/ESTIMATOR/`, an ordinary run directory): each scenario is warm-started
once (`SCENARIO/base`) and every estimator trains from that base, seeds vmapped; final and peak eval
accuracy, the peak-to-final drop, steps until the training batch's accuracy reaches `learning.target`
(the cells log every step), wall time.

A finished cell is not re-run: rerunning the command resumes the grid.  `DIR/report/` gets
`fidelity.csv`, `fidelity_curve.csv` (with an `adapt_curve`), `learning.csv`, `report.md` and the plots (learning curves with 95% bands; fidelity
against cost).
"""
import ast
import contextlib
import csv
import dataclasses
import functools
import json
import math
import os
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm
from absl import app, flags, logging
from jax.sharding import PartitionSpec as P
from ml_collections import config_flags

from marl_jax import checkpoint, checks, cli, configs, credit, experiment, files, loop, metrics, parallel
from marl_jax import protocols, rollout, sampling, sft, state as state_lib, tasks, train
from marl_jax.credit import exact
from marl_jax.tools import intervals, report, runs
# Figures without pyplot: no GUI backend is chosen, so the benchmark runs headless and a notebook that
# imports it keeps its inline plots.
from matplotlib.figure import Figure

_CONFIG = config_flags.DEFINE_config_file("config", None, "Benchmark config (experiments/credit_benchmark.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Benchmark directory; finished cells are kept.")
flags.mark_flags_as_required(["config", "workdir"])


def names(csv_list: str) -> list[str]:
  return [n.strip() for n in str(csv_list).split(",") if n.strip()]


def check(config: ml_collections.ConfigDict) -> None:
  """Every name in the benchmark config exists and every benchmark setting is in range, before anything
  compiles (the run configs themselves are checked by `experiment.build`, in `run`)."""
  roles = range(2, tasks.contribution.MAX_ROLES + 1)  # the contribution task's
  for r in names(config.fidelity.roles):
    if not (r.isdigit() and int(r) in roles):
      raise ValueError(f"config.fidelity.roles has {r!r}; allowed: integers {roles[0]}..{roles[-1]}, "
                       "comma-separated")
  fid, learn = config.fidelity, config.learning
  tasks.base.check_rates("fidelity", {"demo_error_rate": fid.demo_error_rate})
  checks.integer("fidelity.adapt_steps", fid.adapt_steps, 0)
  for n in names(fid.adapt_curve):
    if not n.isdigit():
      raise ValueError(f"config.fidelity.adapt_curve has {n!r}; allowed: integers >= 0 (counts of "
                       "adaptation batches), comma-separated")
  checks.check("learning.target", learn.target, lambda v: 0 < v <= 1, "a training accuracy in (0, 1]")
  for entry in names(config.estimators):
    estimator_group(entry)
  for game in names(config.fidelity.games):
    if game not in tasks.contribution.GAMES:
      raise ValueError(f"config.fidelity.games has {game!r}; allowed: {list(tasks.contribution.GAMES)}")
  for scenario in names(config.learning.scenarios):
    if scenario not in config.runs:
      raise ValueError(f"config.learning.scenarios has {scenario!r}; allowed: {sorted(config.runs)}")
  for reference in names(learn.reference):
    if reference not in config.runs:
      raise ValueError(f"config.learning.reference has {reference!r}; allowed: scenarios of "
                       f"{sorted(config.runs)}, comma-separated")


# Fidelity.

def estimator_group(entry: str, like=None) -> ml_collections.ConfigDict:
  """The `config.credit` group of one `config.estimators` entry: an estimator's name, then any of its
  settings as `:KEY=VALUE` (`shapley:centre=dr_grpo`, a Python literal or a word), the others at
  their defaults (or `like`'s, `configs.named_group`); the entry as written names its cells and rows."""
  name, *settings = entry.split(":")
  if name not in credit.REGISTRY:
    raise ValueError(f"config.estimators has {entry!r}; allowed: {sorted(credit.REGISTRY)}, each with "
                     f"optional :KEY=VALUE settings")
  group = configs.named_group("credit", name, like=like)
  for setting in settings:
    key, equals, value = setting.partition("=")
    if not equals or key == "name" or key not in group:
      raise ValueError(f"config.estimators has {entry!r}: {setting!r} is not KEY=VALUE of a setting of "
                       f"{name!r}; allowed keys: {sorted(k for k in group if k != 'name')}")
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):  # a word: a string setting
      pass
    try:
      group[key] = value
    except TypeError as e:  # ml_collections keeps each setting's type
      raise ValueError(f"config.estimators has {entry!r}: {e}") from None
  return group


def fidelity_config(config, num_roles: int, estimator: str) -> ml_collections.ConfigDict:
  """A `contribution` run config whose credit term stands alone (`outcome_weight` 0 where it exists).
  Its game is a placeholder: the fidelity program plays every game as data (`Contribution.game_value`)."""
  fid = config.fidelity
  c = configs.base_config()
  configs.apply_size(c, "tiny" if config.size == "tiny" else "cpu")
  c.seed, c.num_seeds = config.seed, fid.num_seeds
  task_knobs = dict(num_roles=num_roles, demo_error_rate=fid.demo_error_rate)
  c.task = ml_collections.ConfigDict(dict(name="contribution", **task_knobs))
  c.protocol = ml_collections.ConfigDict(dict(name="contribution"))
  task = tasks.make("contribution", **task_knobs)
  layout = protocols.make("contribution", task).layout(task, (0,) * num_roles)
  c.model.max_len = max(c.model.max_len, layout.length)
  c.rl.batch_size = fid.batch_size
  c.sft.steps = fid.sft_steps
  c.credit = estimator_group(estimator, like={"outcome_weight": 0.0})  # where it takes one
  return c


def cost(exp) -> dict:
  """Re-runs (counterfactual episodes) and turns generated per episode, from the estimator's request."""
  turns = len(exp.layout.turn_slices)
  reruns = exp.credit.reruns(len(exp.layout.roles))
  if reruns is None:
    return {"reruns": 0, "turns": turns}
  free_CxT, absent_CxT, _ = rollout.rerun_masks(exp.layout, reruns)
  generated_CxT = free_CxT & ~absent_CxT
  redrawn = sum(generated_CxT[:, start:stop].any(1).sum() for start, stop in exp.layout.turn_slices)
  C = len(reruns.changed_CxR)
  return {"reruns": C * reruns.samples, "turns": turns + int(redrawn) * reruns.samples}


def success_probabilities(exp, params_R, problems):
  """Each role's exact probability of success (its message starts with its digit): p_BxR."""
  right = dataclasses.replace(exp.task, demo_error_rate=0.0)
  B = problems["prompt"].shape[0]
  tokens_BxT = exp.protocol.demonstrate(right, exp.layout, problems,
                                        jax.random.split(jax.random.PRNGKey(0), B))
  logp_BxT, _ = sampling.token_log_probs(exp.model, exp.layout, params_R, tokens_BxT,
                                         exp.config.rl.temperature)
  first_R = [exp.layout.turn_slices[exp.layout.role_turns(r)[0]][0] for r in range(len(exp.layout.roles))]
  return jnp.exp(logp_BxT[:, first_R])


def make_fidelity(exp, checkpoints: tuple[int, ...]):
  """`fidelity(params_S, credit_SxG, game_GxM, keys_SxAxB x 3) -> (credit_SxNxBxGxR, shapley, difference
  (each _SxBxGxR), metrics)`.  Each batch of episodes and its re-runs are drawn once and scored under
  every game (a value table, `Contribution.game_values`; games are vmapped, so one program serves them
  all); a stateful estimator (the critic, the role baseline) adapts on the first batches, one per game,
  and the last batch is credited after each of the `checkpoints` (ascending counts of adaptation
  batches, N of them).  `metrics`: the estimator's scalar metrics on the credited batch at each
  checkpoint, _SxNxG (the critic's loss there is on episodes it has not trained on)."""
  reruns = exp.credit.reruns(len(exp.layout.roles))

  def credit_under(game_M, credit_state, problems, episodes, tokens_CxKxBxT):
    problems = {**problems, "game_M": jnp.broadcast_to(game_M, (episodes.tokens_BxT.shape[0],) + game_M.shape)}
    outcome = train.score(exp, problems, episodes)[1]
    adv_xB, credit_state, metrics = train.credit_from_reruns(exp, credit_state, problems, outcome,
                                                             tokens_CxKxBxT)
    scalars = {k: v for k, v in metrics.items() if jnp.ndim(v) == 0}
    return adv_xB, credit_state, outcome.role_RxB, scalars

  every_game = jax.vmap(credit_under, in_axes=(0, 0, None, None, None))

  def local(params_R, credit_G, game_GxM, *keys_AxB):
    def play(problem_key_B, sample_key_B, rerun_key_B):
      problems = exp.task.sample_batch(problem_key_B)
      episodes = rollout.sample(exp, params_R, problems, sample_key_B)
      tokens_CxKxBxT = None if reruns is None else rollout.rerun_tokens(
          exp, params_R, episodes.tokens_BxT, rerun_key_B, reruns)
      return problems, episodes, tokens_CxKxBxT

    graded = play(*(k[-1] for k in keys_AxB))
    adapt = lambda credit_G, keys: (every_game(game_GxM, credit_G, *play(*keys))[1], None)
    if jax.tree.leaves(credit_G):
      credited, done = [], 0
      for checkpoint in checkpoints:
        segment = jax.tree.map(lambda k: k[done:checkpoint], keys_AxB)
        credit_G, _ = jax.lax.scan(adapt, credit_G, segment)
        credited.append(every_game(game_GxM, credit_G, *graded))
        done = checkpoint
    else:  # stateless estimators have nothing to adapt: no wasted re-runs, one credit for every checkpoint
      credited = [every_game(game_GxM, credit_G, *graded)] * len(checkpoints)
    adv_NxGxRxB = jnp.stack([adv for adv, *_ in credited])
    metrics_NxG = jax.tree.map(lambda *x: jnp.stack(x), *(m for *_, m in credited))
    success_BxR = credited[0][2][0].T  # which roles succeeded does not depend on the game
    problems = graded[0]
    p_BxR = success_probabilities(exp, params_R, problems)
    exact_GxBxR = [jax.vmap(lambda game_M: reference(functools.partial(exp.task.game_value, values_M=game_M),
                                                     success_BxR, *args))(game_GxM)
                   for reference, args in ((exact.exact_shapley, ()), (exact.exact_difference, (p_BxR,)))]
    by_row = lambda x_GxBxR: jnp.swapaxes(x_GxBxR, 0, 1)  # rows first, to gather them over devices
    adv_BxNxGxR = jnp.moveaxis(adv_NxGxRxB, -1, 0)
    credit_NxBxGxR, *exact_BxGxR = parallel.gather_rows((adv_BxNxGxR, *map(by_row, exact_GxBxR)))
    # Metrics are already means over devices (the estimator's own).
    return (jnp.swapaxes(credit_NxBxGxR, 0, 1), *exact_BxGxR, metrics_NxG)

  rows = P(None, parallel.DATA)
  sharded = parallel.shard_map(jax.vmap(local, in_axes=(0, 0, None, 0, 0, 0)), exp.mesh,
                               in_specs=(P(), P(), P(), P(None, *rows), P(None, *rows), P(None, *rows)),
                               out_specs=P())
  return jax.jit(sharded)


def spearman(x, y) -> float:
  """Rank correlation with average ranks for ties (credit values are few and tie often)."""
  def ranks(v):
    order = np.argsort(v, kind="stable")
    r = np.empty(len(v))
    r[order] = np.arange(len(v))
    _, inverse = np.unique(v, return_inverse=True)
    return (np.bincount(inverse, r) / np.bincount(inverse))[inverse]
  rx, ry = ranks(np.ravel(x)), ranks(np.ravel(y))
  if rx.std() == 0 or ry.std() == 0:
    return math.nan
  return float(np.corrcoef(rx, ry)[0, 1])


def grade(credit_SxBxR, exact_SxBxR) -> dict:
  """Per-seed bias, sd of the error and rank correlation, as {name: values_S}."""
  error = np.asarray(credit_SxBxR) - np.asarray(exact_SxBxR)
  return {"bias": error.mean((1, 2)), "error_sd": error.std((1, 2)),
          "spearman": np.array([spearman(c, e) for c, e in zip(credit_SxBxR, exact_SxBxR)])}


def checkpoints(fid) -> tuple[int, ...]:
  """The counts of adaptation batches after which stateful estimators are graded: `adapt_steps` (the
  grid's numbers) and those of `adapt_curve`, ascending."""
  return tuple(sorted({fid.adapt_steps, *map(int, names(fid.adapt_curve))}))


def fidelity_curves(config, num_roles: int, games: list[str], estimators: list[str] | None = None) -> dict:
  """Every estimator on the same warm-started policy and episodes, scored under every game:
  {game: {estimator: (exp, credit_SxNxBxR, exact Shapley_SxBxR, exact expected difference_SxBxR,
  {metric: values_SxN})}}, N the `checkpoints`: the same last batch credited after each count of
  adaptation batches.  The policy does not depend on the game (each role copies its own digit), so one
  warm start and one program per estimator serve every game.  `estimators`: those of
  config.estimators (the default)."""
  fid = config.fidelity
  exps = {name: experiment.build(fidelity_config(config, num_roles, name))
          for name in (names(config.estimators) if estimators is None else estimators)}
  first = next(iter(exps.values()))
  game_GxM = jnp.stack([dataclasses.replace(first.task, game=g).game_values() for g in games])
  keys_S = jax.random.split(jax.random.PRNGKey(config.seed), fid.num_seeds)
  params_S = sft.warm_start(first, keys_S)
  k_problem, k_sample, k_rerun = jax.random.split(jax.random.PRNGKey(config.seed + 1), 3)
  shape = (fid.num_seeds, checkpoints(fid)[-1] + 1, fid.batch_size)
  problem_keys = jax.random.split(k_problem, shape)
  # Rows b*G .. b*G+G-1 share a problem, as in training (group baselines read groups).
  G = first.config.rl.group_size
  problem_keys = jnp.repeat(problem_keys[:, :, ::G], G, axis=2)
  sample_keys, rerun_keys = jax.random.split(k_sample, shape), jax.random.split(k_rerun, shape)
  credits = {game: {} for game in games}
  for name, exp in exps.items():
    credit_S = jax.vmap(functools.partial(state_lib.init_state, exp))(keys_S, params_S).credit
    credit_SxG = jax.tree.map(lambda x: jnp.repeat(x[:, None], len(games), 1), credit_S)
    *outputs, metrics = make_fidelity(exp, checkpoints(fid))(params_S, credit_SxG, game_GxM, problem_keys,
                                                             sample_keys, rerun_keys)
    for g, game in enumerate(games):
      credits[game][name] = (exp, np.asarray(outputs[0][:, :, :, g]),
                             *(np.asarray(x[:, :, g]) for x in outputs[1:]),
                             {k: np.asarray(v[:, :, g]) for k, v in metrics.items()})
  return credits


def fidelity_credits(config, num_roles: int, games: list[str], estimators: list[str] | None = None) -> dict:
  """`fidelity_curves` after `adapt_steps` adaptation batches, the grid's numbers: {game: {estimator:
  (exp, credit_SxBxR, exact Shapley_SxBxR, exact expected difference_SxBxR)}}."""
  n = checkpoints(config.fidelity).index(config.fidelity.adapt_steps)
  return {game: {name: (exp, credit_SxNxBxR[:, n], shapley, difference)
                 for name, (exp, credit_SxNxBxR, shapley, difference, _) in by_estimator.items()}
          for game, by_estimator in fidelity_curves(config, num_roles, games, estimators).items()}


def grades(credit_SxBxR, shapley_SxBxR, difference_SxBxR) -> dict:
  """`grade` against both exact references, as a cell stores it: {REF_STAT: values_S as a list}."""
  return {f"{ref}_{k}": v.tolist() for ref, exact_SxBxR in (("shapley", shapley_SxBxR),
                                                             ("difference", difference_SxBxR))
          for k, v in grade(credit_SxBxR, exact_SxBxR).items()}


def run_fidelity_cell(config, num_roles: int, games: list[str], folder: str, estimators: list[str]) -> None:
  """The fidelity cells of one number of roles (`GAME-rR.json`, one per game): each of `estimators`'
  cost and its credit graded against both exact references, added to what the cell holds; with an
  `adapt_curve`, also its grades and scalar metrics (the critic's loss) after each checkpoint
  (`curve`: {"adapt_batches": [N], STAT: [N][S]}).  (An estimator's numbers do not depend on the others
  computed beside it: the warm start, problems and keys are the cell's.)"""
  n = checkpoints(config.fidelity).index(config.fidelity.adapt_steps)
  for game, by_estimator in fidelity_curves(config, num_roles, games, estimators).items():
    cell = fidelity_cell(config, folder, game, num_roles)
    for name, (exp, credit_SxNxBxR, shapley_SxBxR, difference_SxBxR, metrics) in by_estimator.items():
      cell["estimators"][name] = {**cost(exp), **grades(credit_SxNxBxR[:, n], shapley_SxBxR, difference_SxBxR)}
      if names(config.fidelity.adapt_curve):
        curve = [grades(credit_SxNxBxR[:, i], shapley_SxBxR, difference_SxBxR)
                 for i in range(credit_SxNxBxR.shape[1])]
        cell["estimators"][name]["curve"] = {
            "adapt_batches": list(checkpoints(config.fidelity)),
            **{k: [c[k] for c in curve] for k in curve[0]},
            **{k: v_SxN.T.tolist() for k, v_SxN in metrics.items()}}
    files.write_atomically(fidelity_path(folder, game, num_roles), json.dumps(cell))


def fidelity_settings(config) -> dict:
  """What a fidelity cell's numbers depend on besides its game, roles and estimators."""
  # An empty adapt_curve changes no number: cells written before it existed stay valid.
  settings = {k: v for k, v in config.fidelity.to_dict().items()
              if k not in ("games", "roles") and not (k == "adapt_curve" and not names(v))}
  return json.loads(json.dumps({"seed": config.seed, "size": config.size, **settings}))


def fidelity_cell(config, folder: str, game: str, num_roles: int) -> dict:
  """The cell as stored (an empty one where none is); ValueError for one computed with other
  settings, which a rerun must not mix with this run's."""
  path = fidelity_path(folder, game, num_roles)
  settings = fidelity_settings(config)
  if not os.path.exists(path):
    return {"game": game, "roles": num_roles, "seeds": config.fidelity.num_seeds, "settings": settings,
            "estimators": {}}
  with open(path) as f:
    cell = json.load(f)
  if "settings" not in cell:
    raise ValueError(f"{path} records no settings (written before cells recorded them), so its numbers "
                     f"cannot be checked against this run's: move it aside to recompute it, or give a "
                     f"new --workdir")
  if cell["settings"] != settings:
    raise ValueError(f"{path} was computed with other settings ({cell.get('settings')} there, {settings} "
                     f"now): give a new --workdir, or move that file aside to recompute it")
  return cell


def fidelity_path(folder: str, game: str, num_roles: int) -> str:
  return os.path.join(folder, f"{game}-r{num_roles}.json")


# Learning.

def run_learning_cell(config, scenario: str, estimator: str, workdir: str, base: str) -> None:
  """One estimator on one scenario from the scenario's shared warm start; adds its wall time to the
  cell's (an attempt killed outright loses its time)."""
  c = learning_config(config, scenario, estimator)
  c.init_from = base
  clock = time.perf_counter()
  loop.train_and_evaluate(c, workdir)
  seconds = wall_seconds(workdir, 0.0) + time.perf_counter() - clock
  files.write_atomically(wall_path(workdir), json.dumps({"seconds": seconds}))


def wall_path(workdir: str) -> str:
  return os.path.join(workdir, "wall_seconds.json")


def wall_seconds(workdir: str, missing: float = math.nan) -> float:
  """A learning cell's recorded wall time; `missing` where none was (a kill before it was written)."""
  if not os.path.exists(wall_path(workdir)):
    return missing
  with open(wall_path(workdir)) as f:
    return json.load(f)["seconds"]


def learning_config(config, scenario: str, estimator: str) -> ml_collections.ConfigDict:
  learn = config.learning
  c = ml_collections.ConfigDict(config.runs[scenario].to_dict())
  c.seed, c.num_seeds = config.seed, learn.num_seeds
  c.total_steps, c.eval_every = learn.total_steps, learn.eval_every
  # A cell longer than 50 steps also saves every 50, so a kill (not a signal, which saves) loses less.
  c.checkpoint_every = min(learn.total_steps, 50)
  # One step per call, logged: steps-to-target reads the per-step curve (evaluating that often would
  # cost more than training; one compiled call per step costs ~nothing next to a step on CPU).
  c.steps_per_call = c.log_every = 1
  c.credit = estimator_group(estimator)
  c.init_from = ""  # the scenario's base, for a learning cell (`run_learning_cell`)
  return c


def warm_start_base(config, scenario: str, base: str) -> None:
  """The scenario's base model (step 0 only): every estimator of the scenario starts from it."""
  c = learning_config(config, scenario, "team")
  c.total_steps = 0
  loop.train_and_evaluate(c, base)


def learning_curve(workdir: str, member: bool = False):
  """steps_N and per seed the eval accuracy acc_NxS: the team's, or (`member`) the average member's own
  (NaN where no member's is defined; None for a run whose members do not answer)."""
  rows = [r for r in metrics.read(workdir) if "eval_accuracy" in r]
  steps_N = np.array([r["step"] for r in rows])
  if not member:
    return steps_N, np.stack([runs.seed_values(r, "eval_accuracy") for r in rows])
  keys = report.member_names(rows[-1])
  if not keys:
    return steps_N, None
  with warnings.catch_warnings():  # a seed where no member's accuracy is defined: NaN
    warnings.simplefilter("ignore", RuntimeWarning)
    return steps_N, np.stack([np.nanmean([runs.seed_values(r, f"eval_{k}") for k in keys], 0) for r in rows])


# The report.

def ci_cells(prefix: str, values) -> dict:
  values = np.asarray(values, np.float64)
  values = values[np.isfinite(values)]
  mean, half = intervals.mean_ci(values) if len(values) else (math.nan, math.nan)
  return {prefix: mean, f"{prefix}_ci": half}


def fidelity_records(config, workdir: str):
  """(game, roles, estimator, seeds, its record) for each estimator of config.estimators held in each
  configured cell (game x number of roles)."""
  folder = os.path.join(workdir, "fidelity")
  for num_roles in [int(r) for r in names(config.fidelity.roles)]:
    for game in names(config.fidelity.games):
      cell = fidelity_cell(config, folder, game, num_roles)
      for name in names(config.estimators):
        if name in cell["estimators"]:
          yield game, num_roles, name, cell["seeds"], cell["estimators"][name]


def fidelity_rows(config, workdir: str) -> list[dict]:
  """One row per estimator of config.estimators in each configured cell (game x number of roles)."""
  rows = []
  for game, num_roles, name, seeds, r in fidelity_records(config, workdir):
    row = {"game": game, "roles": num_roles, "estimator": name, "seeds": seeds,
           "reruns": r["reruns"], "turns": r["turns"]}
    for ref in ("shapley", "difference"):
      for stat in ("bias", "error_sd", "spearman"):
        row.update(ci_cells(f"{ref}_{stat}", r[f"{ref}_{stat}"]))
        row[f"{ref}_{stat}_S"] = r[f"{ref}_{stat}"]  # per seed, for the means over games
    rows.append(row)
  return rows


def curve_rows(config, workdir: str) -> list[dict]:
  """With an `adapt_curve`: one row per estimator, cell and count of adaptation batches, its grades and
  scalar metrics there (`STAT` and its interval, `STAT_S` per seed), as `fidelity_rows`."""
  if not names(config.fidelity.adapt_curve):
    return []
  rows = []
  for game, num_roles, name, seeds, r in fidelity_records(config, workdir):
    for i, batches in enumerate(r["curve"]["adapt_batches"]):
      row = {"game": game, "roles": num_roles, "estimator": name, "adapt_batches": batches, "seeds": seeds}
      for stat, values_NxS in r["curve"].items():
        if stat != "adapt_batches":
          row.update(ci_cells(stat, values_NxS[i]))
          row[f"{stat}_S"] = values_NxS[i]
      rows.append(row)
  return rows


def learning_rows(config, workdir: str) -> list[dict]:
  """One row per finished cell.  Every estimator of a scenario trains the same seeds from the same
  warm start, so each is also compared with `team` seed by seed (paired differences: final accuracy,
  and steps to target over the seeds where both reach it).  Where the workflow's members answer, the
  average member's final accuracy (`member`) stands beside the team's; both are compared with the
  `team` cell of the reference scenario on the same task (`learning.reference`: the single agents, each
  trained as usual) once it has finished in this workdir (Welch: other warm starts, so not paired)."""
  rows = []
  for scenario in names(config.learning.scenarios):
    reference = reference_run(config, workdir, scenario)
    reference_S = report.summarize(reference)["final"] if reference else None
    per_seed = {}  # estimator -> (final_S, steps_to_target_S, member_S or None)
    for name in names(config.estimators):
      run = os.path.join(workdir, "learning", scenario, name)
      if not runs.finished(run, config.learning.total_steps):
        continue
      s = report.summarize(run)
      # The training batch's accuracy (sampled episodes, the outcome the estimators are credited on):
      # eval accuracy, every `eval_every` steps, is too coarse (on CPU every learner crossed 50% at the
      # first evaluation).
      to_target = runs.steps_to(run, config.learning.target, metric="accuracy")
      row = {"scenario": scenario, "estimator": name, "seeds": s["seeds"],
             "reached_target": float(np.isfinite(to_target).mean()),
             **cost(experiment.build(learning_config(config, scenario, name))),
             "wall_seconds": wall_seconds(run)}
      for stat in ("final", "peak", "drop"):
        row.update(ci_cells(stat, s[stat]))
      row.update(ci_cells("steps_to_target", to_target))
      if report.MEMBER in s:
        row.update(ci_cells("member", s[report.MEMBER]))
      per_seed[name] = (s["final"], to_target, s.get(report.MEMBER))
      rows.append(row)
    scenario_rows = rows[len(rows) - len(per_seed):]
    if "team" in per_seed:
      team_final_S, team_steps_S, _ = per_seed["team"]
      for row in scenario_rows:
        final_S, steps_S, _ = per_seed[row["estimator"]]
        row.update(ci_cells("final_vs_team", final_S - team_final_S))
        with np.errstate(invalid="ignore"):  # inf - inf where neither reaches: dropped with the others
          row.update(ci_cells("steps_vs_team", steps_S - team_steps_S))
    if reference_S is not None:
      for row in scenario_rows:
        final_S, _, member_S = per_seed[row["estimator"]]
        row.update(welch_cells("final_vs_reference", reference_S, final_S))
        if member_S is not None:
          row.update(welch_cells("member_vs_reference", reference_S, member_S))
  return rows


def reference_run(config, workdir: str, scenario: str) -> str | None:
  """The finished `team` cell of the reference scenario (`learning.reference`) on `scenario`'s task in
  this workdir; None for a reference itself, or where none has finished."""
  task = config.runs[scenario].task.name
  for reference in names(config.learning.reference):
    run = os.path.join(workdir, "learning", reference, "team")
    if (reference != scenario and config.runs[reference].task.name == task
        and runs.finished(run, config.learning.total_steps)):
      return run
  return None


def welch_cells(prefix: str, a_S, b_S) -> dict:
  """mean(b) - mean(a) and the half-width of its Welch interval, over each side's defined seeds (a
  member's accuracy is NaN on a seed where it answered nothing)."""
  diff, half, _ = intervals.welch_diff(*(intervals.defined(x) for x in (a_S, b_S)))
  return {prefix: diff, f"{prefix}_ci": half}


def write_csv(path: str, rows: list[dict]) -> None:
  if not rows:
    return
  with open(path, "w", newline="") as f:
    # Columns of every row (a scenario whose `team` cell has not run has no columns compared with it).
    writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
    writer.writeheader()
    writer.writerows(rows)


def fmt(row: dict, key: str, scale: float = 1.0, digits: int = 3) -> str:
  mean, half = row[key] * scale, row[f"{key}_ci"] * scale
  if not math.isfinite(mean):
    return "n/a"
  return f"{mean:.{digits}f} ± {half:.{digits}f}" if math.isfinite(half) else f"{mean:.{digits}f}"


def by_estimator(fid_rows: list[dict], keys=("roles", "estimator", "reruns", "turns"),
                 stats=("shapley_error_sd", "shapley_spearman", "difference_error_sd",
                        "difference_spearman")) -> list[dict]:
  """The fidelity grid in one row per number of roles x estimator (per value of `keys`): each
  statistic's mean over the games, with the 95% interval over seeds of each seed's mean over games
  (`STAT_S` per seed in the per-game rows; games where a seed's statistic is undefined are left out of
  that seed's mean)."""
  rows = []
  for values in dict.fromkeys(tuple(r[k] for k in keys) for r in fid_rows):
    mine = [r for r in fid_rows if tuple(r[k] for k in keys) == values]
    row = {**dict(zip(keys, values)), "games": len(mine)}
    for k in stats:
      games_S = np.array([r[f"{k}_S"] for r in mine], np.float64)
      with warnings.catch_warnings():  # a seed with no defined value in any game: nan, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        row.update(ci_cells(k, np.nanmean(games_S, axis=0)))
    rows.append(row)
  return sorted(rows, key=lambda r: r["roles"])


def curve_markdown(curve_rows: list[dict]) -> list[str]:
  """The fidelity against adaptation batches, mean over games: the same episodes credited after each
  count; the estimator's scalar metrics (the critic's loss and explained variance) on them beside."""
  metrics = list(dict.fromkeys(k[:-2] for r in curve_rows for k in r if k.endswith("_S")
                               and not k.startswith(("shapley_", "difference_"))))
  stats = ("difference_spearman", "difference_error_sd", "shapley_spearman", *metrics)
  rows = by_estimator([{**{f"{m}_S": [math.nan] * r["seeds"] for m in metrics}, **r} for r in curve_rows],
                      ("roles", "estimator", "adapt_batches"), stats)
  out = ["\n### Against adaptation batches (mean over games)\n\n",
         "The same last batch credited after each count of adaptation batches; an estimator's metrics on "
         "it are from before any update on it.\n\n",
         report.row("R", "estimator", "adaptation batches", "ρ difference", "sd vs difference",
                    "ρ Shapley", *metrics),
         "|---" * (6 + len(metrics)) + "|\n"]
  out += [report.row(r["roles"], r["estimator"], r["adapt_batches"], fmt(r, "difference_spearman", digits=2),
                     fmt(r, "difference_error_sd"), fmt(r, "shapley_spearman", digits=2),
                     *(fmt(r, m) for m in metrics)) for r in rows]
  return out


def markdown(config, fid_rows, learn_rows, curve_rows=()) -> str:
  out = ["# Credit-assignment benchmark\n",
         f"Config: size={config.size}, seed={config.seed}. Mean over seeds ± half-width of its 95% "
         "interval (Student t, n − 1 dof).\n\n"]
  if fid_rows:
    out += ["\n## Fidelity: per-role credit against exact values\n",
            "credit − exact: bias and sd over episodes and roles; ρ: Spearman rank correlation; cost: "
            "counterfactual re-runs and turns generated per episode.\n"]
    out += ["\n### Mean over games\n\n",
            report.row("R", "estimator", "games", "re-runs", "turns", "sd vs Shapley", "ρ Shapley",
                       "sd vs difference", "ρ difference"),
            "|---" * 9 + "|\n"]
    out += [report.row(r["roles"], r["estimator"], r["games"], r["reruns"], r["turns"],
                       fmt(r, "shapley_error_sd"), fmt(r, "shapley_spearman", digits=2),
                       fmt(r, "difference_error_sd"), fmt(r, "difference_spearman", digits=2))
            for r in by_estimator(fid_rows)]
    if curve_rows:
      out += curve_markdown(curve_rows)
    out += ["\n### Per game\n\n",
            report.row("game", "R", "estimator", "re-runs", "turns", "bias vs Shapley", "sd vs Shapley",
                       "ρ Shapley", "bias vs difference", "sd vs difference", "ρ difference"),
            "|---" * 11 + "|\n"]
    out += [report.row(r["game"], r["roles"], r["estimator"], r["reruns"], r["turns"],
                       fmt(r, "shapley_bias"), fmt(r, "shapley_error_sd"), fmt(r, "shapley_spearman", digits=2),
                       fmt(r, "difference_bias"), fmt(r, "difference_error_sd"),
                       fmt(r, "difference_spearman", digits=2)) for r in fid_rows]
  if learn_rows:
    reference = config.learning.reference
    against = ["Δ final vs single", "Δ member vs single"] if reference else []
    out += [f"\n## Learning: eval accuracy (%); steps until the training batch's accuracy reaches "
            f"{config.learning.target:.0%}\n\n",
            "member: the average member's own answer; re-runs and turns: the estimator's cost per "
            "episode (counterfactual re-runs, turns generated).  Paired with `team` seed by seed: Δ final and Δ "
            "steps (over the seeds where both reach the target)"
            + (f"; vs single: against the `team` cell of the reference on the same task ({reference}), "
               "Welch" if reference else "") + ".\n\n",
            report.row("scenario", "estimator", "seeds", "final", "member", "peak", "drop", "steps to target",
                       "reached", "Δ final vs team", "Δ steps vs team", *against, "re-runs", "turns",
                       "wall (s)"),
            "|---" * (14 + len(against)) + "|\n"]
    cell = lambda r, key, scale=100, digits=1: fmt(r, key, scale, digits) if key in r else "n/a"
    out += [report.row(r["scenario"], r["estimator"], r["seeds"], cell(r, "final"), cell(r, "member"),
                       cell(r, "peak"), cell(r, "drop"), cell(r, "steps_to_target", 1, 0),
                       f"{r['reached_target']:.0%}", cell(r, "final_vs_team"), cell(r, "steps_vs_team", 1),
                       *[cell(r, k) for k in ("final_vs_reference", "member_vs_reference")[:len(against)]],
                       r["reruns"], r["turns"], f"{r['wall_seconds']:.0f}") for r in learn_rows]
  return "".join(out)


def plot_learning(config, workdir: str, folder: str) -> None:
  """Per scenario, the eval accuracy of each finished cell against steps with its 95% band over seeds:
  the team's, and where members answer, the average member's beside it; the single agent on the same
  task (`learning.reference`, trained with `team`) dashed in both."""
  for scenario in names(config.learning.scenarios):
    cells = {name: os.path.join(workdir, "learning", scenario, name) for name in names(config.estimators)}
    cells = {name: run for name, run in cells.items() if runs.finished(run, config.learning.total_steps)}
    if not cells:
      continue
    has_members = learning_curve(next(iter(cells.values())), member=True)[1] is not None
    fig = Figure(figsize=(11 if has_members else 6, 4))
    axes = fig.subplots(1, 2 if has_members else 1, squeeze=False)[0]
    reference = reference_run(config, workdir, scenario)
    reference_curve = learning_curve(reference) if reference else None
    for ax, member in zip(axes, (False, True)):
      for name, run in cells.items():
        band(ax, *learning_curve(run, member), label=name)
      if reference_curve is not None:
        band(ax, *reference_curve, label="single agent (team)", color="black", linestyle="--")
      ax.set(title=f"{scenario}: {'average member' if member else 'team'} eval accuracy, 95% band",
             xlabel="step", ylabel="accuracy (%)")
      ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, f"learning_{scenario}.png"), dpi=100)


def band(ax, steps_N, acc_NxS, **style) -> None:
  """The mean over seeds of acc_NxS (fractions) in %, with its 95% band where there are several seeds."""
  mean, half = (100 * np.array(x) for x in zip(*[intervals.mean_ci(intervals.defined(a)) for a in acc_NxS]))
  line, = ax.plot(steps_N, mean, **style)
  if acc_NxS.shape[1] > 1:
    ax.fill_between(steps_N, mean - half, mean + half, alpha=0.15, color=line.get_color())


def plot_fidelity(fid_rows: list[dict], folder: str) -> None:
  if not fid_rows:
    return
  fig = Figure(figsize=(10, 4))
  axes = fig.subplots(1, 2)
  for ax, ref in zip(axes, ("shapley", "difference")):
    for name in dict.fromkeys(r["estimator"] for r in fid_rows):
      mine = [r for r in fid_rows if r["estimator"] == name]
      ax.scatter([r["turns"] for r in mine], [r[f"{ref}_error_sd"] for r in mine], label=name, s=18)
    ax.set(xscale="log", xlabel="turns generated per episode", ylabel=f"sd of credit − exact {ref}",
           title=f"fidelity against cost ({ref})")
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(folder, "fidelity_vs_cost.png"), dpi=100)


def write_report(config, workdir: str) -> str:
  folder = os.path.join(workdir, "report")
  os.makedirs(folder, exist_ok=True)
  fid_rows, learn_rows = fidelity_rows(config, workdir), learning_rows(config, workdir)
  curve = curve_rows(config, workdir)
  write_csv(os.path.join(folder, "fidelity.csv"), fid_rows)
  write_csv(os.path.join(folder, "fidelity_curve.csv"), curve)
  write_csv(os.path.join(folder, "learning.csv"), learn_rows)
  text = markdown(config, fid_rows, learn_rows, curve)
  with open(os.path.join(folder, "report.md"), "w") as f:
    f.write(text)
  plot_learning(config, workdir, folder)
  plot_fidelity(fid_rows, folder)
  return text


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  """Runs the missing cells of both grids, then writes the report (returns its markdown)."""
  games, estimators = names(config.fidelity.games), names(config.estimators)
  scenarios = names(config.learning.scenarios)
  learn_cells = [(s, e) for s in scenarios for e in estimators]
  folder = os.path.join(workdir, "fidelity")
  # Every name, setting and run config of both grids, and the cells already there, are checked before
  # anything compiles.
  try:
    check(config)
    roles = [int(r) for r in names(config.fidelity.roles)]
    for name in estimators:
      for r in roles:
        with _naming(f"the fidelity cell of {r} roles, estimator {name!r} (config.fidelity)"):
          experiment.build(fidelity_config(config, r, name))
        for game in games:
          fidelity_cell(config, folder, game, r)
    for scenario, name in learn_cells:
      with _naming(f"the learning cell {scenario}/{name} (config.runs.{scenario} and config.learning)"):
        experiment.build(learning_config(config, scenario, name))
  except ValueError as e:
    raise experiment.ConfigError(str(e)) from e
  os.makedirs(folder, exist_ok=True)
  with tqdm.tqdm(total=len(roles) + len(scenarios) + len(learn_cells), desc="benchmark") as bar:
    for num_roles in roles:
      held = {g: fidelity_cell(config, folder, g, num_roles)["estimators"] for g in games}
      missing_games = [g for g in games if any(e not in held[g] for e in estimators)]
      missing = [e for e in estimators if any(e not in held[g] for g in missing_games)]
      if missing_games:
        run_fidelity_cell(config, num_roles, missing_games, folder, missing)
      bar.update()
    for scenario in scenarios:
      base = os.path.join(workdir, "learning", scenario, "base")
      if not runs.finished(base, 0):
        warm_start_base(config, scenario, base)
        _stop_unless_finished(base, 0)
      bar.update()
    for scenario, name in learn_cells:
      run_dir = os.path.join(workdir, "learning", scenario, name)
      if not runs.finished(run_dir, config.learning.total_steps):
        run_learning_cell(config, scenario, name, run_dir, os.path.join(workdir, "learning", scenario, "base"))
        _stop_unless_finished(run_dir, config.learning.total_steps)
      bar.update()
  return write_report(config, workdir)


@contextlib.contextmanager
def _naming(where: str):
  """A ValueError raised inside says which cell's run config it is about."""
  try:
    yield
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from e


def _stop_unless_finished(workdir: str, total_steps: int) -> None:
  """A cell that returned unfinished was stopped by a signal (it saved a checkpoint to resume from):
  the benchmark stops too, instead of moving on and reporting without it."""
  latest = checkpoint.latest_step(workdir)
  if latest is not None and latest > total_steps:
    raise SystemExit(f"{workdir} holds a checkpoint at step {latest}, past config.learning.total_steps="
                     f"{total_steps}: give that many steps, or a new --workdir")
  if not runs.finished(workdir, total_steps):
    raise SystemExit(f"stopped by a signal in {workdir}; run the same command again to resume")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  # The cells of one scenario share their evaluation programs (they differ only in the estimator, which
  # evaluation does not use), and a resumed benchmark recompiles every cell it had begun: a persistent
  # compilation cache in the workdir compiles each program once (unless one is configured already).
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", os.path.join(_WORKDIR.value, "compilation_cache"))
  try:
    print(run(_CONFIG.value, _WORKDIR.value))
  except experiment.ConfigError as e:  # one line, no traceback, exit status 1
    sys.exit(f"FATAL ConfigError: {e}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
