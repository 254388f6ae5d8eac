"""scripts/peer_review_results.sh at its tiny size (SIZE=tiny): a base warm start shared by the cells of
one layout, the cells from it, a finished cell not re-run, and the report with the audit-rate plot."""
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
