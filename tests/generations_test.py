"""Generations: distilling an archive reproduces each role's messages (the transcripts the filter
keeps), archives of training problems are not the evaluation set, bad settings are refused before
anything compiles, and the command runs through the CLI and resumes without retraining a finished
generation."""
import copy
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import array_records, configs, experiment, loop, rollout, sampling, sft, state, tasks, text
from marl_jax.tools import archive, generations
from marl_jax import transcripts
from marl_jax.protocols import engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name: str, arg: str):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, f"experiments/{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def signalling_config(**overrides):
  config = load("tasks", "task=signalling,size=tiny")
  config.num_devices = 1
  config.task.update(num_attributes=2, num_values=3)
  config.update_from_flattened_dict(overrides)
  return config


def hand_made_archive(exp, data_dir: str, name: str):
  """Each of the 9 objects twice: once right (the sender writes its values as letters, reversed, then
  `d`; the receiver the object) and once wrong (the sender `ddd`, the receiver `00`), one seed.  The
  sender's letters are its alphabet's (`task.vocab`, a to d): fixed-length messages, no EOS."""
  object_NxK = jnp.array(list(itertools.product(range(3), repeat=2)) * 2, jnp.int32)
  right_N = np.arange(18) < 9
  N = len(right_N)
  prompt_NxP = jnp.concatenate([jnp.full((N, 1), text.BOS), text.DIGIT0 + object_NxK], 1)
  letters_NxK = text.TOKEN_ID["a"] + object_NxK[:, ::-1]
  sender_NxM = jnp.where(right_N[:, None], letters_NxK, text.TOKEN_ID["d"])
  receiver_NxK = jnp.where(right_N[:, None], text.DIGIT0 + object_NxK, text.DIGIT0)
  eos = jnp.full((N, 1), text.EOS)
  tokens_NxT = engine.assemble(exp.layout, prompt_NxP, [jnp.concatenate([sender_NxM, jnp.full((N, 1), text.TOKEN_ID["d"])], 1),
                                                         jnp.concatenate([receiver_NxK, eos], 1)])
  rows = {"tokens": np.asarray(tokens_NxT), "team_reward": right_N.astype(np.float32),
          "role_reward": np.repeat(right_N[:, None], 2, 1).astype(np.float32),
          "seed": np.zeros(N, np.int32), "index": np.arange(N, dtype=np.int32)}
  array_records.write(transcripts.MarlTranscripts, name, data_dir, rows, archive.layout_metadata(exp))
  return {"prompt": prompt_NxP[:9], "answer": jnp.concatenate([text.DIGIT0 + object_NxK, eos], 1)[:9],
          "object": object_NxK[:9]}, tokens_NxT[:9]


@pytest.mark.slow  # a run, its archive and a distilled warm start: over 10 s
def test_distilling_an_archive_reproduces_each_roles_right_messages(tmp_path):
  path = str(tmp_path / transcripts.MarlTranscripts.name / "hand")
  config = signalling_config(**{"sft.steps": 300, "sft.steps_per_call": 300, "sft.transcripts": path,
                                "sft.filter": "right", "sft.learning_rate": 3e-3})
  exp = experiment.build(config)
  problems, right_NxT = hand_made_archive(exp, str(tmp_path), "hand")
  archived = transcripts.distillation_set(exp)
  np.testing.assert_array_equal(archived.weight_SxNxR[0].sum(1), [2] * 9 + [0] * 9)  # the wrong half weighs 0
  params_S = sft.run(exp, state.seed_keys(config), archived=archived).params
  params_R = jax.tree.map(lambda x: x[0], params_S)
  # Near-zero loss on the right transcripts, and greedy play writes them: the sender its code for
  # each object, the receiver the object back from that code.
  assert float(sft.demonstration_loss(exp, params_R, right_NxT)) < 0.05
  played_NxT = rollout.sample(exp, params_R, problems, jax.random.split(jax.random.key(0), 9), greedy=True).tokens_BxT
  for turn in range(2):
    np.testing.assert_array_equal(engine.message(exp.layout, played_NxT, turn), engine.message(exp.layout, right_NxT, turn))


@pytest.mark.parametrize("overrides, message", [
    ({"sft.filter": "best"}, "config.sft.filter='best' is unknown; allowed: ['right', 'all', 'credit']"),
    ({"sft.transcripts": "/nowhere/marl_transcripts/x"}, "is not a transcript archive; allowed: DIR/marl_transcripts/NAME"),
    ({"sft.filter": "credit"}, "holds no credit; config.sft.filter='credit' needs an archive written with it"),
], ids=["filter", "missing", "credit"])
def test_an_archive_that_cannot_be_distilled_is_refused_before_compiling(tmp_path, overrides, message):
  path = str(tmp_path / transcripts.MarlTranscripts.name / "hand")
  hand_made_archive(experiment.build(signalling_config()), str(tmp_path), "hand")
  exp = experiment.build(signalling_config(**{"sft.transcripts": path, **overrides}))
  with pytest.raises(ValueError, match=re.escape(message)):
    transcripts.distillation_set(exp)
  # One archived seed serves every seed of a run.
  three = experiment.build(signalling_config(**{"sft.transcripts": path, "num_seeds": 3}))
  assert transcripts.distillation_set(three).tokens_SxNxT.shape[:2] == (3, 18)


def test_a_seed_with_nothing_to_learn_and_another_canvas_are_refused(tmp_path):
  path = str(tmp_path / transcripts.MarlTranscripts.name / "hand")
  exp = experiment.build(signalling_config())
  hand_made_archive(exp, str(tmp_path), "hand")
  # Every transcript wrong: the right ones are none.
  arrays = transcripts.load_transcripts(str(tmp_path), "hand").arrays
  array_records.write(transcripts.MarlTranscripts, "wrong", str(tmp_path), {**arrays, "team_reward": 0 * arrays["team_reward"]},
                      archive.layout_metadata(exp))
  with pytest.raises(ValueError, match="seed 0 has no transcript that config.sft.filter='right' keeps"):
    transcripts.distillation_set(experiment.build(signalling_config(**{"sft.transcripts": path[:-4] + "wrong"})))
  with pytest.raises(ValueError, match="on another canvas"):
    transcripts.distillation_set(experiment.build(signalling_config(**{"sft.transcripts": path, "task.num_attributes": 3})))
  # A sender narrowed to a and b cannot learn the archive's c and d (row 0: object 00, message "aad").
  with pytest.raises(ValueError, match="row 0 holds 'd' at position 6, which this run's turn may not write"):
    transcripts.distillation_set(experiment.build(signalling_config(**{"sft.transcripts": path, "task.vocab": 2})))


def test_an_archive_of_training_problems_is_not_the_evaluation_set():
  exp = experiment.build(signalling_config(**{"task.num_attributes": 6, "task.num_values": 10}))
  train = archive.training_problems(exp, 64)
  evaluation = tasks.eval_problems(exp.task, exp.config.eval.seed, 64)
  assert not np.any(np.all(np.asarray(train["object"])[:, None] == np.asarray(evaluation["object"])[None], -1))
  jax.tree.map(np.testing.assert_array_equal, train, archive.training_problems(exp, 64))  # fixed by the seed


def generations_cli(workdir: str, *flags: str, arg: str = "size=tiny"):
  return subprocess.run([sys.executable, "-m", "marl_jax.tools.generations", f"--config=experiments/generations.py:{arg}",
                         f"--workdir={workdir}", *flags], cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                        capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_tiny_generations_run_through_the_cli_and_resume_without_retraining(tmp_path):
  workdir = str(tmp_path / "gens")
  proc = generations_cli(workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "| 1 |" in proc.stdout
  rows = json.loads(open(os.path.join(workdir, "generations.json")).read())
  assert [r["generation"] for r in rows] == [0, 1] and "steps_to_target" in rows[1]
  assert 0 <= rows[1]["sender_agreement"][0] <= 1 and "receiver_agreement" in rows[1]
  gen1 = json.loads(open(os.path.join(workdir, "gen1", "config.json")).read())
  assert gen1["sft"]["transcripts"].endswith("gen0/transcripts/marl_transcripts/train64-step4-sampled")
  archived = transcripts.load_transcripts(os.path.join(workdir, "gen0", "transcripts"), "train64-step4-sampled")
  assert archived.metadata["problems"] == "train-seed0-n64"
  # An interruption: generation 1 killed after its checkpoint 2 (its later checkpoint and log lost),
  # generation 0's archive never written.  The rerun trains neither generation 0 nor the first steps of
  # generation 1 again: generation 0's files are untouched, and generation 1 ends where it ended.
  final = loop.load_params(experiment.build(configs.read_run_config(os.path.join(workdir, "gen1"))),
                           os.path.join(workdir, "gen1"))
  gen0_files = {p: os.stat(p).st_mtime_ns for p in (os.path.join(workdir, "gen0", f) for f in ("metrics.jsonl", "config.json"))}
  subprocess.run(["rm", "-r", os.path.join(workdir, "gen1", "checkpoints", "4"), os.path.join(workdir, "gen0", "transcripts")],
                 check=True)
  proc = generations_cli(workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert {p: os.stat(p).st_mtime_ns for p in gen0_files} == gen0_files
  assert array_records.exists(transcripts.MarlTranscripts, "train64-step4-sampled", os.path.join(workdir, "gen0", "transcripts"))
  resumed = loop.load_params(experiment.build(configs.read_run_config(os.path.join(workdir, "gen1"))),
                             os.path.join(workdir, "gen1"))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), resumed, final)
  # Bad settings: one line naming the key, before anything runs.
  bad = generations_cli(str(tmp_path / "bad"), "--config.distil.filter=best")
  assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == (
      "FATAL ConfigError: config.distil.filter='best' is unknown; allowed: ['right', 'all', 'credit']")
  assert not os.path.exists(tmp_path / "bad")


@pytest.mark.parametrize("task_name", ["signalling", "hidden_sum", "arithmetic"])
def test_the_config_builds_both_kinds_of_generation_at_every_size(task_name, tmp_path):
  for size in ("tiny", "cpu", "gpu"):
    config = load("generations", f"task={task_name},size={size}")
    config.run.num_devices = 1
    generations.check(config, str(tmp_path))  # generation 0's run, and generation 1's (it distils)
    assert generations.generation_config(config, str(tmp_path), 1).sft.transcripts.startswith(str(tmp_path / "gen0"))
    assert (config.run.sft.steps == 0) == (task_name == "signalling")  # only signalling learns from scratch
  with pytest.raises(ValueError, match=r"config argument task='stack_program' is unknown"):
    load("generations", "task=stack_program")


def test_stages_override_each_generations_run_and_the_team_carries_on(tmp_path):
  config = load("generations", "task=arithmetic,size=tiny")
  config.update_from_flattened_dict({"run.num_devices": 1, "generations": 3, "inherit": "team", "replay": 0.5,
                                     "stages": "task.ops=+;task.ops=*,total_steps=6"})
  first, second, third = (generations.generation_config(config, str(tmp_path), g) for g in range(3))
  assert (first.task.ops, first.total_steps, second.task.ops, second.total_steps) == ("+", 4, "*", 6)
  assert third.task.ops == "*" and third.total_steps == 6  # the last stage serves every later generation
  # Generation 1 carries on from generation 0's team through its own warm start (its demonstrations of
  # multiplication), half of each batch replaying generation 0's archive of additions.
  assert second.init_from == str(tmp_path / "gen0") and second.newcomers.source == second.init_from
  assert second.newcomers.roles == "agent" and second.newcomers.distil
  assert second.sft.archive_share == 0.5 and second.sft.transcripts == generations.transcripts_path(config, str(tmp_path), 0)
  assert generations.transcripts_path(config, str(tmp_path), 1).endswith("train64-step6-sampled")
  assert not first.init_from and not first.sft.transcripts
  for overrides, message in [({"stages": "task.colour=red"}, "config.stages sets 'task.colour' for generation 0"),
                             ({"stages": "total_steps=many"}, "config.stages sets total_steps='many' for generation 0; allowed: a value "
                                                              "of the type of config.run.total_steps (int)"),
                             ({"inherit": "parents"}, "config.inherit='parents' is unknown; allowed: ['distil', 'team']"),
                             ({"inherit": "distil"}, "config.replay=0.5 replays an archive while the team carries on"),
                             ({"replay": 1.5}, "config.replay=1.5; allowed: a probability in [0, 1]")]:
    bad = copy.deepcopy(config)
    bad.update_from_flattened_dict(overrides)
    with pytest.raises(ValueError, match=re.escape(message)):
      generations.check(bad, str(tmp_path))


@pytest.mark.slow  # 300 warm-start steps
def test_a_replay_mixes_the_archive_with_the_demonstrations_half_and_half(tmp_path):
  # archive_share 0.5: each row is the archive's (the sender writes its letter code) or a demonstration
  # (the sender copies the object's digits), each half the time.  Fitted to that mixture, the sender
  # writes either message with probability about 1/2; the receiver answers the object after both.
  path = str(tmp_path / transcripts.MarlTranscripts.name / "hand")
  config = signalling_config(**{"task.vocab": 0, "sft.steps": 300, "sft.steps_per_call": 300, "sft.transcripts": path,
                                "sft.archive_share": 0.5, "sft.learning_rate": 3e-3})
  exp = experiment.build(config)
  problems, right_NxT = hand_made_archive(exp, str(tmp_path), "hand")
  params_R = jax.tree.map(lambda x: x[0], sft.run(exp, state.seed_keys(config), archived=transcripts.distillation_set(exp)).params)
  copy_NxT = exp.protocol.demonstrate(exp.task, exp.layout, problems, jax.random.split(jax.random.key(0), 9))
  start, stop = exp.layout.turn_slices[0]
  for tokens_NxT in (right_NxT, copy_NxT):
    logp_NxT, _ = sampling.token_log_probs(exp.model, exp.layout, params_R, tokens_NxT, 1.0)
    message_N = np.exp(np.sum(np.where(tokens_NxT[:, start:stop] != text.PAD, logp_NxT[:, start:stop], 0), 1))
    assert 0.3 < message_N.mean() < 0.7, message_N
  with pytest.raises(ValueError, match=re.escape("config.sft.archive_share=0.0; allowed: a number in (0, 1]")):
    transcripts.distillation_set(experiment.build(signalling_config(**{"sft.transcripts": path, "sft.archive_share": 0.0})))


@pytest.mark.slow
def test_a_team_trained_on_a_then_b_is_evaluated_on_a_again_through_the_cli(tmp_path):
  workdir = str(tmp_path / "ab")
  proc = generations_cli(workdir, "--config.generations=2", "--config.inherit=team", "--config.stages=task.ops=+;task.ops=*",
                         "--config.replay=0.5", "--config.run.num_seeds=2", arg="task=arithmetic,size=tiny")
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(open(os.path.join(workdir, "generations.json")).read())
  gen1 = json.loads(open(os.path.join(workdir, "gen1", "config.json")).read())
  assert gen1["task"]["ops"] == "*" and gen1["init_from"] == os.path.join(workdir, "gen0")
  assert gen1["sft"]["archive_share"] == 0.5 and gen1["sft"]["transcripts"].endswith("gen0/transcripts/marl_transcripts/train64-step4-sampled")
  assert "steps_to_target" not in rows[1] and len(rows[1]["first_task_accuracy"]) == 2
  # Generation 0's own team on its own task: its final evaluation.
  np.testing.assert_allclose(generations.first_task_accuracy(workdir, 0), rows[0]["accuracy"], atol=1e-6)


@pytest.mark.slow  # every cell of the study at the tiny size, one seed set: many commands, minutes
def test_the_study_script_runs_every_cell_tiny_and_its_tables_read_them(tmp_path):
  out = str(tmp_path / "study")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "SIZE": "tiny", "SEEDS": "0"}
  proc = subprocess.run(["scripts/generations_results.sh", out], cwd=ROOT, capture_output=True, text=True, timeout=3600,
                        env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(os.listdir(out)) == ["seed0"]
  d = os.path.join(out, "seed0")
  assert [r["generation"] for r in json.loads(open(os.path.join(d, "generations.json")).read())] == [0, 1, 2]
  for name in ("newcomer_fresh/recovery.json", "newcomer_distilled/recovery.json", "newcomer_fresh_gen1/recovery.json",
               "newcomer_fresh_gen2/recovery.json", "crossplay.json",
               "retention_replay0/generations.json", "retention_replay0.5/generations.json",
               "retention_mul_replay0/generations.json", "retention_mul_replay0.5/generations.json",
               "control/generations.json"):
    assert os.path.isfile(os.path.join(d, name)), name
  tables = generations.study_tables(out)
  for heading in ("## Generations", "## Compute-matched control", "## Cross-play", "## Newcomers",
                  "## Retention (arithmetic: A = additions", "## Retention (arithmetic: A = multiplications"):
    assert heading in tables
  # The tiny lineage: 4 RL steps, then 4 distillation and 4 RL steps a generation; the control at each.
  control = [line.split(" | ") for line in tables.splitlines() if line.startswith("| seed0 | ") and line.count(" | ") == 5]
  assert [cells[2] for cells in control if cells[2].isdigit()] == ["4", "12", "20"], tables
  assert "| seed0 | generation 0 | distilled − fresh (paired) |" in tables and "| seed0 | replay − none (paired) |" in tables
  assert "| seed0 | generation 2 − generation 0 | fresh (paired) |" in tables
  generations.plot_study(out, str(tmp_path / "accuracy.png"))
  assert os.path.getsize(tmp_path / "accuracy.png") > 0
  # A rerun finds every cell finished and trains nothing.
  rerun = subprocess.run(["scripts/generations_results.sh", out], cwd=ROOT, capture_output=True, text=True, timeout=3600,
                         env=env)
  assert rerun.returncode == 0 and "train:" not in rerun.stderr, rerun.stderr[-3000:]
