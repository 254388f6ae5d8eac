"""The command line end to end: `python -m marl_jax.main --config=experiments/single_agent.py:size=tiny`
writes metrics, config and checkpoints, resumes, and rejects bad input before compiling anything."""
import ast
import importlib.metadata
import json
import os
import pathlib
import re
import subprocess
import sys

import chex
import numpy as np
import pytest
from parallel_test import params

from marl_jax import checkpoint, configs

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = f"--config={REPO / 'experiments' / 'single_agent.py'}:size=tiny"


def _main(workdir, *flags, timeout=900):
  """Runs the CLI with jax logging every compilation (so a test can tell whether anything compiled)."""
  env = dict(os.environ, JAX_LOG_COMPILES="1", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "marl_jax.main", CONFIG, f"--workdir={workdir}", *flags],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _snapshot(workdir):
  """Every file under `workdir` with its bytes."""
  return {str(p.relative_to(workdir)): p.read_bytes() for p in sorted(pathlib.Path(workdir).rglob("*"))
          if p.is_file()}


def _steps(workdir):
  """The `step` of every line of metrics.jsonl, in file order (repeats included)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line)["step"] for line in f]


def _check_rejected(result, expected):
  assert result.returncode != 0
  for piece in expected:
    assert piece in result.stderr, (piece, result.stderr[-2000:])
  assert "Compiling" not in result.stderr  # failed while building the config, before any compile
  assert "warm start" not in result.stdout


def test_every_module_the_package_imports_is_an_install_requirement():
  # `pip install marl_jax` without the dev extras must run every command line: matplotlib, which the
  # credit benchmark imports, once came only with the extras.  An import inside a function (one flag's
  # code, as tools.lm_bench's --peer=transformers) may instead come from the optional `peer` extra.
  imported, imported_in_functions = set(), set()
  for path in (REPO / "marl_jax").rglob("*.py"):
    tree = ast.parse(path.read_text())
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f)}
    for node in ast.walk(tree):
      names = (set() if not isinstance(node, (ast.Import, ast.ImportFrom)) else
               {alias.name.split(".")[0] for alias in node.names} if isinstance(node, ast.Import) else
               {node.module.split(".")[0]} if node.level == 0 else set())
      (imported_in_functions if id(node) in nested else imported).update(names)
  setup_call = next(node for node in ast.walk(ast.parse((REPO / "setup.py").read_text()))
                    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup")
  setting = lambda arg: next(ast.literal_eval(k.value) for k in setup_call.keywords if k.arg == arg)
  canonical = lambda name: re.sub(r"[-_.]+", "-", name).lower()
  named = lambda requirements: {canonical(re.split(r"[<>=!~;\[ ]", r)[0]) for r in requirements}
  required, optional = named(setting("install_requires")), named(setting("extras_require")["peer"])
  imported_in_functions -= {m for m in imported_in_functions if canonical(m) in optional}
  third_party = (imported | imported_in_functions) - set(sys.stdlib_module_names) - {"marl_jax"}
  distributions = importlib.metadata.packages_distributions()
  undeclared = {module: distributions.get(module) for module in third_party
                if not {canonical(d) for d in distributions.get(module, [])} & required}
  assert not undeclared, f"imported by marl_jax but not in setup.py's install_requires: {undeclared}"


@pytest.mark.slow
def test_train_resume_and_refuse_bad_input(tmp_path):
  workdir = tmp_path / "run"
  first = _main(workdir)
  assert first.returncode == 0, first.stderr[-3000:]
  assert "Compiling jit(train_call)" in first.stderr  # the compile log works (see _check_rejected)
  assert "warm start" in first.stdout

  # One metrics row per logged step, each with `step` and `accuracy`; the resolved config; checkpoints.
  with open(workdir / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [0, 2, 4]
  assert all(isinstance(r["accuracy"], float) and 0.0 <= r["accuracy"] <= 1.0 for r in rows)
  assert all("eval_accuracy" in r for r in rows)
  config = json.loads((workdir / "config.json").read_text())
  assert config["total_steps"] == 4 and config["task"]["name"] == "arithmetic"
  assert checkpoint.latest_step(str(workdir)) == 4
  assert (workdir / "checkpoints" / "4").is_dir()
  assert list((workdir / "tensorboard").iterdir())

  # A new run starting from this one's latest parameters (config.init_from): no warm start, and its
  # step-0 greedy evaluation is exactly that of the parameters it loaded (step 4 here).
  warm = _main(tmp_path / "from_run", f"--config.init_from={workdir}", "--config.total_steps=2")
  assert warm.returncode == 0, warm.stderr[-3000:]
  assert "warm start" not in warm.stdout
  with open(tmp_path / "from_run" / "metrics.jsonl") as f:
    assert json.loads(f.readline())["eval_accuracy"] == rows[-1]["eval_accuracy"]
  # Its step-0 checkpoint holds the loaded run's step-4 parameters exactly (not its step 0's).
  started = params(str(tmp_path / "from_run"), 0)
  chex.assert_trees_all_equal(started, params(str(workdir), 4))
  assert not np.array_equal(started["embed"]["embedding"], params(str(workdir), 0)["embed"]["embedding"])

  # The same workdir with more steps resumes at step 4: no warm start, no second step-0 row.
  second = _main(workdir, "--config.total_steps=8")
  assert second.returncode == 0, second.stderr[-3000:]
  assert "warm start" not in second.stdout
  assert _steps(workdir) == [0, 2, 4, 6, 8]
  assert checkpoint.latest_step(str(workdir)) == 8
  assert json.loads((workdir / "config.json").read_text())["total_steps"] == 8

  # Bad input against this real workdir: refused, and not one byte of it changes (more bad input in
  # tests/reliability_test.py).
  before = _snapshot(workdir)
  _check_rejected(_main(workdir, "--config.optim.name=nope", "--config.total_steps=10", timeout=300),
                  ["config.optim.name='nope'", "'adam'", "'sgd'"])
  assert _snapshot(workdir) == before


@pytest.mark.slow
def test_name_flags_select_their_settings(tmp_path):
  """`--config.credit.name=NAME` (or task, protocol) makes config.credit that estimator's group, so its
  own settings can be set by the flags beside it and the file's estimator's others do not follow it;
  each run is refused by a later check, before compiling, which shows the selection built."""
  solver_verifier = f"--config={REPO / 'experiments' / 'solver_verifier.py'}:size=tiny"  # difference credit

  def run(*flags):
    return subprocess.run([sys.executable, "-m", "marl_jax.main", solver_verifier, f"--workdir={tmp_path}",
                           *flags], cwd=REPO, env=dict(os.environ, JAX_LOG_COMPILES="1", JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=300, check=False)

  # The critic's own settings, which difference lacks, are keys now (the critic's check reads them).
  _check_rejected(run("--config.credit.name=critic", "--config.credit.d_model=16", "--config.credit.n_heads=3"),
                  ["config.credit.d_model=16 must divide by config.credit.n_heads=3"])
  # team takes none of difference's weights: the group is team's, and the step's checks go on past it.
  _check_rejected(run("--config.credit.name", "team", "--config.rl.minibatches=3"),
                  ["config.rl.minibatches=3 does not divide"])
  _check_rejected(run("--config.credit.name=team", "--config.credit.outcome_weight=2"),
                  ["config.credit.outcome_weight is not a key; allowed: ['baseline', 'name']"])
  # The same for the task and the protocol (arithmetic and solver_verifier in the file).
  _check_rejected(run("--config.task.name=subset_sum", "--config.task.num_numbers=4", "--config.protocol.name=vote",
                      "--config.protocol.voters=2", "--config.rl.minibatches=3"),
                  ["config.rl.minibatches=3 does not divide"])
  _check_rejected(run("--config.task.name=subset_sum", "--config.task.num_ops=4"),
                  ["config.task.num_ops is not a key; allowed: ['demo_error_rate', 'max_number', 'name', 'num_numbers']"])
  assert not tmp_path.exists() or not any(tmp_path.iterdir())
  # The settings the two estimators share keep the file's values.
  difference = configs.credit_config("difference")
  difference.baseline, difference.samples = "grpo", 5
  assert configs.named_group("credit", "critic", like=difference).to_dict() == {
      **configs.credit_config("critic").to_dict(), "baseline": "grpo", "samples": 5, "outcome_weight": 1.0,
      "credit_weight": 1.0}
