"""Transcript archives: a team's transcripts written as a TFDS dataset and read back, and the CLI."""
import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from marl_jax import checkpoint, datasets, experiment, loop, state, tasks, text, transcripts
from marl_jax.tools import archive as archive_lib
from workflows_test import compiled_rewards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_experiment(task_name: str, eval_size: int = 5, warm_steps: int | None = None) -> experiment.Experiment:
  spec = importlib.util.spec_from_file_location("tasks_config", os.path.join(ROOT, "experiments/tasks.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(f"task={task_name},size=tiny")
  config.num_devices, config.eval.size = 1, eval_size
  if warm_steps is not None:
    config.sft.steps = warm_steps
  return experiment.build(config)


def random_params(exp: experiment.Experiment, seeds: int = 2):
  keys_S = jax.random.split(jax.random.PRNGKey(0), seeds)
  return jax.jit(jax.vmap(lambda k: state.init_state(exp, k)))(keys_S).params


@pytest.mark.slow
def test_transcripts_round_trip(tmp_path):
  exp = tiny_experiment("hidden_sum")  # exchange: sender and receiver
  params_S = random_params(exp)
  name = archive_lib.archive(exp, params_S, str(tmp_path), "run1", extra_metadata={"note": "test"})
  assert name == "marl_transcripts/run1:1.0.0"
  archive = transcripts.load_transcripts(str(tmp_path), "run1")
  S, N, R, T = 2, 5, 2, exp.layout.length
  arrays = archive.arrays
  assert arrays["tokens"].shape == (S * N, T) and arrays["tokens"].dtype == np.int32
  assert arrays["role_reward"].shape == arrays["credit"].shape == (S * N, R)
  np.testing.assert_array_equal(arrays["seed"], [0] * N + [1] * N)
  np.testing.assert_array_equal(arrays["author"][3], exp.layout.author_T)
  problems = tasks.eval_problems(exp.task, exp.config.eval.seed, N)
  np.testing.assert_array_equal(arrays["problem_answer"][N:], problems["answer"])
  np.testing.assert_array_equal(arrays["tokens"][:, :exp.task.prompt_len],
                                np.tile(problems["prompt"], (S, 1)))
  # Rewards are the protocol's rewards of the archived tokens.
  problems_SN = jax.tree.map(lambda x: np.tile(x, (S,) + (1,) * (x.ndim - 1)), problems)
  rewards = compiled_rewards(exp.protocol, exp.task, exp.layout, problems_SN, arrays["tokens"])
  np.testing.assert_allclose(arrays["team_reward"], rewards.team_B)
  np.testing.assert_allclose(arrays["role_reward"], np.asarray(rewards.role_RxB).T)
  meta = archive.metadata
  assert meta["roles"] == ["sender", "receiver"] and meta["note"] == "test"
  assert meta["eval_set"] == datasets.eval_set_name(exp.task, exp.config.eval.seed, N)
  lines = archive.text(0).splitlines()
  assert lines[0] == f"prompt: {text.decode(problems['prompt'][0])}"
  assert lines[1].startswith("sender: ") and lines[2].startswith("receiver: ")
  assert lines[3].startswith("team reward") and "receiver reward" in lines[3] and "credit" in lines[3]
  assert len(archive.texts) == S * N
  with pytest.raises(FileExistsError):  # an archive is never overwritten
    archive_lib.archive(exp, params_S, str(tmp_path), "run1")


@pytest.mark.slow
def test_transcripts_without_credit_read_from_a_stored_eval_set(tmp_path):
  exp = tiny_experiment("matrix_game")
  archive_lib.archive(exp, random_params(exp), str(tmp_path / "out"), "greedy", greedy=True,
               with_credit=False, data_dir=str(tmp_path / "eval"))
  archive = transcripts.load_transcripts(str(tmp_path / "out"), "greedy")
  assert "credit" not in archive.arrays and "credit" not in archive.text(0)
  assert os.path.isdir(tmp_path / "eval" / "marl_eval_set")
  # Greedy play: the same joint action on every (identical) problem of a seed.
  assert len({text.decode(t) for t in archive.arrays["tokens"][:5]}) == 1


@pytest.mark.slow
def test_archived_rewards_and_credit_are_the_protocols(tmp_path):
  # A warm-started team plays actions (a random one writes no joint action: every value below 0),
  # and the matrix game's payoffs vary between them.
  exp = tiny_experiment("matrix_game", eval_size=32, warm_steps=150)
  archive_lib.archive(exp, loop.initial_state(exp).params, str(tmp_path), "sampled")
  arrays = transcripts.load_transcripts(str(tmp_path), "sampled").arrays
  problems = {k[len("problem_"):]: v for k, v in arrays.items() if k.startswith("problem_")}
  rewards = compiled_rewards(exp.protocol, exp.task, exp.layout, problems, arrays["tokens"])
  np.testing.assert_allclose(arrays["team_reward"], rewards.team_B)
  np.testing.assert_allclose(arrays["role_reward"], np.asarray(rewards.role_RxB).T)
  assert np.abs(arrays["role_reward"]).sum() > 0
  # Difference credit: the team outcome less the mean outcome of K re-draws (each in [0, 1]).
  assert np.abs(arrays["credit"]).sum() > 0
  baseline = arrays["team_reward"][:, None] - arrays["credit"]
  assert np.all(baseline >= -1e-6) and np.all(baseline <= 1 + 1e-6)


def write_run(workdir: str, exp: experiment.Experiment) -> None:
  """A workdir as training leaves it: config.json and a checkpoint of the state of every seed."""
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(exp.config.to_json())
  keys_S = jax.random.split(jax.random.PRNGKey(0), exp.config.num_seeds)
  mngr = checkpoint.manager(workdir)
  checkpoint.save(mngr, 0, jax.jit(jax.vmap(lambda k: state.init_state(exp, k)))(keys_S))
  mngr.wait_until_finished()


@pytest.mark.slow
def test_archive_cli(tmp_path):
  workdir = str(tmp_path / "run")
  write_run(workdir, tiny_experiment("subset_sum"))
  # A run from before the settings `seeds_at_once` and `rl.microbatch_size` existed still archives.
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  del saved["seeds_at_once"], saved["rl"]["microbatch_size"]
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(saved, f)
  proc = subprocess.run([sys.executable, "-m", "marl_jax.tools.archive", f"--workdir={workdir}"],
                        cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "wrote marl_transcripts/step0-sampled:1.0.0 (5 transcripts)" in proc.stdout
  archive = transcripts.load_transcripts(os.path.join(workdir, "transcripts"), "step0-sampled")
  assert archive.metadata["step"] == 0 and archive.metadata["workdir"] == workdir
  assert archive.metadata["config"]["task"]["name"] == "subset_sum"
  assert json.loads(json.dumps(archive.metadata)) == archive.metadata
  # Again: the archive is kept, and the refusal is one line (it was a FileExistsError traceback).
  again = subprocess.run([sys.executable, "-m", "marl_jax.tools.archive", f"--workdir={workdir}"],
                         cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                         text=True, timeout=300)
  assert again.returncode == 1 and "Traceback" not in again.stderr
  assert again.stderr.strip().splitlines()[-1] == (
      f"python -m marl_jax.tools.archive: {workdir}/transcripts/marl_transcripts/step0-sampled/1.0.0 exists; "
      "choose another output directory or name")


@pytest.mark.parametrize("config_json, message", [
    ("{bad", ("is not JSON (Expecting property name enclosed in double quotes at line 1 column 2); allowed: "
              "the config a run wrote there")),  # json's message alone, without the file
    (None, "is not there; allowed: the workdir of a run (it writes config.json first)"),  # [Errno 2] ...
], ids=["not_json", "missing"])
def test_archive_cli_names_a_config_json_it_cannot_read(tmp_path, config_json, message):
  """One line naming the file, exit status 1."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  if config_json is not None:
    (workdir / "config.json").write_text(config_json)
  proc = subprocess.run([sys.executable, "-m", "marl_jax.tools.archive", f"--workdir={workdir}"],
                        cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == f"python -m marl_jax.tools.archive: {workdir}/config.json {message}"
  assert not (workdir / "transcripts").exists()
