"""Runs that survive what preemptible machines do to them: SIGTERM, a kill during a checkpoint save,
non-finite updates, foreign or read-only workdirs and malformed configs.  The end-to-end tests run
the real command line at size=tiny in subprocesses, with the fault injected by a patch applied
before `marl_jax.main` runs."""
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from marl_jax import checkpoint, configs, experiment, loop, memory, sft, state, train
from marl_jax import metrics as metrics_lib
from marl_jax import workdir as workdir_lib
from main_test import _snapshot, _steps
from train_test import tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]
# size=tiny, shorter still: no warm start, 16 evaluation problems, 2 calls of 2 steps with an
# evaluation after each, and a checkpoint only at the end, so a checkpoint at step 2 is a stop's.
FLAGS = (f"--config={REPO / 'experiments' / 'single_agent.py'}:size=tiny", "--config.sft.steps=0",
         "--config.eval.size=16", "--config.checkpoint_every=4")
OVERRIDES = {"sft.steps": 0, "eval.size": 16, "checkpoint_every": 4}
# The resume test's credit is the critic, so a resume must restore the richest estimator state (the
# critic's parameters and Adam); an entropy bonus moves the parameters even while every reward of
# the untrained agent is 0.
CRITIC_FLAGS = ("--config.credit.name=critic", "--config.rl.entropy_coef=0.01")
CRITIC_OVERRIDES = {**OVERRIDES, "credit": configs.credit_config("critic"), "rl.entropy_coef": 0.01}

# Patches run in the subprocess before the command line.
SIGTERM_IN_FIRST_CALL = """
import os, signal, threading
from marl_jax import train
make_train_call, calls = train.make_train_call, []
def signalled(exp):
  call = make_train_call(exp)
  def first_call_signalled(state_S, *args):
    if not calls:  # from another thread, so the signal lands while the main thread is in the call
      threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM)).start()
    calls.append(1)
    return call(state_S, *args)
  first_call_signalled.lower = call.lower  # the run checks its memory before training
  return first_call_signalled
train.make_train_call = signalled
"""
# SIGTERM during the warm start's second call, its time printed.
SIGTERM_IN_SECOND_WARM_START_CALL = """
import os, signal, threading
from marl_jax import sft
fitting, calls = sft._fitting, []
def signalled(*args):
  chunk = fitting(*args)  # the warm start's compiled call, checked against the device
  def second_call_signalled(progress, keys_S, *archived):
    calls.append(1)
    if len(calls) == 2:  # from another thread, so the signal lands while the main thread is in the call
      threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM)).start()
    return chunk(progress, keys_S, *archived)
  return second_call_signalled
sft._fitting = signalled
"""
# Saving step 4 hangs just before orbax renames its finished temporary directory: the test kills
# the process there with SIGKILL.
SLOW_SAVE_OF_STEP_4 = """
import time
from orbax.checkpoint._src.path import atomicity
finalize = atomicity.AtomicRenameTemporaryPath.finalize
async def slow_finalize(self):
  if self.get_final().name == "4":
    print("saving step 4", flush=True)
    time.sleep(600)
  await finalize(self)
atomicity.AtomicRenameTemporaryPath.finalize = slow_finalize
"""
# The team reward of the first row is NaN from the update to step 3 on (`state.step` counts updates).
NAN_REWARD = """
import jax.numpy as jnp
from marl_jax import train
local_step, score = train.local_step, train.score
def nan_reward_step(exp, state, *args):
  def nan_score(*a, **k):
    scored, outcome = score(*a, **k)
    team_B = outcome.team_B.at[0].set(jnp.where(state.step >= 2, jnp.nan, outcome.team_B[0]))
    return scored, outcome.replace(team_B=team_B)
  train.score = nan_score
  try:
    return local_step(exp, state, *args)
  finally:
    train.score = score
train.local_step = nan_reward_step
"""


def _command(workdir, *flags, patch=""):
  code = f"{patch}\nimport runpy\nrunpy.run_module('marl_jax.main', run_name='__main__')"
  return [sys.executable, "-c", code, *FLAGS, f"--workdir={workdir}", *flags]


def _env(**extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", **extra)
  return env


def _run(workdir, *flags, patch="", timeout=600):
  return subprocess.run(_command(workdir, *flags, patch=patch), cwd=REPO, env=_env(), capture_output=True,
                        text=True, timeout=timeout)


def _start(workdir, *flags, patch="", stderr=subprocess.PIPE, **env):
  return subprocess.Popen(_command(workdir, *flags, patch=patch), cwd=REPO, env=_env(**env), text=True,
                          stdout=subprocess.PIPE, stderr=stderr)


def _tensorboard_steps(workdir):
  """The steps with scalars in the TensorBoard event files (records: length, crc, event, crc)."""
  steps = set()
  for path in pathlib.Path(workdir, "tensorboard").iterdir():
    data, i = path.read_bytes(), 0
    while i < len(data):
      n = int.from_bytes(data[i:i + 8], "little")
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      steps |= {event.step} if event.summary.value else set()
      i += 16 + n
  return steps


def _restore(workdir, step, overrides=OVERRIDES):
  exp = experiment.build(tiny_config(**overrides))
  return jax.tree.map(np.asarray, checkpoint.restore(str(workdir), state.abstract_state(exp), step))


@pytest.mark.slow
def test_sigterm_then_kill_during_a_save_resume_exactly(tmp_path):
  workdir = tmp_path / "run"
  # SIGTERM during the first call: it finishes, a checkpoint is written at step 2 (not a checkpoint
  # step), metrics and TensorBoard are flushed, and the run exits 0.
  stopped = _run(workdir, *CRITIC_FLAGS, patch=SIGTERM_IN_FIRST_CALL)
  assert stopped.returncode == 0, stopped.stderr[-3000:]
  assert "SIGTERM: finishing the current call" in stopped.stderr
  assert "stopped at step 2" in stopped.stderr
  assert checkpoint.latest_step(str(workdir)) == 2 and _steps(workdir) == [0, 2]
  assert _tensorboard_steps(workdir) == {0, 2}

  # Resumed, then killed with SIGKILL while saving step 4, after logging it: step 2 stays the latest
  # complete checkpoint, beside the unfinished temporary directory.
  with open(tmp_path / "killed.stderr", "w") as stderr:  # a file: a full pipe would block the run
    killed = _start(workdir, *CRITIC_FLAGS, patch=SLOW_SAVE_OF_STEP_4, stderr=stderr)
    assert killed.stdout.readline() == "saving step 4\n", (tmp_path / "killed.stderr").read_text()[-3000:]
    killed.kill()
    killed.communicate()
  assert checkpoint.latest_step(str(workdir)) == 2 and _steps(workdir) == [0, 2, 4]
  assert [p.name for p in (workdir / "checkpoints").iterdir() if ".orbax-checkpoint-tmp" in p.name]

  # Resumed again: from step 2, the unfinished save removed, each step logged once, and the same
  # parameters, optimiser state and key as 4 uninterrupted steps (computed here).
  resumed = _run(workdir, *CRITIC_FLAGS)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["0", "2", "4"]
  assert _steps(workdir) == [0, 2, 4]
  exp = experiment.build(tiny_config(**CRITIC_OVERRIDES))
  straight_S, train_call = loop.initial_state(exp), train.make_train_call(exp)
  straight_rows = []
  for _ in range(2):
    straight_S, metrics_SxN = train_call(straight_S)
    metrics_SxN = state.to_host(metrics_SxN)
    metrics_SxN.pop("nonfinite_QxR")
    straight_rows.append(loop.summarize(metrics_SxN))
  resumed_S = _restore(workdir, 4, CRITIC_OVERRIDES)
  chex.assert_trees_all_equal(resumed_S, jax.tree.map(np.asarray, straight_S))
  # Not vacuous: the parameters moved, and the critic took its 4 updates.
  assert int(resumed_S.step[0]) == 4 and int(resumed_S.credit["opt_state"][0].count[0]) == 4
  assert not np.array_equal(resumed_S.params["embed"]["embedding"],
                            _restore(workdir, 2, CRITIC_OVERRIDES).params["embed"]["embedding"])

  # The stopped and the resumed run logged steps 2 and 4 as the straight steps: the same episodes,
  # rewards and losses.
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  for row, summary in zip(rows[1:], straight_rows):
    for name, values_S in summary.items():
      assert row[name] == metrics_lib.per_seed(name, values_S)[name], (row["step"], name)

  # init_from names the latest checkpoint or the best-evaluated one (the latest of the best).
  best = max(rows, key=lambda r: (r["eval_accuracy"], r["step"]))
  assert checkpoint.best_step(str(workdir)) == best["step"]
  assert rows[-1]["eval_drop_from_peak"] == pytest.approx(best["eval_accuracy"] - rows[-1]["eval_accuracy"])
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, loop.load_params(exp, f"{workdir}:best")),
                              _restore(workdir, best["step"], CRITIC_OVERRIDES).params)


@pytest.mark.slow
def test_sigterm_during_the_warm_start_stops_after_the_current_call_and_a_rerun_resumes_it(tmp_path):
  workdir = tmp_path / "run"
  warm_start = ("--config.sft.steps=40", "--config.sft.steps_per_call=4")
  # Signalled in the second of its 10 calls: the run ends after that call, with its progress saved
  # (step 8) and nothing else: no evaluation, no checkpoint, no metrics row.
  # How soon that is, in seconds, is measured by scripts/warm_start_stop_latency.py, not here.
  stopped = _run(workdir, *warm_start, patch=SIGTERM_IN_SECOND_WARM_START_CALL)
  assert stopped.returncode == 0, stopped.stderr[-3000:]
  assert "SIGTERM: finishing the current call" in stopped.stderr
  assert (f"stopped the warm start at step 8 of 40 by a signal, its progress written to {workdir}/warm_start; "
          f"run again with the same --workdir={workdir} to resume it") in stopped.stderr
  assert checkpoint.latest_step(str(workdir)) is None and _steps(workdir) == []
  assert [p.name for p in (workdir / "warm_start").iterdir()] == ["8"]
  corrupt, foreign = tmp_path / "corrupt", tmp_path / "foreign"
  for copy in (corrupt, foreign):
    shutil.copytree(workdir, copy)

  # Rerun: the warm start resumes at step 8 and ends as one uninterrupted warm start would; the run
  # then trains, and its saved progress goes once checkpoint 0 holds the warm start.
  resumed = _run(workdir, *warm_start)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "warm start: resuming at step 8 of 40" in resumed.stdout
  assert _steps(workdir) == [0, 2, 4] and not (workdir / "warm_start").exists()
  config = tiny_config(**{**OVERRIDES, "sft.steps": 40, "sft.steps_per_call": 4})
  exp = experiment.build(config)
  whole_S = jax.tree.map(np.asarray, sft.warm_start(exp, state.seed_keys(config)))
  base_S = loop.load_params(exp, str(workdir), step=0)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(whole_S), jax.tree.leaves(base_S)):
    if "['key']['bias']" not in jax.tree_util.keystr(path):  # see sft_test: its gradient is rounding
      np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))

  # A saved progress that is corrupt (its arrays gone) or another program's (a checkpoint of the
  # training state) is refused, naming what to move aside, with nothing written.
  shutil.rmtree(next((corrupt / "warm_start" / "8").glob("*/d")))
  shutil.rmtree(foreign / "warm_start" / "8")
  shutil.copytree(workdir / "checkpoints" / "0", foreign / "warm_start" / "8")
  for copy in (corrupt, foreign):
    _refused_untouched(copy, config, [
        f"the warm-start progress saved in {copy}/warm_start cannot be restored into this config's warm start",
        f"moving {copy}/warm_start out of the workdir starts the warm start again from step 0"])


# quantity: (flags, patch, the first update it skips).  A learning rate past float32's range turns
# finite gradients (an entropy bonus: the untrained agent's rewards are all 0) into infinite parameters.
NONFINITE_CASES = {
    "reward": ((), NAN_REWARD, 3),
    "parameters": (("--config.optim.learning_rate=1e39", "--config.rl.entropy_coef=0.01"), "", 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("quantity", NONFINITE_CASES)
def test_nonfinite_value_skips_the_update_or_stops_the_run(tmp_path, quantity):
  flags, patch, first = NONFINITE_CASES[quantity]
  # The same program both ways (the step skips a non-finite update; the host counts it or stops),
  # so the second run reuses the first one's compilation.
  skip, stop = tmp_path / "skip", tmp_path / "stop"
  skipped = _run(skip, "--config.checkpoint_every=2", *flags, patch=patch)
  assert skipped.returncode == 0, skipped.stderr[-3000:]
  message = f"non-finite {quantity} at step {first} (seed 0, role agent)"
  assert f"{message}: the update was skipped" in skipped.stderr
  # Every update from step `first` on is skipped and counted: parameters, optimiser and credit state
  # stay at step first - 1's.
  assert ([r["skipped_updates"] for r in map(json.loads, open(skip / "metrics.jsonl"))]
          == [max(0, step - first + 1) for step in (0, 2, 4)])
  before, at_4 = _restore(skip, first - 1), _restore(skip, 4)
  chex.assert_trees_all_equal(at_4.replace(step=before.step), before)
  if quantity == "reward":  # resumed, the count goes on from the checkpoint's (not from 0)
    resumed = _run(skip, "--config.checkpoint_every=2", "--config.total_steps=6", *flags, patch=patch)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert ([r["skipped_updates"] for r in map(json.loads, open(skip / "metrics.jsonl"))]
            == [max(0, step - first + 1) for step in (0, 2, 4, 6)])

  # With on_nonfinite=stop the run ends with one line naming the step, seed, quantity and role;
  # nothing of the call holding step `first` is saved or logged.
  stopped = _run(stop, "--config.checkpoint_every=2", "--config.rl.on_nonfinite=stop", *flags,
                 patch=patch)
  assert stopped.returncode == 1
  assert stopped.stderr.strip().splitlines()[-1].startswith(
      f"FATAL NonFiniteError: {message}"), stopped.stderr[-3000:]
  assert "Traceback" not in stopped.stderr
  assert checkpoint.latest_step(str(stop)) == first - 1 and _steps(stop) == list(range(0, first, 2))


@pytest.mark.slow
def test_nonfinite_warm_start_stops_before_any_checkpoint(tmp_path):
  config = tiny_config(**{**OVERRIDES, "sft.steps": 2, "sft.learning_rate": 1e39})
  with pytest.raises(loop.NonFiniteError, match=r"^non-finite parameters before the first update \(after "
                                                r"config.sft.steps=2 warm-start steps"):
    loop.train_and_evaluate(config, str(tmp_path))
  assert checkpoint.latest_step(str(tmp_path)) is None


def test_checkpoint_refuses_a_nonfinite_state(tmp_path):
  mngr = checkpoint.manager(str(tmp_path))
  with pytest.raises(FloatingPointError, match=r"non-finite values in \['b'\]$"):
    checkpoint.save(mngr, 1, {"a": np.ones(2, np.float32), "b": np.array([0.0, np.nan], np.float32),
                              "n": np.arange(2)})
  mngr.wait_until_finished()
  assert mngr.all_steps() == [] and os.listdir(tmp_path / "checkpoints") == []


def _workdir_of_a_run(workdir):
  """A workdir as a run leaves it (config.json, metrics.jsonl, a checkpoint at steps 0 and 2), made
  without training."""
  config = tiny_config(**OVERRIDES)
  exp = experiment.build(config)
  mngr = checkpoint.manager(str(workdir))
  state_S = loop.initial_state(exp)
  for step in (0, 2):
    checkpoint.save(mngr, step, state_S.replace(step=state_S.step + step))
  mngr.wait_until_finished()
  (workdir / "config.json").write_text(config.to_json())
  (workdir / "metrics.jsonl").write_text('{"step": 0, "accuracy": 0.5}\n{"step": 2, "accuracy": 0.5}\n')


def _read_only(command, workdir):
  """`command` with `workdir` read-only: by permissions, or for root (whom they do not stop) by a
  read-only bind mount in a new user and mount namespace; None where neither can be done."""
  if os.geteuid() != 0:
    os.chmod(workdir, 0o555)
    return command
  if subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False).returncode != 0:
    return None
  return ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(workdir), *command]


@pytest.mark.slow
def test_foreign_corrupt_or_read_only_workdirs_are_refused_untouched(tmp_path):
  cases = {  # name: (change to the workdir, flags, what the one-line error says)
      "other_config": (lambda w: None, ["--config.task.num_ops=1"], "config.task.num_ops: 2 there, 1 now"),
      "corrupt_step": (lambda w: [p.write_bytes(b"") for p in (w / "checkpoints" / "2").rglob("d/*")],
                       [], "moving " + str(tmp_path / "corrupt_step" / "checkpoints" / "2")),
      "foreign_entry": (lambda w: (w / "checkpoints" / "notes").mkdir(), [], "holds ['notes']"),
      "no_config_json": (lambda w: (w / "config.json").unlink(), [], "but no config.json"),
      "read_only": (lambda w: None, [], "is not writable"),
  }
  _workdir_of_a_run(tmp_path / "run")
  runs, before = {}, {}
  for name, (change, flags, _) in cases.items():
    workdir = tmp_path / name
    shutil.copytree(tmp_path / "run", workdir)
    change(workdir)
    before[name] = _snapshot(workdir)
    command = _command(workdir, *flags)
    if name == "read_only":
      command = _read_only(command, workdir)
      if command is None:  # the other cases still run
        continue
    runs[name] = subprocess.Popen(command, cwd=REPO, env=_env(), text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
  for name, run in runs.items():
    _, err = run.communicate(timeout=300)
    assert run.returncode == 1, (name, err[-3000:])
    *before_it, line = err.strip().splitlines()
    assert line.startswith("FATAL ConfigError: ") and cases[name][2] in line, (name, err[-3000:])
    assert "tensorstore_spec" not in line, line  # what failed, without orbax's TensorStore specs
    # Only a failed restore may come with tracebacks of tensorstore reads still pending (orbax's).
    assert name == "corrupt_step" or not before_it, (name, err[-3000:])
    os.chmod(tmp_path / name, 0o755)
    assert _snapshot(tmp_path / name) == before[name], name
  if "read_only" not in runs:
    pytest.skip("the other cases passed; read_only needs a non-root user or user namespaces (root here)")


def _refused_untouched(workdir, config, expected):
  """The run of `config` in `workdir` refuses with a ConfigError naming each of `expected`, before
  compiling or writing anything."""
  before = _snapshot(workdir)
  with pytest.raises(experiment.ConfigError) as error:
    loop.train_and_evaluate(config, str(workdir))
  for piece in expected:
    assert piece in str(error.value), (piece, str(error.value))
  assert _snapshot(workdir) == before


@pytest.mark.slow
def test_a_run_that_does_not_fit_the_device_is_refused_before_training(tmp_path, monkeypatch):
  # A train call or evaluation that needs more memory than the device allows is refused once compiled,
  # before the warm start or any write, naming what shrinks it (on an H200 a run failed only at its
  # first train call, after its warm start and first evaluation).
  run, new = tmp_path / "run", tmp_path / "new"
  _workdir_of_a_run(run)
  new.mkdir()
  resumed = tiny_config(**{**OVERRIDES, "total_steps": 8})
  big_evaluation = tiny_config(**{**OVERRIDES, "eval.size": 1024})
  exp = experiment.build(big_evaluation)
  abstract = state.abstract_state(exp)
  held = memory.per_device_bytes(abstract)
  train_need = memory.need(train.make_train_call(exp).lower(abstract).compile(), held).total
  eval_need = memory.need(loop.evaluate.make_evaluate(exp).lower(abstract.params).compile(), held).total
  assert held < train_need < eval_need  # 1024 evaluation episodes against 32 training ones
  monkeypatch.setattr(loop.memory, "device_limit", lambda: held)
  _refused_untouched(run, resumed, [
      "the train call needs", "config.rl.microbatch_size=0 (the update passes 32 rows at a time through the model)",
      "config.rl.rollout_batch_size=0 (the rollout samples 32 rows at a time), config.rl.batch_size=32"])
  monkeypatch.setattr(loop.memory, "device_limit", lambda: train_need)
  _refused_untouched(new, big_evaluation, [f"the evaluation needs {memory.readable(eval_need)} on",
                                           ("lower config.eval.batch_size=0 (the evaluation runs 1024 "
                                            "rows at a time), config.eval.size=1024")])


def test_resume_refuses_fewer_steps_than_its_checkpoint(tmp_path):
  # It exited 0 with no message, its config.json rewritten to total_steps 0 beside checkpoint 2.
  _workdir_of_a_run(tmp_path)
  _refused_untouched(tmp_path, tiny_config(**{**OVERRIDES, "total_steps": 0}),
                     [f"config.total_steps=0 is below step 2, the latest checkpoint in {tmp_path}",
                      "allowed: >= 2"])


def test_a_corrupt_metrics_row_is_refused_before_config_json_is_rewritten(tmp_path):
  _workdir_of_a_run(tmp_path)
  (tmp_path / "metrics.jsonl").write_text('{"step": 0, "accuracy": 0.5}\ngarbage{{\n')
  _refused_untouched(tmp_path, tiny_config(**{**OVERRIDES, "total_steps": 4}),
                     [f"{tmp_path / 'metrics.jsonl'} line 2"])


def test_a_config_json_of_another_shape_is_refused(tmp_path):
  _workdir_of_a_run(tmp_path)
  saved = json.loads((tmp_path / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps({**saved, "rl": 5}))  # a TypeError traceback
  _refused_untouched(tmp_path, tiny_config(**OVERRIDES), ["its config.json is not a marl_jax config"])


@pytest.mark.parametrize("where, message", [
    ("", "--workdir is empty"),
    ("file/run", "--workdir={tmp}/file/run cannot be made: {tmp}/file is a file")])
def test_a_workdir_that_cannot_be_made_is_refused(tmp_path, where, message):
  (tmp_path / "file").write_text("")
  with pytest.raises(experiment.ConfigError) as error:
    loop.train_and_evaluate(tiny_config(**OVERRIDES), str(tmp_path / where) if where else "")
  assert str(error.value).startswith(message.format(tmp=tmp_path))


def test_resume_refuses_a_steps_per_call_that_misses_the_steps_left(tmp_path):
  # From step 2 calls of 4 steps would reach 6, 10, ...: never total_steps=8, nor a step to log,
  # evaluate or save at.
  _workdir_of_a_run(tmp_path)
  config = tiny_config(**{**OVERRIDES, "total_steps": 8, "steps_per_call": 4, "log_every": 4,
                          "eval_every": 4, "checkpoint_every": 4})
  _refused_untouched(tmp_path, config, ["config.steps_per_call=4 does not divide step 2",
                                        "config.total_steps=8", "allowed: the divisors of 2"])


RESUME_CHANGES = {  # name: (overrides, what the message names)
    "seed": ({"seed": 1000}, ["config.seed: 0 there, 1000 now"]),
    "num_seeds": ({"num_seeds": 2}, ["config.num_seeds: 1 there, 2 now"]),
    "eval_set": ({"eval.seed": 99, "eval.size": 32},
                 ["config.eval.seed: 1234 there, 99 now", "config.eval.size: 16 there, 32 now"]),
    "credit": ({"credit": configs.credit_config("per_role")}, ["config.credit.name: 'team' there, 'per_role' now"]),
    "learning_rate": ({"optim.learning_rate": 0.5}, ["config.optim.learning_rate: 0.0003 there, 0.5 now"]),
    # single_agent.py leaves `ops` out of config.task (tasks.py sets it): compared at its default.
    "task_knob_left_out": ({"task.ops": "+"}, ["config.task.ops: '+-*' there, '+' now"]),
}


@pytest.mark.parametrize("name", RESUME_CHANGES)
def test_resume_refuses_another_config(tmp_path, name):
  # A resume under other seeds, another evaluation set, estimator or optimiser would report one run's
  # curves as another's, under the second one's settings.
  _workdir_of_a_run(tmp_path)
  overrides, expected = RESUME_CHANGES[name]
  _refused_untouched(tmp_path, tiny_config(**{**OVERRIDES, **overrides}),
                     expected + ["resuming it needs the same settings but total_steps/"])
  # How long and how often it runs, where the evaluation set is stored and how the computation is laid
  # out may change.
  workdir_lib.check(tiny_config(**{**OVERRIDES, "total_steps": 8, "eval_every": 4, "log_every": 4,
                                   "eval.data_dir": str(tmp_path / "data"), "rl.microbatch_size": 8,
                                   "num_devices": 2, "rl.on_nonfinite": "stop",
                                   "init_from": str(tmp_path / "base")}), str(tmp_path))


def test_a_workdir_that_is_a_file_is_refused(tmp_path):
  (tmp_path / "a_file").write_text("notes\n")
  with pytest.raises(ValueError, match=r"a_file is a file, not a directory; give a directory"):
    workdir_lib.check(tiny_config(**OVERRIDES), str(tmp_path / "a_file"))
  assert (tmp_path / "a_file").read_text() == "notes\n"


@pytest.mark.slow
def test_the_last_step_is_evaluated_off_the_eval_every_grid(tmp_path):
  # 6 steps with eval_every 4: the report's final accuracy must be the saved model's (step 6).
  loop.train_and_evaluate(tiny_config(**{**OVERRIDES, "total_steps": 6, "eval_every": 4, "log_every": 4,
                                         "steps_per_call": 2}), str(tmp_path))
  assert [r["step"] for r in metrics_lib.read(str(tmp_path)) if "eval_accuracy" in r] == [0, 4, 6]
  assert checkpoint.latest_step(str(tmp_path)) == 6


@pytest.mark.slow
def test_best_checkpoints_are_saved_off_the_grid_and_their_peak_survives_a_resume(tmp_path, monkeypatch):
  # The greedy evaluation is scripted per call (binary fractions, exact in float32; the sampled one at
  # step 0 reads 0.1), so that the loop's bookkeeping is checked whatever the tiny untrained model
  # scores: it saves every step that beats the best evaluation so far (strictly: a tie is not a new
  # best), the base model with its accuracy, and a resumed run measures eval_drop_from_peak from the
  # peak of the run it resumes; a NaN evaluation is saved without an accuracy and leaves the peak as it was.
  scripted = iter([0.5, 0.25,  # first run: steps 0 (the base model) and 4
                   0.375, 0.75, 0.75, math.nan, 0.5])  # resumed: 6, 8 (a new best), 10 (a tie), 12, 14

  make_real = loop.evaluate.make_evaluate

  def make_evaluate(exp, problems=None):
    class Scripted(loop.evaluate.Evaluator):  # compiled (its memory checked) as the real one
      def __call__(self, params_S, greedy=True, divergence=False):
        return {"accuracy": jnp.full(exp.config.num_seeds, next(scripted) if greedy else 0.1)}
    return Scripted(make_real(exp, problems).program)
  monkeypatch.setattr(loop.evaluate, "make_evaluate", make_evaluate)
  saves, save = [], checkpoint.save
  monkeypatch.setattr(checkpoint, "save", lambda mngr, step, state_S, values: (
      saves.append((step, values.get(checkpoint.BEST))), save(mngr, step, state_S, values))[1])
  cadence = {"steps_per_call": 2, "eval_every": 2, "log_every": 2}
  loop.train_and_evaluate(tiny_config(**{**OVERRIDES, **cadence, "total_steps": 4, "eval_every": 4,
                                         "checkpoint_every": 100}), str(tmp_path))
  # Logged every 2 steps, evaluated every 4.  Step 0 is saved with its accuracy, so it is the best
  # checkpoint until a later one beats 0.5.
  assert [(r["step"], "eval_accuracy" in r) for r in metrics_lib.read(str(tmp_path))] == [
      (0, True), (2, False), (4, True)]
  assert saves == [(0, 0.5), (4, 0.25)]
  assert checkpoint.best_step(str(tmp_path)) == 0
  saves.clear()
  loop.train_and_evaluate(tiny_config(**{**OVERRIDES, **cadence, "total_steps": 14, "checkpoint_every": 6}),
                          str(tmp_path))
  # 6 and 12: the checkpoint grid; 8: beats the peak 0.5, off the grid; 10 ties 0.75: not saved; 14: the end.
  assert saves == [(6, 0.375), (8, 0.75), (12, None), (14, 0.5)]
  assert checkpoint.best_step(str(tmp_path)) == 8
  rows = [r for r in metrics_lib.read(str(tmp_path)) if r["step"] > 4]
  # The drop from the best so far, 0.5 (step 0's, read back from its checkpoint) until step 8's 0.75.
  np.testing.assert_allclose([r["eval_drop_from_peak"] for r in rows], [0.125, 0.0, 0.0, math.nan, 0.25],
                             atol=1e-6)


def test_corrupt_metrics_of_a_checkpoint_name_the_step_to_move_aside(tmp_path):
  _workdir_of_a_run(tmp_path)
  path = tmp_path / "checkpoints" / "2" / "metrics" / "metrics"
  path.write_text("x\n")
  _refused_untouched(tmp_path, tiny_config(**OVERRIDES),
                     [f"metrics file {path} is corrupt",
                      f"moving {tmp_path / 'checkpoints' / '2'} out of the workdir resumes from step 0"])


# ---------------------------------------------------------------------------------------------
# Malformed configs: each refused with its key and the allowed values, before the workdir is touched.

MALFORMED = [  # (group, overrides, what the message names)
    ("model", {"model.max_len": 8}, ["config.model.max_len=8", "10 tokens", "allowed: >= 10"]),
    ("model", {"model.d_model": 31}, ["config.model.d_model=31", "config.model.n_heads=2", "multiples"]),
    ("model", {"model.dtype": "float8"}, ["config.model.dtype='float8'", "'bfloat16'"]),
    ("model", {"model.n_layers": 0}, ["config.model.n_layers=0", "allowed: an integer >= 1"]),
    ("task", {"task.name": "nope"}, ["config.task.name='nope'", "'arithmetic'"]),
    ("task", {"task.nope": 1}, ["config.task has keys ['nope']", "'num_ops'"]),
    ("protocol", {"protocol.name": "nope"}, ["config.protocol.name='nope'", "'solver_verifier'"]),
    ("protocol", {"protocol.name": "solver_verifier", "protocol.rounds": 0},
     ["config.protocol.rounds=0", ">= 1"]),
    ("roles", {"roles.sharing": "nope"}, ["config.roles.sharing='nope'", "'isolated'", "'shared'"]),
    ("roles", {"roles.trainable": "1,0"}, ["config.roles.trainable='1,0'", "'' (all trainable)", "'1'"]),
    ("roles", {"roles.trainable": "x"}, ["config.roles.trainable='x'", "one 1 or 0 per set"]),
    ("roles", {"roles.lr_scale": "1,0.5"}, ["config.roles.lr_scale='1,0.5'", "one factor >= 0 per set", "'1'"]),
    ("roles", {"roles.lr_scale": "-1"}, ["config.roles.lr_scale='-1'", "one factor >= 0 per set"]),
    ("credit", {"credit.name": "nope"}, ["config.credit.name='nope'", "'team'", "'difference'"]),
    ("credit", {"credit.baseline": "nope"}, ["config.credit.baseline='nope'", "'rloo'"]),
    ("credit", {"credit": configs.credit_config("difference"), "credit.samples": 0},
     ["config.credit.samples=0", ">= 1"]),
    ("rl", {"rl.algorithm": "nope"}, ["config.rl.algorithm='nope'", "'ppo'", "'reinforce'"]),
    ("rl", {"rl.batch_size": 30}, ["config.rl.batch_size=30", "config.rl.group_size=4"]),
    ("rl", {"rl.minibatches": 0}, ["config.rl.minibatches=0", "allowed: an integer >= 1"]),
    ("rl", {"rl.minibatches": 3}, ["config.rl.minibatches=3", "batch 32", "its divisors"]),
    ("seeds", {"seeds_at_once": -1}, ["config.seeds_at_once=-1", "allowed: an integer >= 0"]),
    ("seeds", {"num_seeds": 2, "seeds_at_once": 3}, ["config.seeds_at_once=3", "config.num_seeds=2",
                                                     "allowed: 0 (every seed at once) to 2"]),
    ("rl", {"rl.microbatch_size": -1}, ["config.rl.microbatch_size=-1", "allowed: an integer >= 0"]),
    ("rl", {"rl.rollout_batch_size": -1}, ["config.rl.rollout_batch_size=-1", "allowed: an integer >= 0"]),
    ("eval", {"eval.batch_size": -1}, ["config.eval.batch_size=-1", "allowed: an integer >= 0"]),
    ("eval", {"eval.batch_size": 3}, ["config.eval.batch_size=3", "evaluation set of 64 rows",
                                      "its divisors", "at least 64 (one pass)"]),
    ("rl", {"rl.microbatch_size": 3}, ["config.rl.microbatch_size=3", "minibatch of 32 rows",
                                       "0 (the whole minibatch), its divisors", "at least 32 (one pass)"]),
    ("rl", {"rl.on_nonfinite": "ignore"}, ["config.rl.on_nonfinite='ignore'", "'skip'", "'stop'"]),
    ("rl", {"rl.temperature": 0.0}, ["config.rl.temperature=0.0", "allowed: a number > 0.0"]),
    ("optim", {"optim.name": "nope"}, ["config.optim.name='nope'", "'adam'", "'sgd'"]),
    ("optim", {"optim.schedule": "nope"}, ["config.optim.schedule='nope'", "'constant'", "'cosine'"]),
    ("optim", {"optim.learning_rate": -1.0}, ["config.optim.learning_rate=-1.0", "> 0.0"]),
    ("optim", {"optim.learning_rate": math.nan}, ["config.optim.learning_rate=nan", "> 0.0"]),
    ("optim", {"optim.learning_rate": math.inf}, ["config.optim.learning_rate=inf", "> 0.0"]),
    ("optim", {"optim.b1": 1.5}, ["config.optim.b1=1.5", "allowed: a number in [0, 1)"]),
    ("optim", {"optim.b2": math.nan}, ["config.optim.b2=nan", "allowed: a number in [0, 1)"]),
    ("optim", {"optim.weight_decay": -0.1}, ["config.optim.weight_decay=-0.1", "allowed: a number >= 0.0"]),
    ("rl", {"rl.clip_eps": -1.0}, ["config.rl.clip_eps=-1.0", "allowed: a number > 0.0"]),
    ("rl", {"rl.entropy_coef": -0.01}, ["config.rl.entropy_coef=-0.01", "allowed: a number >= 0.0"]),
    ("rl", {"rl.kl_coef": math.nan}, ["config.rl.kl_coef=nan", "allowed: a number >= 0.0"]),
    ("sft", {"sft.schedule": "nope"}, ["config.sft.schedule='nope'", "'constant'", "'cosine'"]),
    ("sft", {"sft.steps": -1}, ["config.sft.steps=-1", "allowed: an integer >= 0"]),
    ("sft", {"sft.learning_rate": -1.0}, ["config.sft.learning_rate=-1.0", "allowed: a number > 0.0"]),
    ("sft", {"sft.learning_rate": math.nan}, ["config.sft.learning_rate=nan", "allowed: a number > 0.0"]),
    ("sft", {"sft.warmup_steps": -5}, ["config.sft.warmup_steps=-5", "allowed: an integer >= 0"]),
    ("sft", {"sft.b2": 1.0}, ["config.sft.b2=1.0", "allowed: a number in [0, 1)"]),
    ("sft", {"sft.steps_per_call": 0}, ["config.sft.steps_per_call=0", "allowed: an integer >= 1"]),
    ("eval", {"eval.divergence_every": -1}, ["config.eval.divergence_every=-1", "allowed: an integer >= 0"]),
    ("task", {"task.num_ops": 0}, ["config.task.num_ops=0", "allowed: an integer >= 1"]),
    ("task", {"task.demo_error_rate": 2.0}, ["config.task.demo_error_rate=2.0", "a probability in [0, 1]"]),
    ("task", {"task.demo_error_rate": math.nan},
     ["config.task.demo_error_rate=nan", "a probability in [0, 1]"]),
    ("protocol", {"protocol.name": "solver_verifier", "protocol.verifier_demo_error_rate": -0.1},
     ["config.protocol.verifier_demo_error_rate=-0.1", "a probability in [0, 1]"]),
    ("eval", {"eval.size": 0}, ["config.eval.size=0", "allowed: an integer >= 1"]),
    ("devices", {"num_devices": 1000}, ["config.num_devices=1000", "allowed: 0 (all of them) to"]),
    ("devices", {"num_devices": -1}, ["config.num_devices=-1", "allowed: an integer >= 0"]),
    ("steps", {"steps_per_call": 0}, ["config.steps_per_call=0", "allowed: an integer >= 1"]),
    ("steps", {"log_every": 3}, ["config.log_every=3", "multiple of config.steps_per_call=2"]),
    ("init_from", {"init_from": "/nonexistent/run:best"}, ["config.init_from='/nonexistent/run:best'"]),
]


@pytest.mark.parametrize("group, overrides, expected", MALFORMED,
                         ids=[f"{g}-{'-'.join(map(str, o.values()))}" for g, o, _ in MALFORMED])
def test_malformed_config_is_refused_before_the_workdir_is_touched(tmp_path, group, overrides, expected):
  # A workdir a run of the good config left behind (stand-in files: nothing may write them).
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "metrics.jsonl").write_text('{"step": 0, "accuracy": 0.5}\n')
  # A warm start's source is part of the run's config: that run named the same one.
  saved = tiny_config(**overrides) if group == "init_from" else tiny_config()
  (tmp_path / "config.json").write_text(saved.to_json())
  _refused_untouched(tmp_path, tiny_config(**overrides), expected)


def test_an_unusable_eval_data_dir_is_refused_before_the_workdir_is_touched(tmp_path):
  # Neither holding the evaluation set nor a place to build it (a path under a file): once a traceback
  # after the workdir was written.
  (tmp_path / "a_file").write_text("")
  data_dir = tmp_path / "a_file" / "eval"
  _refused_untouched(tmp_path / "run", tiny_config(**{"eval.data_dir": str(data_dir)}),
                     [f"config.eval.data_dir='{data_dir}'", "holds the evaluation set or where this run can build it"])
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_command_line_config_errors_are_one_line(tmp_path):
  """A config error from the config file, an unknown key or a bad value: one line naming the flag,
  exit status 1, no traceback, nothing compiled, the workdir untouched."""
  cases = [  # (flags, the start of the one line, what it names)
      ([f"--config={REPO / 'experiments' / 'single_agent.py'}:size=huge"],
       "FATAL Flags parsing error: flag --config=", "size='huge' is unknown; allowed: ['tiny', 'cpu',"),
      # A config file that is not there: two tracebacks before.
      ([f"--config={REPO / 'experiments' / 'nope.py'}"], "FATAL Flags parsing error: flag --config=",
       f"cannot load '{REPO / 'experiments' / 'nope.py'}': [Errno 2] No such file or directory"),
      (["--config.rl.nope=3"], "FATAL Flags parsing error: flag --config.rl.nope=3: ",
       "config.rl.nope is not a key; allowed: ['algorithm',"),
      (["--config.rl.minibatches=0"], "FATAL ConfigError: config.rl.minibatches=0; ",
       "allowed: an integer >= 1 (from --config.rl.minibatches=0)"),
      (["--config.sft.learning_rate=nan"], "FATAL ConfigError: config.sft.learning_rate=nan; ",
       "allowed: a number > 0.0 (from --config.sft.learning_rate=nan)"),
      # The canvas outgrows max_len through a task knob: the line names the knob given, not only the
      # config file max_len came from.
      (["--config.task.num_ops=30"], "FATAL ConfigError: config.model.max_len=32 is too short: ",
       ("take 66 tokens (their lengths are config.task.* and config.protocol.* settings); allowed: >= 66 "
        "(from --config.task.num_ops=30)")),
  ]
  (tmp_path / "metrics.jsonl").write_text('{"step": 0, "accuracy": 0.5}\n')
  before = _snapshot(tmp_path)
  runs = [_start(tmp_path, *flags, JAX_LOG_COMPILES="1") for flags, _, _ in cases]
  for run, (flags, start, piece) in zip(runs, cases):
    _, err = run.communicate(timeout=300)
    assert run.returncode == 1, err[-3000:]
    assert len(err.strip().splitlines()) == 1 and err.strip().startswith(start) and piece in err, err[-3000:]
    assert "Compiling" not in err
  assert _snapshot(tmp_path) == before


def test_an_unknown_key_is_named_with_the_config_file_given_after_a_space(tmp_path):
  # absl takes `--config FILE` as well as `--config=FILE`; the one line must not become a traceback.
  config_file = f"{REPO / 'experiments' / 'single_agent.py'}:size=tiny"
  run = subprocess.run([sys.executable, "-m", "marl_jax.main", "--config", config_file,
                        f"--workdir={tmp_path / 'run'}", "--config.rl.nope=3"],
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 1 and run.stderr.strip() == (
      "FATAL Flags parsing error: flag --config.rl.nope=3: config.rl.nope is not a key; allowed: "
      "['algorithm', 'batch_size', 'clip_eps', 'entropy_coef', 'entropy_roles', 'epochs', 'group_size', 'kl_coef', "
      "'microbatch_size', 'minibatches', 'on_nonfinite', 'rollout_batch_size', 'temperature']"), run.stderr[-3000:]
  assert not (tmp_path / "run").exists()
