"""scripts/peer_review_results.sh at its tiny size (SIZE=tiny): a base warm start shared by the cells of
one layout, the cells from it, a finished cell not re-run, and the report with the audit-rate plot; the
judge cells' own bases; scripts/judge_pair_results.sh at its tiny size."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script(out, cells: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "SIZE": "tiny", "CELLS": cells, "SEEDS": "0"}
  return subprocess.run(["bash", "scripts/peer_review_results.sh", str(out)], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=1200)


@pytest.mark.slow
def test_the_study_runs_its_cells_from_one_warm_start_resumes_and_reports(tmp_path):
  done = _script(tmp_path, "checker audited_team_0.1")
  assert done.returncode == 0, done.stderr[-3000:]
  seed0 = tmp_path / "seed0"
  assert sorted(p.name for p in seed0.iterdir() if p.is_dir()) == ["audited_team_0.1", "base_judges", "checker"]
  for cell in ("checker", "audited_team_0.1"):
    config = json.loads((seed0 / cell / "config.json").read_text())
    assert config["init_from"] == f"{seed0}/base_judges" and config["num_seeds"] == 2
  assert json.loads((seed0 / "audited_team_0.1" / "config.json").read_text())["reward"]["share"] == 0.1
  assert (seed0 / "rates.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert f"B = {seed0}/audited_team_0.1 (seeds: 2)" in done.stdout and "labels_per_episode" in done.stdout
  # Rerun: nothing trains again (no metrics row added), the report is printed again.
  rows = (seed0 / "checker" / "metrics.jsonl").read_text()
  again = _script(tmp_path, "checker audited_team_0.1")
  assert again.returncode == 0 and "## seeds 0.." in again.stdout
  assert (seed0 / "checker" / "metrics.jsonl").read_text() == rows


@pytest.mark.slow
def test_the_judge_cells_run_from_their_own_bases(tmp_path):
  # docs/results/judges.md's cells of a base of their own: the judges a model twice as wide (width128),
  # an easier task (easy, 3 numbers), each taught by a proper score instead of its policy gradient.
  done = _script(tmp_path, "width128_supervised_0.1 easy_supervised_0.1")
  assert done.returncode == 0, done.stderr[-3000:]
  seed0 = tmp_path / "seed0"
  width = json.loads((seed0 / "width128_supervised_0.1" / "config.json").read_text())
  assert width["models"]["judge"]["d_model"] == 128 and width["roles"]["models"] == "model,judge"
  assert width["reward"]["judge_pg"] is False and width["reward"]["verdict"] == "expected"
  easy = json.loads((seed0 / "easy_supervised_0.1" / "config.json").read_text())
  assert easy["task"]["num_numbers"] == 3 and easy["init_from"] == f"{seed0}/base_easy"


@pytest.mark.slow
def test_the_generator_verifier_study_runs_each_arm_and_compares_it_with_one_agent(tmp_path):
  env = {**os.environ, "SIZE": "tiny", "WIDTHS": "32", "RUNS": "single pair_peer", "SEEDS": "0"}
  done = subprocess.run(["bash", "scripts/judge_pair_results.sh", str(tmp_path)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=1200)
  assert done.returncode == 0, done.stderr[-3000:]
  peer = json.loads((tmp_path / "seed0" / "d32" / "pair_peer" / "config.json").read_text())
  assert peer["model"]["d_model"] == 32 and peer["reward"]["judge_loss"] == "brier" and peer["reward"]["audit_rate"] == 0.1
  assert "## seeds 0.., d_model 32" in done.stdout and f"B = {tmp_path}/seed0/d32/pair_peer" in done.stdout
