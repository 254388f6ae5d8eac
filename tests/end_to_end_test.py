"""End-to-end runs: every workflow, every credit estimator and every task trains through the run a
user starts (`loop.train_and_evaluate`: evaluation, a train call, metrics, checkpoint; the single
agent's run also warm-starts), at the tiny size, shrunk to one step.

Fifteen runs cover the lot: each workflow once, each estimator and each task at least once. Four of
them are in the fast tier (the warm start, a verifier with difference credit, the relay, a language
model answering in free text: the loop's main paths), the others in the slow tier, where the
experiments' tiny variants also run through the real CLI (workflows_test, tasks_test, main_test,
word_task_test); one run in-process costs 8 to 18 seconds of compiling from an empty cache.
"""
import json
import pathlib

import pytest

from marl_jax import configs, credit, loop, protocols, tasks

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"

FAST_RUNS = [  # experiment file, its argument (the rest in the slow tier, so the fast one stays under 4 minutes)
    ("single_agent", "size=tiny"),
]
SLOW_RUNS = [
    ("tasks", "task=subset_sum,protocol=solver_verifier,credit=difference,size=tiny"),
    ("tasks", "task=arithmetic,protocol=relay,credit=role_baseline,size=tiny"),
    ("lm_word_problems", "size=tiny"),  # a language-model agent answering in free text
    ("tasks", "task=hidden_sum,credit=per_role,size=tiny"),  # exchange
    ("tasks", "task=signalling,credit=difference,size=tiny"),  # exchange's Lewis game, from scratch
    ("tasks", "task=matrix_game,credit=shapley,size=tiny"),
    ("tasks", "task=contribution,credit=critic,size=tiny"),
    ("tasks", "task=multi_chain,credit=role_normalized,size=tiny"),  # orchestrator
    ("tasks", "task=stack_program,size=tiny"),
    ("vote", "size=tiny"),
    ("best_of_n", "size=tiny"),
    ("peer_review", "size=tiny,pay=audited"),  # the solver rewarded by its judges, audited
    ("debate", "size=tiny"),
    ("delegate", "size=tiny"),
    ("delegate", "size=tiny,task=wide,workers=3"),  # every worker slot trained
]
RUNS = FAST_RUNS + SLOW_RUNS


def _config(name, arg):
  config = configs.sibling(str(EXPERIMENTS / "x.py"), name).get_config(arg)
  config.num_devices = 1  # other tests may have forced several CPU devices in this process
  config.total_steps = config.steps_per_call = config.eval_every = config.checkpoint_every = 1
  config.log_every = 1
  # The warm start's calls run once (in the single agent's run): in the others they would only add
  # their compile; every workflow's demonstrations have tests of their own (tasks_test, contract_test).
  config.sft.steps_per_call = 2
  config.sft.steps = 2 if name == "single_agent" else 0
  return config


def test_the_runs_cover_every_workflow_estimator_and_task():
  built = [_config(name, arg) for name, arg in RUNS]
  assert {c.protocol.name for c in built} == set(protocols.REGISTRY)
  assert {c.credit.name for c in built} == set(credit.REGISTRY)
  assert {c.task.name for c in built} == set(tasks.REGISTRY)


@pytest.mark.parametrize("name, arg", [pytest.param(*run, id=":".join(run)) for run in FAST_RUNS]
                         + [pytest.param(*run, id=":".join(run), marks=pytest.mark.slow) for run in SLOW_RUNS])
def test_a_tiny_run_trains_evaluates_and_saves(tmp_path, name, arg):
  loop.train_and_evaluate(_config(name, arg), str(tmp_path))
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  last = rows[-1]
  assert last["step"] == 1 and 0 <= last["eval_accuracy"] <= 1
  assert any("loss" in key for row in rows for key in row)  # the update ran and logged
  assert (tmp_path / "checkpoints" / "1").is_dir()
