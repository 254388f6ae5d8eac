"""Newcomers: a run that joins a trained team with a role replaced changes only that role's parameters
at step 0 (fresh ones, or another team's), keeps the rest frozen when asked, distils a newcomer on an
archive leaving the team as it was, and refuses newcomers it cannot place."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from archive_test import tiny_experiment, write_run
from generations_test import hand_made_archive

from marl_jax import checkpoint, experiment, loop, newcomers, sft, state, transcripts
from marl_jax.tools import newcomer_report


def two_seeds(**settings):
  config = tiny_experiment("signalling").config
  config.num_seeds = 2
  config.update_from_flattened_dict(settings)
  return config


def team(workdir: str, seed: int) -> str:
  """A tiny signalling team of two seeds (random parameters from `seed`), saved as training saves it."""
  write_run(workdir, experiment.build(two_seeds(seed=seed)))
  return workdir


def newcomer_run(workdir: str, team_dir: str, total_steps: int = 0, **settings):
  config = two_seeds(init_from=team_dir, total_steps=total_steps, **settings)
  loop.train_and_evaluate(config, workdir)
  exp = experiment.build(config)
  return [checkpoint.restore(workdir, state.abstract_state(exp), step).params for step in (0, total_steps)]


def sets(params_S, s):
  return jax.tree.map(lambda x: np.asarray(x[:, s]), params_S)


def same(a, b):
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def teams(tmp_path_factory):
  root = tmp_path_factory.mktemp("teams")
  return team(str(root / "a"), seed=0), team(str(root / "b"), seed=1)


SENDER, RECEIVER = 0, 1  # isolated sets, in role order


def saved_team(workdir):
  return loop.load_params(experiment.build(two_seeds()), workdir)


@pytest.mark.slow  # several compiled programs: the fast tier stays under 4 minutes
def test_a_fresh_newcomer_replaces_only_its_roles_parameters_at_step_0(teams, tmp_path):
  a, _ = teams
  fresh, _ = newcomer_run(str(tmp_path / "fresh"), a, **{"newcomers.roles": "receiver"})
  team_a = saved_team(a)
  assert same(sets(fresh, SENDER), sets(team_a, SENDER))
  assert not same(sets(fresh, RECEIVER), sets(team_a, RECEIVER))


@pytest.mark.slow  # the fast tier keeps the fresh newcomer's case
def test_a_newcomer_from_another_team_brings_that_teams_role(teams, tmp_path):
  a, b = teams
  sender, receiver = SENDER, RECEIVER
  team_a, team_b = saved_team(a), saved_team(b)
  other, _ = newcomer_run(str(tmp_path / "other"), a, **{"newcomers.roles": "receiver", "newcomers.source": b})
  assert same(sets(other, sender), sets(team_a, sender)) and same(sets(other, receiver), sets(team_b, receiver))


@pytest.mark.slow  # it trains: a compile of the step
def test_the_rest_of_the_team_stays_frozen_when_asked(teams, tmp_path):
  a, _ = teams
  start, end = newcomer_run(str(tmp_path / "frozen"), a, total_steps=2,
                            **{"newcomers.roles": "receiver", "roles.trainable": "0,1"})
  assert same(sets(end, 0), sets(start, 0)) and not same(sets(end, 1), sets(start, 1))


@pytest.mark.parametrize("settings, message", [
    ({"newcomers.roles": "judge"}, "config.newcomers.roles='judge' names ['judge']; allowed: roles of this workflow"),
    ({"newcomers.roles": "receiver", "roles.sharing": "shared"}, "would replace roles ['sender'] too"),
    ({"newcomers.roles": "receiver", "init_from": ""}, "needs config.init_from"),
], ids=["unknown", "shared", "no_team"])
def test_newcomers_that_cannot_be_placed_are_refused(teams, tmp_path, settings, message):
  config = two_seeds(**{"init_from": teams[0], **settings})
  with pytest.raises(experiment.ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
    loop.train_and_evaluate(config, str(tmp_path / "refused"))
  assert not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_a_distilled_newcomer_learns_its_roles_messages_and_the_team_stays(teams, tmp_path):
  # A fresh receiver joins team a and, before RL, distils the right transcripts of a hand-made archive
  # (`generations_test`): it reads each code back to its object, while the sender is unchanged.
  path = str(tmp_path / transcripts.MarlTranscripts.name / "hand")
  config = two_seeds(**{"task.num_attributes": 2, "task.num_values": 3})
  _, right_NxT = hand_made_archive(experiment.build(config), str(tmp_path), "hand")
  start, _ = newcomer_run(str(tmp_path / "distilled"), teams[0], **{
      "task.num_attributes": 2, "task.num_values": 3, "newcomers.roles": "receiver", "newcomers.distil": True,
      "sft.steps": 300, "sft.steps_per_call": 300, "sft.transcripts": path, "sft.learning_rate": 3e-3})
  assert same(sets(start, SENDER), sets(saved_team(teams[0]), SENDER))
  exp = experiment.build(config)
  receiver_only_NxR = jnp.tile(jnp.array([[0.0, 1.0]]), (9, 1))
  for s in range(2):
    params_R = jax.tree.map(lambda x: x[s], start)
    assert float(sft.demonstration_loss(exp, params_R, right_NxT, receiver_only_NxR)) < 0.05


@pytest.mark.slow  # a run and its evaluations, about a minute
def test_a_newcomer_report_reads_recovery_and_agreement(teams, tmp_path, capsys):
  # The team's final accuracies are written by hand: seed 0's 0 is reached at step 0 by any team,
  # seed 1's 2 never.  The newcomer is the team's own receiver (source: the team) and nothing trains,
  # so its team writes every one of the team's messages: agreement 1 for both roles.
  a, _ = teams
  with open(os.path.join(a, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 0, "eval_accuracy": 1.0, "eval_accuracy/seed0": 1.0, "eval_accuracy/seed1": 1.0}) + "\n")
    f.write(json.dumps({"step": 4, "eval_accuracy": 1.0, "eval_accuracy/seed0": 0.0, "eval_accuracy/seed1": 2.0}) + "\n")
  run = str(tmp_path / "own")
  newcomer_run(run, a, **{"newcomers.roles": "receiver", "newcomers.source": a})
  newcomer_report.main([f"--workdir={run}", f"--out={tmp_path / 'recovery.json'}"])
  out = json.loads((tmp_path / "recovery.json").read_text())
  assert out["team"] == a and out["target"] == [0.0, 2.0] and out["steps_to_recover"] == [0.0, float("inf")]
  assert out["start_accuracy"] == out["final_accuracy"]
  assert out["sender_agreement"] == [1.0, 1.0] and out["receiver_agreement"] == [1.0, 1.0]
  assert "newcomers 'receiver' joining" in capsys.readouterr().out
  with pytest.raises(SystemExit):  # a run without newcomers has nothing to recover
    newcomer_report.main([f"--workdir={a}"])
  assert "is not a newcomer run" in capsys.readouterr().err
