"""Delegate (orchestrator-workers, PARL): schedule and visibility, sub-problem parsing, rewards and
metrics on hand-built transcripts, demonstrations, the annealing schedule, bad input, and a tiny run
through the CLI whose frozen workers stay bit-identical."""
import functools
import json
import operator
import os
import pathlib
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from marl_jax import (checkpoint, configs, experiment, parallel, protocols, rollout, sampling, state, tasks, text,
                      train)
from marl_jax.protocols import engine
from train_test import compiled_init_state

REPO = pathlib.Path(__file__).resolve().parents[1]
TASK = tasks.make("multi_chain", num_chains=2, num_ops=1)  # '<bos>3+4,2*3=' -> 3; a part is '3+4<eos>'
ORCH, W0, W1 = 0, 1, 2


def _setup(**knobs):
  protocol = protocols.make("delegate", TASK, **knobs)
  return protocol, protocol.layout(TASK, (0, 1, 1))


@functools.cache
def _jit_rewards(protocol):
  """protocol.rewards as one compiled program (op-by-op, its many small ops are slow to dispatch)."""
  layout = protocol.layout(TASK, (0, 1, 1))
  return jax.jit(lambda problems, tokens_BxT: protocol.rewards(TASK, layout, problems, tokens_BxT))


def test_schedule_and_visibility():
  protocol, layout = _setup()
  assert protocol.roles == ("orchestrator", "worker0", "worker1") and protocol.workers == 2
  # prompt 0..8 | assignments (marker + 4) x 2 | reports (marker + 2) x 2 | final answer (marker + 2)
  assert layout.segment_names == ("header", "chain0", "chain1", "orchestrator0", "orchestrator1",
                                  "worker00", "worker10", "orchestrator2")
  assert layout.turn_roles == (ORCH, ORCH, W0, W1, ORCH)
  assert layout.turn_slices == ((10, 14), (15, 19), (20, 22), (23, 25), (26, 28))
  # Worker s reads only its own assignment (and its own report); the orchestrator reads everything.
  visible = dict(zip(layout.segment_names, layout.visible_SxR.astype(int).tolist()))
  assert visible == {"header": [1, 0, 0], "chain0": [1, 0, 0], "chain1": [1, 0, 0],
                     "orchestrator0": [1, 1, 0], "orchestrator1": [1, 0, 1], "worker00": [1, 1, 0],
                     "worker10": [1, 0, 1], "orchestrator2": [1, 0, 0]}
  worker0_T = layout.visible_VxT[layout.role_view_R[W0]]
  np.testing.assert_array_equal(np.flatnonzero(worker0_T), list(range(9, 14)) + list(range(19, 22)))
  # The workers share a parameter set but not a view (they read different slots).
  assert layout.view_set_V == (0, 1, 1)
  # Workers are parallel: a worker's counterfactual re-draws its report and the final answer only.
  assert layout.resampled_turns({W0}) == [2, 4] and layout.resampled_turns({ORCH}) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("message, expected", [
    ("3+4<eos>", (7, True)), ("2*9<eos>", (8, True)), ("0-3<eos>", (7, True)),
    ("3+<eos><pad>", (0, False)), ("3+45", (0, False)), ("<eos><pad><pad><pad>", (0, False)),
    ("3=4<eos>", (0, False)), ("<absent><eos><pad><pad>", (0, False)),
    # A longer message is read the same way, but after the EOS only PAD may follow.
    ("3+4<eos><pad>", (7, True)), ("3+4<eos>5", (0, False)),
])
def test_part_value(message, expected):
  value, ok = jax.jit(TASK.part_value)(jnp.asarray(text.encode(message)))
  assert bool(ok) == expected[1]
  if expected[1]:
    assert int(value) == expected[0]


def _transcripts(rows):
  """Problems '<bos>3+4,2*3=' (parts 7 and 6, answer 3) and canvases holding each row's messages."""
  _, layout = _setup()
  B = len(rows)
  prompt_BxP = jnp.asarray([text.encode("<bos>3+4,2*3=")] * B)
  problems = {"prompt": prompt_BxP, "answer": jnp.asarray([text.encode("3<eos>")] * B),
              "part_values": jnp.asarray([[7, 6]] * B), "part_mistakes": jnp.asarray([[3, 2]] * B)}
  pad = lambda msg, n: text.encode(msg) + [text.PAD] * (n - len(text.encode(msg)))
  lengths = [stop - start for start, stop in layout.turn_slices]
  messages = [jnp.asarray([pad(row[i], n) for row in rows]) for i, n in enumerate(lengths)]
  return problems, engine.assemble(layout, prompt_BxP, messages)


E = "<eos>"
ROWS = [  # assignment 0, assignment 1, report 0, report 1, final answer
    ["3+4" + E, "2*3" + E, "7" + E, "6" + E, "3" + E],  # a: delegates both, combines the reports
    [E, E, E, E, "3" + E],  # b: assigns nothing, answers alone (serial collapse)
    ["3+4" + E, "3+4" + E, "7" + E, "7" + E, "4" + E],  # c: a repeated slot; uses the reports
    ["3+" + E, "2*3" + E, "5" + E, "6" + E, "3" + E],  # d: a malformed slot; ignores the right report
    ["4+3" + E, "2*3" + E, "7" + E, "6" + E, "3" + E],  # e: rewrites chain0 (not an exact copy)
    ["3+4" + E, "2*3" + E, "7" + E, "5" + E, "2" + E],  # f: one wrong report, combined as given
]


def test_rewards_and_metrics_by_hand():
  protocol, layout = _setup()
  problems, tokens_BxT = _transcripts(ROWS)
  np.testing.assert_array_equal(protocol.final_answer(layout, tokens_BxT)[:, 0],
                                [text.DIGIT0 + d for d in (3, 3, 4, 3, 3, 2)])
  scored = _jit_rewards(protocol)(problems, tokens_BxT)
  #                   a    b    c    d    e    f
  team_B = np.array([1., 1., 0., 1., 1., 0.])
  r_parallel_B = [1., 0., .5, .5, 1., 1.]  # well-formed slots that no earlier slot repeats
  r_finish_B = [1., 0., 1., 1., 1., .5]  # right reports among well-formed assignments
  np.testing.assert_allclose(scored.team_B, team_B)
  np.testing.assert_allclose(scored.aux_KxB, [r_parallel_B, r_finish_B])
  # Roles: the orchestrator's signal is the outcome, a worker's is a right report to a real sub-task.
  np.testing.assert_allclose(scored.role_RxB, [team_B, [1, 0, 1, 0, 1, 1], [1, 0, 1, 1, 1, 0]])
  expected = {
      "accuracy": 4 / 6, "r_parallel": 4 / 6, "r_finish": 4.5 / 6,
      "worker_accuracy": 8 / 9,  # a 2/2, c 2/2, d 1/1, e 2/2, f 1/2
      "workers_used": 10 / 6,  # b used none
      "spurious_parallelism": 2 / 10,  # c's repeat, d's malformed slot, among the 10 used slots
      "serial_collapse": 2 / 6,  # b (no report) and d (final answer is not the report's 6)
      # orchestrator tokens (assignments + final) + the longest report of a spawned worker: a c e f
      # 4+4+2+2, b 1+1+2 (no worker spawned: no parallel stage), d 3+4+2+2
      "critical_steps": (4 * 12 + 4 + 11) / 6,
      "coverage": (1 + 0 + .5 + .5 + .5 + 1) / 6,  # e's rewrite covers chain1 only
      # Each slot's right reports among its well-formed assignments: slot 0 has them in a c e f, all
      # right; slot 1 in a c d e f, f's wrong: 4/5 (together, worker_accuracy's 8/9).
      "worker0/member_accuracy": 1.0, "worker1/member_accuracy": 4 / 5,
  }
  assert set(scored.metrics) == set(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(scored.metrics[name], value, rtol=1e-6, err_msg=name)


def test_absent_orchestrator_and_workers_did_nothing():
  protocol, _ = _setup()
  absent = "<absent>" + E
  rows = [[absent, absent, "7" + E, "6" + E, absent], ["3+4" + E, "2*3" + E, absent, absent, "3" + E]]
  scored = _jit_rewards(protocol)(*_transcripts(rows * 3))  # 6 rows, as ROWS: the same program
  np.testing.assert_allclose(scored.team_B, [0., 1.] * 3)
  np.testing.assert_allclose(scored.aux_KxB, [[0., 1.] * 3, [0., 0.] * 3])
  assert scored.metrics["workers_used"] == 1.0 and scored.metrics["serial_collapse"] == 1.0


@pytest.mark.parametrize("delegate_rate, team, serial, used", [(1.0, 1.0, 0.0, 2.0), (0.0, 1.0, 1.0, 0.0)])
def test_demonstrations_without_noise(delegate_rate, team, serial, used):
  task = tasks.make("multi_chain", num_chains=2, num_ops=1, demo_error_rate=0.0)
  protocol = protocols.make("delegate", task, demo_delegate_rate=delegate_rate, worker_demo_error_rate=0.0)
  layout = protocol.layout(task, (0, 1, 1))
  problems = tasks.eval_problems(task, 0, 32)
  scored = jax.jit(lambda key_B: protocol.rewards(task, layout, problems, protocol.demonstrate(
      task, layout, problems, key_B)))(jax.random.split(jax.random.PRNGKey(1), 32))
  np.testing.assert_array_equal(scored.team_B, team)
  assert scored.metrics["serial_collapse"] == serial and scored.metrics["workers_used"] == used
  assert scored.metrics["r_parallel"] == delegate_rate and scored.metrics["r_finish"] == delegate_rate


@pytest.mark.parametrize("anneal, steps, expected", [
    ("linear", (0, 50, 100, 150), [[.4, .2], [.2, .1], [0., 0.], [0., 0.]]),
    ("never", (0, 100, 10_000), [[.4, .2]] * 3),
])
def test_annealing_schedule(anneal, steps, expected):
  protocol, _ = _setup(parallel_weight=0.4, finish_weight=0.2, anneal=anneal, anneal_steps=100)
  np.testing.assert_allclose([protocol.aux_weights(jnp.asarray(t)) for t in steps], expected, atol=1e-7)


def test_training_rewards_add_the_weighted_terms_at_the_step():
  protocol, _ = _setup(parallel_weight=0.4, finish_weight=0.2, anneal_steps=100)
  # The terms do not depend on the weights: score with the default protocol (compiled once).
  scored = _jit_rewards(_setup()[0])(*_transcripts(ROWS))
  # At step 50 the weights are (0.2, 0.1): bonus = 0.2 r_parallel + 0.1 r_finish, with (r_parallel,
  # r_finish) of rows a..f as in test_rewards_and_metrics_by_hand: (1, 1), (0, 0), (.5, 1), (.5, 1),
  # (1, 1), (1, .5); added to the outcome and to every role's signal.
  team_B, role_RxB = engine.training_rewards(protocol, scored, jnp.asarray(50))
  bonus_B = np.array([.3, 0., .2, .2, .3, .25])
  np.testing.assert_allclose(team_B, np.array([1., 1., 0., 1., 1., 0.]) + bonus_B, atol=1e-6)
  np.testing.assert_allclose(role_RxB, np.array([[1, 1, 0, 1, 1, 0], [1, 0, 1, 0, 1, 1], [1, 0, 1, 1, 1, 0]])
                             + bonus_B, atol=1e-6)
  team_B, _ = engine.training_rewards(protocol, scored)  # outside training: the outcome alone
  np.testing.assert_allclose(team_B, scored.team_B)


def test_the_step_and_its_reruns_score_with_the_weighted_terms():
  # The same bonus as above, where training reads it: the sampled episodes' outcome (`train.score`) and
  # their counterfactual re-runs' (`rollout.score_reruns`), or the difference credit would be biased by it.
  config = configs.sibling(str(REPO / "experiments" / "x.py"), "delegate").get_config("size=tiny")
  config.protocol.update(parallel_weight=0.4, finish_weight=0.2, anneal_steps=100)
  config.num_devices = 1
  exp = experiment.build(config)
  problems, tokens_BxT = _transcripts(ROWS)
  no_logp_BxT = jnp.zeros(tokens_BxT.shape)
  episodes = rollout.Episodes(tokens_BxT, no_logp_BxT, no_logp_BxT > 0)

  def team_outcomes(problems, episodes):
    _, outcome = train.score(exp, problems, episodes, jnp.asarray(50))
    rerun = rollout.score_reruns(exp, problems, episodes.tokens_BxT[None, None], jnp.asarray(50))
    return outcome.team_B, rerun.team_CxKxB[0, 0]

  mesh = jax.make_mesh((1,), (parallel.DATA,))
  whole = jax.sharding.PartitionSpec()
  team_B, rerun_team_B = jax.jit(jax.shard_map(team_outcomes, mesh=mesh, in_specs=whole, out_specs=whole,
                                               check_vma=False))(problems, episodes)
  expected_B = np.array([1., 1., 0., 1., 1., 0.]) + np.array([.3, 0., .2, .2, .3, .25])
  np.testing.assert_allclose(team_B, expected_B, atol=1e-6)
  np.testing.assert_allclose(rerun_team_B, expected_B, atol=1e-6)


@pytest.mark.slow
def test_the_training_step_weights_the_terms_at_its_own_step(monkeypatch):
  # `local_step` must hand its state's step to the scoring of its episodes and of difference credit's
  # re-runs.  Under a linear anneal over 2 steps r_parallel counts in full at step 0 and not at all at
  # step 2, where the update is that of a run without it.  With credit D_r alone (outcome_weight 0) it
  # moves only the orchestrator, whose plan it scores: a worker's re-runs keep the plan and its term,
  # which cancels.  The episodes are demonstrations, half of them delegating (random policies never
  # delegate, so they score no term), with their log-probs; the workers train.
  def demonstrations(exp, params_R, problems, key_B, rows_per_pass=0, plants=None):
    del rows_per_pass, plants  # one pass; nothing planted
    tokens_BxT = exp.protocol.demonstrate(exp.task, exp.layout, problems, key_B)
    sampled_BxT = (exp.layout.author_T[None] >= 0) & (tokens_BxT != text.PAD)
    logp_BxT, _ = sampling.token_log_probs(exp.model, exp.layout, params_R, tokens_BxT,
                                           exp.config.rl.temperature)
    return rollout.Episodes(tokens_BxT, jnp.where(sampled_BxT, logp_BxT, 0.), sampled_BxT)

  monkeypatch.setattr(rollout, "sample", demonstrations)

  def updated_sets(weight, steps):
    """(orchestrator's, workers') parameters after one step from the same state at each of `steps`."""
    config = configs.sibling(str(REPO / "experiments" / "x.py"), "delegate").get_config(
        "size=tiny,trainable_workers=1")
    config.num_devices = 1
    config.credit = configs.credit_config("difference")
    config.credit.outcome_weight = 0.
    config.protocol.update(parallel_weight=weight, finish_weight=0., anneal="linear", anneal_steps=2)
    exp = experiment.build(config)
    assert exp.role_set_R == (0, 1, 1)
    start = compiled_init_state(exp, jax.random.PRNGKey(0))
    keys_3xB = jax.random.split(jax.random.PRNGKey(1), 3 * config.rl.batch_size).reshape(
        3, config.rl.batch_size, -1)
    step = jax.jit(parallel.shard_map(lambda s: train.local_step(exp, s, *keys_3xB, False)[0].params,
                                      exp.mesh, in_specs=(jax.sharding.PartitionSpec(),),
                                      out_specs=jax.sharding.PartitionSpec()))
    params = [jax.tree.map(np.asarray, step(start.replace(step=jnp.asarray(t, jnp.int32)))) for t in steps]
    return [[jax.tree.map(operator.itemgetter(s), p) for s in (0, 1)] for p in params]

  (orchestrator_at_0, workers_at_0), at_2 = updated_sets(0.5, (0, 2))
  (orchestrator_without_at_0, workers_without_at_0), without_at_2 = updated_sets(0., (0, 2))
  moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), orchestrator_at_0, orchestrator_without_at_0)
  assert max(jax.tree.leaves(moved)) > 1e-4
  chex.assert_trees_all_close(workers_at_0, workers_without_at_0, atol=1e-7)
  chex.assert_trees_all_close(at_2, without_at_2, atol=1e-7)


def test_bad_input():
  with pytest.raises(ValueError, match=r"config.task.name='arithmetic' has no parts; tasks with parts: "
                                       r"\['multi_chain', 'wide'\]"):
    protocols.make("delegate", tasks.make("arithmetic"))
  with pytest.raises(ValueError, match=r"config.protocol.anneal='cosine' is unknown; allowed: "
                                       r"\['linear', 'never'\]"):
    protocols.make("delegate", TASK, anneal="cosine")
  with pytest.raises(ValueError, match=r"config.protocol.workers=65; allowed: an integer in 0..64 \(0: one per part\)"):
    protocols.make("delegate", TASK, workers=65)
  with pytest.raises(ValueError, match=r"config.protocol.workers=0 gives one worker per part, 65 for "
                                       r"config.task.name='multi_chain'; allowed: at most 64 workers"):
    protocols.make("delegate", tasks.make("multi_chain", num_chains=65))
  delegate = configs.sibling(str(REPO / "experiments" / "x.py"), "delegate")
  with pytest.raises(ValueError, match=r"config argument aux='half' is unknown; allowed: "
                                       r"\['annealed', 'never', 'none'\]"):
    delegate.get_config("aux=half")
  config = delegate.get_config("size=tiny")
  config.task = ml_collections.ConfigDict(dict(name="arithmetic"))
  with pytest.raises(ValueError, match=r"config.task.name='arithmetic' has no parts"):
    experiment.build(config)


def _tiny_run(workdir, arg, *flags):
  """The last metrics row of `experiments/delegate.py:size=tiny,ARG` run through the command line."""
  result = subprocess.run(
      [sys.executable, "-m", "marl_jax.main", f"--config={REPO / 'experiments' / 'delegate.py'}:size=tiny{arg}",
       f"--workdir={workdir}", *flags],
      cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(workdir / "metrics.jsonl") as f:
    return [json.loads(line) for line in f][-1]


@pytest.mark.slow
def test_tiny_run_keeps_the_frozen_workers_bit_identical(tmp_path):
  last = _tiny_run(tmp_path, "", "--config.rl.entropy_coef=0.01")  # entropy: a gradient in any case
  assert last["step"] == 4 and {"serial_collapse", "critical_steps", "eval_workers_used"} <= set(last)
  config = configs.sibling(str(REPO / "experiments" / "x.py"), "delegate").get_config("size=tiny")
  config.num_devices = 1
  exp = experiment.build(config)
  assert exp.role_set_R == (0, 1, 1) and exp.trainable_R == (True, False)
  params = {step: jax.tree.map(np.asarray, checkpoint.restore(str(tmp_path), state.abstract_state(exp),
                                                              step).params) for step in (0, 4)}
  chex.assert_trees_all_equal(*[jax.tree.map(lambda p: p[:, 1], params[s]) for s in (0, 4)])
  moved = jax.tree.map(lambda a, b: np.abs(a[:, 0] - b[:, 0]).max(), params[4], params[0])
  assert max(jax.tree.leaves(moved)) > 1e-4  # the orchestrator did learn


def test_single_baseline_is_the_delegate_task_and_model_with_one_agent():
  """workflow=single changes the workflow only: the same task (demonstration errors included), model,
  warm start and budget as the delegate run it is compared against."""
  delegate = configs.sibling(str(REPO / "experiments" / "x.py"), "delegate")
  team, alone = delegate.get_config("size=cpu"), delegate.get_config("size=cpu,workflow=single")
  assert alone.protocol.name == "single" and team.protocol.name == "delegate"
  for key in ("task", "model", "sft", "rl", "total_steps", "num_seeds", "eval_every"):
    assert alone[key] == team[key], key
  exp = experiment.build(alone)
  assert exp.role_set_R == (0,) and exp.trainable_R == (True,)


@pytest.mark.slow
def test_tiny_single_baseline_through_the_cli(tmp_path):
  last = _tiny_run(tmp_path, ",workflow=single")
  assert last["step"] == 4 and 0 <= last["eval_accuracy"] <= 1 and "agent/loss" in last
  assert not {"workers_used", "serial_collapse", "orchestrator/loss"} & set(last)
