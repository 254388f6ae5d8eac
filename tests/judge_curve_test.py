"""The judges' learning curve on labels alone (`marl_jax.tools.judge_curve`)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from marl_jax import configs
from marl_jax.tools import judge_curve

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_workflow_whose_judges_state_no_level_is_refused_naming_the_workdir(tmp_path):
  config = configs.sibling(str(ROOT / "experiments" / "x.py"), "single_agent").get_config("size=tiny")
  (tmp_path / "config.json").write_text(config.to_json())
  with pytest.raises(ValueError, match=f"--workdir={tmp_path}: its workflow's judges write no level"):
    judge_curve.run(str(tmp_path), labels=64, held=64, updates=2, every=1)


@pytest.mark.slow  # a warm start, then the curve: two compiled programs
def test_judges_trained_on_a_pool_alone_fit_it_through_the_cli(tmp_path):
  # Two seeds' warm-started peer review (arithmetic), then 60 updates on a pool of 64 labelled answers:
  # the judges fit the pool (its AUROC rises), whatever they learn of the held-out answers.
  base = tmp_path / "base"
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  subprocess.run([sys.executable, "-m", "marl_jax.main", "--config=experiments/peer_review.py:size=tiny,task=arithmetic,"
                  "pay=team,audit_rate=0", f"--workdir={base}", "--config.total_steps=0", "--config.num_seeds=2"],
                 cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
  assert json.loads((base / "config.json").read_text())["num_seeds"] == 2
  proc = subprocess.run([sys.executable, "-m", "marl_jax.tools.judge_curve", f"--workdir={base}", "--labels=64",
                         "--held=128", "--updates=60", "--every=30"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [line.split(" | ") for line in proc.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
  assert [r[0] for r in rows] == ["| 0", "| 30", "| 60"], proc.stdout
  pool_auroc = [float(r[1].split(" ± ")[0]) for r in rows]
  assert pool_auroc[-1] > pool_auroc[0] + 20, proc.stdout
