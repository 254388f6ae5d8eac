"""runs: finished run directories read back."""
import json

import numpy as np

from marl_jax.tools import runs


def test_seed_values_in_seed_order():
  row = {"x": 5.0, **{f"x/seed{i}": float(i) for i in (10, 2, 0, 11, 1, 3, 4, 5, 6, 7, 8, 9)}}
  np.testing.assert_array_equal(runs.seed_values(row, "x"), np.arange(12))  # seed10 after seed9
  np.testing.assert_array_equal(runs.seed_values({"x": 5.0}, "x"), [5.0])


def test_steps_to_reads_the_metric_it_is_given(tmp_path):
  # Two seeds: seed 0 first reaches 0.9 at step 2, seed 1 never; eval rows (every 2 steps) do not count.
  rows = [{"step": 0, "accuracy/seed0": 0.5, "accuracy/seed1": 0.2, "eval_accuracy/seed0": 1.0,
           "eval_accuracy/seed1": 1.0},
          {"step": 1, "accuracy/seed0": 0.89, "accuracy/seed1": 0.3},
          {"step": 2, "accuracy/seed0": 0.9, "accuracy/seed1": 0.8},
          {"step": 3, "accuracy/seed0": 0.7, "accuracy/seed1": 0.85}]
  for r in rows:  # the trainer logs the mean beside the per-seed values
    r["accuracy"] = (r["accuracy/seed0"] + r["accuracy/seed1"]) / 2
  rows[0]["eval_accuracy"] = 1.0
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  np.testing.assert_array_equal(runs.steps_to(str(tmp_path), 0.9, metric="accuracy"), [2.0, np.inf])
  # Per-seed targets on the evaluation rows: seed 0's 1.0 is reached at step 0, seed 1's 1.1 never.
  np.testing.assert_array_equal(runs.steps_to(str(tmp_path), [1.0, 1.1]), [0.0, np.inf])
