"""Cross-play: two identical teams play as well across as within (equal self- and cross-play); each
pairing takes the role from the row's team and the rest from the column's; roles that share a
parameter set cannot be paired; the CLI."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from archive_test import ROOT, tiny_experiment, write_run

from marl_jax import experiment
from marl_jax.tools import crossplay


@pytest.fixture(scope="module")
def signalling_run(tmp_path_factory):
  """A tiny signalling run of two seeds (two teams of random parameters), saved as training saves it."""
  exp = tiny_experiment("signalling", eval_size=64)
  config = exp.config
  config.num_seeds = 2
  workdir = str(tmp_path_factory.mktemp("crossplay") / "run")
  write_run(workdir, experiment.build(config))
  return workdir


@pytest.mark.slow  # the module's tests share a saved run (5 s): all three in the slow tier
def test_identical_teams_play_as_well_across_as_within(signalling_run):
  exp, params_N, names = crossplay.teams([signalling_run])
  assert names == [f"{signalling_run}:seed0", f"{signalling_run}:seed1"]
  same_N = jax.tree.map(lambda p: jnp.stack([p[0], p[0]]), params_N)  # team 0 twice
  values = crossplay.matrices(exp, same_N, "sender")
  for value_NxN in values.values():
    np.testing.assert_array_equal(value_NxN, value_NxN[0, 0])
  summary = crossplay.self_and_cross(values["accuracy"])
  assert summary["self_play"] == summary["cross_play"]


@pytest.mark.slow
def test_each_pairing_takes_the_role_from_the_rows_team_and_the_rest_from_the_columns(signalling_run):
  # The code's measures read the sender's messages only: with the sender from the row's team they are
  # the row's own all along the row; with the receiver from the row's team, the column's.
  exp, params_N, _ = crossplay.teams([signalling_run])
  by_sender = crossplay.matrices(exp, params_N, "sender")["mutual_information"]
  by_receiver = crossplay.matrices(exp, params_N, "receiver")["mutual_information"]
  np.testing.assert_array_equal(by_sender, np.diag(by_sender)[:, None].repeat(2, 1))
  np.testing.assert_array_equal(by_receiver, np.diag(by_receiver)[None].repeat(2, 0))
  assert by_sender[0, 0] != by_sender[1, 1]  # two teams, two codes
  np.testing.assert_array_equal(np.diag(by_sender), np.diag(by_receiver))  # self-play either way
  with pytest.raises(ValueError, match=r"--role='judge' is not a role of this workflow; allowed: \['sender', 'receiver'\]"):
    crossplay.paired(exp, params_N, "judge")
  shared = experiment.build(_shared(exp.config))
  with pytest.raises(ValueError, match=r"--role='sender' shares its parameter set with \['sender', 'receiver'\]"):
    crossplay.paired(shared, params_N, "sender")


def _shared(config):
  config = config.copy_and_resolve_references()
  config.roles.sharing = "shared"
  return config


@pytest.mark.slow
def test_crossplay_cli(signalling_run, tmp_path):
  out = str(tmp_path / "cross.json")
  proc = subprocess.run([sys.executable, "-m", "marl_jax.tools.crossplay", f"--workdirs={signalling_run},{signalling_run}",
                         f"--out={out}"], cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "self-play" in proc.stdout and os.path.exists(out)
  lonely = subprocess.run([sys.executable, "-m", "marl_jax.tools.crossplay", f"--workdirs={tmp_path}/nowhere"], cwd=ROOT,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=600)
  assert lonely.returncode == 1 and "Traceback" not in lonely.stderr
