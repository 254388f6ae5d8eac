"""Sharding over devices and processes changes nothing but float rounding.

Runs go through the real CLI in subprocesses: the emulated device count must be set before JAX starts.
"""
import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import optax
import pytest

from marl_jax import configs, experiment, loop, metrics, state, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Entropy keeps gradients non-zero even when every reward of the untrained team ties.
TINY = ["--config.sft.steps=0", "--config.rl.entropy_coef=0.01", "--config.rl.batch_size=64",
        "--config.rl.minibatches=2"]


# The CLI with the workdir read 10 s late: the lead has by then created checkpoints/, which once sent
# this process through another sequence of orbax's collective barriers than the lead (a CI failure).
LATE_READER = ("import runpy, sys, time; from marl_jax import checkpoint; latest = checkpoint.latest_step; "
               "checkpoint.latest_step = lambda workdir: (time.sleep(10), latest(workdir))[1]; "
               "sys.argv[0] = 'marl_jax.main'; runpy.run_module('marl_jax.main', run_name='__main__')")


def launch(args, devices: int, late: bool = False, **env):
  env = {**os.environ, "XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count={devices}",
         "JAX_PLATFORMS": "cpu", **env}
  program = ["-c", LATE_READER] if late else ["-m", "marl_jax.main"]
  return subprocess.Popen([sys.executable, *program, *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc):
  out, _ = proc.communicate(timeout=900)
  assert proc.returncode == 0, out[-3000:]


def params(workdir, step=None):
  """params_S of a run's checkpoint, restored onto this process's one device."""
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  config.num_devices, config.distributed = 1, False
  return state.to_host(loop.load_params(experiment.build(config), workdir, step))


def distance(a, b) -> float:
  """Of the float leaves (not step counts, which move by whole steps)."""
  floats = lambda tree: [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
  return float(optax.tree_utils.tree_norm(jax.tree.map(lambda x, y: x - y, floats(a), floats(b))))


def assert_same_training(dir_a, dir_b):
  a, b, start = params(dir_a), params(dir_b), params(dir_a, step=0)
  moved, apart = distance(a, start), distance(a, b)
  assert moved > 1e-2, "nothing trained: the comparison is vacuous"
  # Rounding only: 8 devices against 1 measured 0.4% of how far training moved the parameters (a
  # max-element bound is fragile: Adam turns a rounding-level gradient into a full-size step).
  assert apart < 1e-2 * moved


@pytest.mark.slow
def test_eight_devices_match_one(tmp_path):
  # Shared parameters take the per-role (vmapped vjp) diagnostic path; difference credit adds the
  # counterfactual re-runs, so every part of the joint step is sharded here.  A short warm start
  # makes verdicts mixed, so rates such as false_reject differ from device to device.
  config = "--config=experiments/solver_verifier.py:size=tiny,credit=difference,sharing=shared"
  dirs = [str(tmp_path / f"devices{n}") for n in (1, 8)]
  for n, workdir in zip((1, 8), dirs):
    finish(launch([config, f"--workdir={workdir}", f"--config.num_devices={n}", *TINY,
                   "--config.sft.steps=60"], devices=8))
  assert_same_training(*dirs)
  # Rates are over the global batch, not means of per-device rates (which differ for ratios).
  first_a, first_b = (metrics.read(d)[1] for d in dirs)
  for name in ("accuracy", "accept_rate", "false_accept", "false_reject", "verdict_accuracy"):
    assert first_a[name] == pytest.approx(first_b[name], abs=1e-6), name
  # Per-role token means are over the global minibatch too (they once read 8x too large on 8 devices).
  for name in (f"{role}/{m}" for role in ("solver", "verifier") for m in ("entropy", "loss", "approx_kl")):
    assert first_a[name] == pytest.approx(first_b[name], rel=1e-2, abs=1e-5), name


# Estimators whose statistics or state cross devices: the critic's gradients and the moving baseline
# are averaged over devices, role_normalized standardises over the global batch, and Shapley re-runs
# coalitions of three roles.  So do rewards from peers: audits drawn per row of the global batch, the
# payment rule on the whole batch (peer prediction's chance agreement), reputation's track records.
CROSS_DEVICE = {"critic": ("solver_verifier", "size=tiny,credit=critic,sharing=shared"),
                "role_baseline": ("solver_verifier", "size=tiny,credit=role_baseline,sharing=shared"),
                "role_normalized": ("solver_verifier", "size=tiny,credit=role_normalized,sharing=shared"),
                "shapley": ("vote", "size=tiny,credit=shapley"),
                "peer_reputation": ("peer_review", "size=tiny,pay=reputation,audit_rate=0.5"),
                "peer_prediction": ("peer_review", "size=tiny,pay=peer_prediction,audit_rate=0.2")}


def one_call_on_one_and_two_devices(name: str, arg: str) -> dict:
  """One train call of 2 steps from the same state on one device and on two (run in a process with
  two CPU devices): how far training moved the parameters and the estimator's state, how far apart
  the two ended, and each step metric of the first step on both."""
  config = configs.sibling(os.path.join(ROOT, "experiments", "x.py"), name).get_config(arg)
  config.rl.entropy_coef, config.rl.batch_size, config.rl.minibatches = 0.01, 64, 2
  config.sft.steps, config.steps_per_call, config.num_devices = 60, 2, 1
  start = state.to_host(loop.initial_state(experiment.build(config)))
  ends, metrics_of = [], []
  for devices in (1, 2):
    config.num_devices = devices
    exp = experiment.build(config)
    end, step_metrics = train.make_train_call(exp)(state.place(exp, start))
    ends.append(state.to_host(end))
    metrics_of.append({k: float(v[0, 0]) for k, v in state.to_host(step_metrics).items() if k != "nonfinite_QxR"})
  (one, two), out = ends, {"metrics": metrics_of}
  for part in ("params", "credit", "reward"):
    out[part] = (distance(getattr(one, part), getattr(start, part)), distance(getattr(two, part), getattr(one, part)))
  return out


@pytest.mark.slow
@pytest.mark.parametrize("estimator", CROSS_DEVICE)
def test_estimators_that_cross_devices_match_one_device(estimator):
  env = {**os.environ, "XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count=2"}
  proc = subprocess.run([sys.executable, __file__, *CROSS_DEVICE[estimator]], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.splitlines()[-1])
  moved, apart = out["params"]
  assert moved > 1e-2, "nothing trained: the comparison is vacuous"
  assert apart < 1e-2 * moved  # rounding: a few 1e-3 measured (as a 16-row microbatch changes it)
  for stateful, part in (("critic", "credit"), ("role_baseline", "credit"), ("peer_reputation", "reward")):
    if estimator == stateful:
      part_moved, part_apart = out[part]
      assert part_moved > 0 and part_apart <= 1e-2 * part_moved
  one, two = out["metrics"]
  assert set(one) == set(two)
  for name in one:  # per-role losses, entropies, the estimator's metrics, the workflow's rates
    assert two[name] == pytest.approx(one[name], rel=1e-3, abs=1e-5, nan_ok=True), name


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process_of_two_devices(tmp_path):
  config = "--config=experiments/single_agent.py:size=tiny"
  one, two = str(tmp_path / "one_process"), str(tmp_path / "two_processes")
  finish(launch([config, f"--workdir={one}", *TINY], devices=2))
  port = free_port()
  workers = [launch([config, f"--workdir={two}", "--config.distributed=True", *TINY], devices=1, late=i == 1,
                    JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
                    JAX_PROCESS_ID=str(i)) for i in range(2)]
  for worker in workers:
    finish(worker)
  assert_same_training(one, two)


def two_processes(*args, timeout=900):
  """The CLI in two processes of one CPU device each, joined by jax.distributed: (returncode, output)
  of each."""
  port = free_port()
  workers = [launch([*args, "--config.distributed=True"], devices=1, JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                    JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i)) for i in range(2)]
  return [(w.wait(timeout=timeout), w.stdout.read()) for w in workers]


def test_devices_that_leave_a_process_out_are_refused(tmp_path):
  # One device of two processes: the second would run nothing while the first waited on it forever.
  (lead, lead_out), (other, other_out) = two_processes(
      "--config=experiments/single_agent.py:size=tiny", f"--workdir={tmp_path / 'run'}",
      "--config.num_devices=1", *TINY)
  assert lead == 1 and ("FATAL ConfigError: config.num_devices=1 leaves out every device of some of the 2 "
                        "processes; allowed: 0 (all of them) or 2 to 2") in lead_out, lead_out[-3000:]
  # The other process refuses the same way, or ends when the lead's exit closes the coordination
  # service first: never a run.
  assert other != 0, other_out[-3000:]
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_language_model_split_over_two_processes_warm_starts_and_trains(tmp_path):
  # model_shards=2 over two processes of one device: the warm start leaves parameters that no process
  # can read whole, and the `data` axis has one device.
  for returncode, out in two_processes("--config=experiments/lm_solver_verifier.py:size=tiny",
                                       f"--workdir={tmp_path / 'run'}", "--config.sft.steps=2",
                                       "--config.model_shards=2", "--config.total_steps=2"):
    assert returncode == 0, out[-3000:]
  assert [r["step"] for r in metrics.read(str(tmp_path / "run"))] == [0, 2]


if __name__ == "__main__":
  print(json.dumps(one_call_on_one_and_two_devices(*sys.argv[1:])))
