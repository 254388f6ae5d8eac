"""Finished run directories read back: a seed's values in a logged row (`seed_values`), whether a run
finished (`finished`), the first logged step at which a metric reaches a target (`steps_to`), its
evaluation at a step (`eval_at`) and its last (`final_eval`)."""
import os

import numpy as np

from marl_jax import checkpoint, metrics


def seed_values(row: dict, name: str) -> np.ndarray:
  """`name` per seed: `name/seedI` in seed order (seed10 after seed9), or `name` for a single seed."""
  per_seed = sorted((k for k in row if k.startswith(f"{name}/seed")), key=lambda k: int(k.split("seed")[1]))
  return np.array([row[k] for k in per_seed] or [row[name]])


def finished(workdir: str, total_steps: int) -> bool:
  return os.path.isdir(workdir) and checkpoint.latest_step(workdir) == total_steps


def final_eval(workdir: str) -> dict:
  """The last evaluation row of a run's metrics."""
  return [r for r in metrics.read(workdir) if "eval_accuracy" in r][-1]


def eval_at(workdir: str, step: int) -> dict | None:
  """The evaluation row of a run's metrics at `step`, None if it has none there."""
  return next((r for r in metrics.read(workdir) if "eval_accuracy" in r and r["step"] == step), None)


def steps_to(workdir: str, target_S, metric: str = "eval_accuracy") -> np.ndarray:
  """Per seed, the first logged step at which `metric` reaches target_S (one target, or one per seed;
  inf if never).  `eval_accuracy` is logged every `eval_every` steps, its step 0 the one after the
  warm start; `accuracy`, the training batch's, every step."""
  rows = [r for r in metrics.read(workdir) if metric in r]
  values_NxS = np.stack([seed_values(r, metric) for r in rows])
  steps_N = np.array([r["step"] for r in rows], np.float64)
  reached_NxS = values_NxS >= np.asarray(target_S)
  return np.where(reached_NxS.any(0), steps_N[reached_NxS.argmax(0)], np.inf)
