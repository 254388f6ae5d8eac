"""The solver–verifier pair with its verdict decided by a threshold (`marl_jax.tools.verdict_rule`)."""
import json
import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import configs
from marl_jax.tools import verdict_rule

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_answer_stands_where_the_verifier_is_sure_enough_else_its_revision():
  # Four answers (right, wrong, right, wrong), the verifier's P(ACCEPT) on each and whether its revision
  # is right.  t = 0: every answer stands, 2/4.  t = 0.3: answers 0, 1, 3 stand (1, 0, 0), answer 2 is
  # revised (1): 2/4.  t = 0.5: answers 0 and 3 stand (1, 0), 1 and 2 are revised (1, 1): 3/4.  Above 1:
  # every revision, 3/4.
  p_B, answer_right_B, revision_right_B = jnp.array([0.9, 0.4, 0.2, 0.6]), jnp.array([1.0, 0, 1, 0]), jnp.array([0.0, 1, 1, 1])
  np.testing.assert_allclose(verdict_rule.team_accuracy(p_B, answer_right_B, revision_right_B, (0.0, 0.3, 0.5, 1.01)),
                             [0.5, 0.5, 0.75, 0.75])


def _write_config(workdir, name, arg):
  config = configs.sibling(str(ROOT / "experiments" / "x.py"), name).get_config(arg)
  (workdir / "config.json").write_text(config.to_json())


def test_a_run_that_is_not_a_one_round_solver_verifier_or_too_many_episodes_is_refused(tmp_path):
  _write_config(tmp_path, "single_agent", "size=tiny")
  with pytest.raises(ValueError, match=f"--workdir={tmp_path}: a 'single' run with rounds=None; allowed: a "
                                       "solver_verifier run of one round"):
    verdict_rule.run(str(tmp_path), episodes=8)
  _write_config(tmp_path, "solver_verifier", "size=tiny")
  with pytest.raises(ValueError, match=r"--episodes=65; allowed: 1..64 \(the run's config.eval.size\)"):
    verdict_rule.run(str(tmp_path), episodes=65)


@pytest.mark.slow  # a warm start, then the tool: two compiled programs
def test_every_threshold_lies_between_the_solver_alone_and_the_oracle_through_the_cli(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  subprocess.run([sys.executable, "-m", "marl_jax.main", "--config=experiments/solver_verifier.py:size=tiny",
                  f"--workdir={tmp_path}", "--config.total_steps=0", "--config.num_seeds=2"],
                 cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
  assert json.loads((tmp_path / "config.json").read_text())["num_seeds"] == 2
  proc = subprocess.run([sys.executable, "-m", "marl_jax.tools.verdict_rule", f"--workdir={tmp_path}", "--episodes=32"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = {line.split(" | ")[0][2:]: float(line.split(" | ")[1].split(" ± ")[0])
          for line in proc.stdout.splitlines() if line.startswith("| ") and " ± " in line}
  thresholds = [rows[name] for name in rows if name.startswith("t ")]
  assert len(thresholds) == len(verdict_rule.THRESHOLDS), proc.stdout
  # The best threshold of each seed is at least any one threshold's, and no rule beats the oracle.
  assert max(thresholds) <= rows["best t per seed (fitted on these problems)"] <= rows["oracle: max(answer, revision)"]
  assert "AUROC of p for a right answer" in proc.stdout
