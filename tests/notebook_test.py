"""notebooks/quickstart.ipynb runs top to bottom at its tiny size (train, transcripts, plots)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quickstart_notebook_runs(tmp_path):
  # TMPDIR: the notebook's workdir (a tempfile.mkdtemp) lands in pytest's tmp_path, not in /tmp.
  env = {**os.environ, "MARL_JAX_NOTEBOOK_SIZE": "tiny", "TMPDIR": str(tmp_path)}
  result = subprocess.run(
      [sys.executable, "-m", "pytest", "--nbmake", "--nbmake-timeout=600", "-q",
       "notebooks/quickstart.ipynb"],
      cwd=ROOT, env=env, capture_output=True, text=True)
  assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
