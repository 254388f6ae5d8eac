"""The wide task (W chains answered as a list) and delegate with many workers on it: sampling and
per-part scoring by hand, bad settings, each worker's view (mask and sampler) reading only its own
slot, and difference against Shapley credit on a hand-worked three-worker case."""
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from marl_jax import model as model_lib
from marl_jax import checkpoint, configs, experiment, protocols, sampling, state, tasks, text
from marl_jax.credit import difference, shapley
from marl_jax.lm import agent as lm_agent
from marl_jax.protocols import engine

REPO = pathlib.Path(__file__).resolve().parents[1]
E = "<eos>"


def _problem(prompt: str, answer: str):
  return {"prompt": jnp.asarray(text.encode(prompt)), "answer": jnp.asarray(text.encode(answer))}


def test_sample_lists_each_chains_value_in_order():
  task = tasks.make("wide", num_chains=3, num_ops=1)
  batch = task.sample_batch(jax.random.split(jax.random.PRNGKey(0), 20))
  assert task.answer_len == 4 and task.parts == ("chain0", "chain1", "chain2")
  for b in range(20):
    chains = text.decode(batch["prompt"][b])[5:-1].split(",")
    values = [eval(c) % 10 for c in chains]  # one operation: left to right is Python's order
    assert batch["part_values"][b].tolist() == values
    assert text.decode(batch["answer"][b]) == "".join(map(str, values)) + E
    # The systematic mistake: the last chain's operation dropped (its first operand).
    assert text.decode(batch["mistake"][b]) == "".join(map(str, values[:2])) + chains[2][0] + E


def test_sixty_four_parts_answer_as_sixty_four_digits():
  task = tasks.make("wide", num_chains=64, num_ops=1)
  problem = jax.jit(task.sample)(jax.random.PRNGKey(3))
  assert task.prompt_len == 1 + 64 * 4 and task.answer_len == 65
  assert text.decode(problem["answer"]) == "".join(map(str, problem["part_values"].tolist())) + E


def test_two_digit_parts_are_written_in_fixed_width():
  task = tasks.make("wide", num_chains=2, num_ops=1, max_operand=20, modulus=100)
  assert task.part_width == 2 and task.answer_len == 5
  assert text.decode(task.answer_of_parts(jnp.array([5, 42]))) == "0542" + E


@pytest.mark.parametrize("message, parts, all_right", [
    ("480" + E, 1.0, 1.0),
    ("481" + E, 2 / 3, 0.0),  # the last part wrong
    ("080" + E, 2 / 3, 0.0),  # the first part wrong
    ("48" + E + "<pad>", 2 / 3, 0.0),  # stops early: the third part is not written
    ("4" + E + "80", 1 / 3, 0.0),  # nothing after the first EOS counts
    (E + "<pad><pad><pad>", 0.0, 0.0),
    ("4+0" + E, 2 / 3, 0.0),  # a symbol where a digit should be
])
def test_per_part_and_all_right_scores(message, parts, all_right):
  problem = _problem("<bos>3*8,2*9,0*9=", "480" + E)  # parts 4, 8, 0
  for all_right_knob, expected in ((False, parts), (True, all_right)):
    task = tasks.make("wide", num_chains=3, num_ops=1, all_right=all_right_knob)
    assert float(task.score(problem, jnp.asarray(text.encode(message)))) == pytest.approx(expected)


@pytest.mark.parametrize("knobs, error", [
    (dict(num_chains=1), r"config.task.num_chains=1; allowed: an integer in 2..64"),
    (dict(num_chains=65), r"config.task.num_chains=65; allowed: an integer in 2..64"),
    (dict(all_right="yes"), r"config.task.all_right='yes'; allowed: True or False"),
])
def test_bad_settings(knobs, error):
  with pytest.raises(ValueError, match=error):
    tasks.make("wide", **knobs)


def test_delegate_refuses_more_than_64_workers():
  task = tasks.make("wide", num_chains=4)
  with pytest.raises(ValueError, match=r"config.protocol.workers=65; allowed: an integer in 0..64"):
    protocols.make("delegate", task, workers=65)


def test_longer_chains_lengthen_the_canvas_the_model_fits():
  # ops=2: every part a two-operation chain (5 prompt tokens a part, not 3), the model's positions
  # raised to the longer canvas; a negative count is refused naming the argument.
  delegate = configs.sibling(str(REPO / "experiments" / "x.py"), "delegate")
  one, two = (delegate.get_config(f"size=tiny,task=wide,workers=2,ops={ops}") for ops in (1, 2))
  assert (one.task.num_ops, two.task.num_ops) == (1, 2)
  for config in (one, two):
    task = tasks.from_config(config)
    protocol = protocols.make("delegate", task, **{k: v for k, v in config.protocol.items() if k != "name"})
    assert config.model.max_len >= protocol.layout(task, (0,) * len(protocol.roles)).length
  assert two.model.max_len > one.model.max_len
  with pytest.raises(ValueError, match=r"config argument ops=-1; allowed: 0 \(the task's\) or a number of operations >= 1"):
    delegate.get_config("task=wide,ops=-1")


@pytest.mark.parametrize("W", [2, 16, 64])
def test_each_workers_view_reads_only_its_own_slot(W):
  task = tasks.make("wide", num_chains=W, num_ops=1)
  protocol = protocols.make("delegate", task)
  layout = protocol.layout(task, (0,) + (1,) * W)
  names = layout.segment_names
  # Markers: one per role while the eight last (W = 2), then every worker under marker 1.
  markers = {layout.marker_T[start - 1] for start, _ in layout.turn_slices[W:2 * W]}
  assert markers == ({text.role_marker(1), text.role_marker(2)} if W == 2 else {text.role_marker(1)})
  for s in range(W):
    view = layout.turn_view_N[W + s]
    own = [names.index(f"orchestrator{s}"), names.index(f"worker{s}0")]
    np.testing.assert_array_equal(np.flatnonzero(layout.visible_VxT[view]),
                                  np.flatnonzero(np.isin(layout.segment_T, own)))
  # What a worker reads is the same few positions at any W: 1 + 4 (its assignment), 1 + 2 (its report).
  assert {int(layout.visible_VxT[v].sum()) for v in layout.turn_view_N[W:2 * W]} == {8}
  # In a teacher-forced pass every worker view shares one scoring pass (they read alike).
  pass_V, _, _ = sampling.scoring_passes(layout, layout.view_set_V)
  assert len({pass_V[v] for v in layout.turn_view_N[W:2 * W]}) == 1


def _builtin_agent(layout, sets):
  cfg = model_lib.ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=layout.length)
  return cfg, model_lib.init_stack(cfg, jax.random.PRNGKey(1), sets)


def _lm_agent_in_blocks_of_five(layout, sets, monkeypatch):
  """A tiny Qwen3 fixture whose rollout cache is in blocks of 5 positions: blocks that straddle two
  slots are kept by both workers' views (`lm.model.empty_cache`), so only the mask keeps them apart."""
  monkeypatch.setattr(lm_agent, "CPU_CACHE_BLOCK", 5)
  agent = lm_agent.from_config(ml_collections.ConfigDict(dict(
      max_len=layout.length, dtype="float32", checkpoint=str(REPO / "tests" / "fixtures" / "lm" / "qwen3"),
      random_weights=True, remat=False, lora=dict(enabled=False))))
  return agent, model_lib.init_stack(agent, jax.random.PRNGKey(1), sets)


@pytest.mark.slow  # two compiled samplers each: the fast tier stays under 4 minutes
@pytest.mark.parametrize("agent", [_builtin_agent, _lm_agent_in_blocks_of_five])
def test_a_worker_never_reads_another_slot_when_sampling(agent, monkeypatch):
  """Changing slot 1's assignment changes worker 1's report distribution but not worker 0's, nor
  worker 2's, under the real sampler (a random model, the orchestrator's turns forced)."""
  W = 3
  task = tasks.make("wide", num_chains=W, num_ops=1)
  protocol = protocols.make("delegate", task)
  layout = protocol.layout(task, (0, 1, 2, 3))  # a set per slot: each worker its own weights
  if agent is _builtin_agent:
    cfg, params_R = agent(layout, 4)
  else:
    cfg, params_R = agent(layout, 4, monkeypatch)
    # Worker 0's kept blocks hold positions of other slots (so this checks the mask, not the blocks).
    own_T = layout.visible_VxT[layout.turn_view_N[W]]
    others_T = np.isin(layout.segment_T, [layout.segment_names.index(f"orchestrator{s}") for s in (1, 2)])
    assert np.isin(np.flatnonzero(others_T) // 5, np.flatnonzero(own_T) // 5).any()
  prompt_1xP = jnp.asarray([text.encode("<bos>3*8,2*9,0*9=")])

  def canvas(assignment1):
    pad = lambda msg, n: jnp.asarray([text.encode(msg) + [text.PAD] * (n - len(text.encode(msg)))])
    assignments = [pad(m, 4) for m in ("3*8" + E, assignment1, "0*9" + E)]
    return engine.assemble(layout, prompt_1xP, assignments + [None] * (W + 1))

  force_1xT = jnp.asarray(np.isin(layout.turn_T, range(W)) | (layout.turn_T < 0))[None]  # prompt, assignments
  run = jax.jit(lambda c: sampling.generate(cfg, layout, params_R, c, force_1xT, jax.random.PRNGKey(0)[None], 1.0))
  (tokens_a, logp_a, _), (tokens_b, logp_b, _) = run(canvas("2*9" + E)), run(canvas("7+7" + E))
  for s, same in ((0, True), (1, False), (2, True)):
    start, stop = layout.turn_slices[W + s]
    assert np.array_equal(logp_a[:, start:stop], logp_b[:, start:stop]) == same, s
    if same:
      np.testing.assert_array_equal(tokens_a[:, start:stop], tokens_b[:, start:stop])


@pytest.mark.slow  # a compiled sampler and two scoring programs each: the fast tier stays under 4 minutes
@pytest.mark.parametrize("agent", [_builtin_agent, _lm_agent_in_blocks_of_five])
def test_workers_scored_gathered_get_the_whole_canvas_log_probs(agent, monkeypatch):
  """The workers' scoring pass reads each worker's own positions gathered (`sampling.gathered_passes`);
  its log-probs are those of the whole-canvas pass, and those the sampler drew with (the LM agent's
  rotary positions included)."""
  W = 8
  task = tasks.make("wide", num_chains=W, num_ops=1)
  layout = protocols.make("delegate", task).layout(task, (0,) + (1,) * W)
  cfg, params_R = agent(layout, 2) if agent is _builtin_agent else agent(layout, 2, monkeypatch)
  pass_V, _, first_view_P = sampling.scoring_passes(layout, layout.view_set_V)
  assert sampling.gathered_passes(cfg, layout, pass_V, first_view_P).tolist() == [False, True]
  problems = task.sample_batch(jax.random.split(jax.random.PRNGKey(0), 4))
  canvas_BxT = engine.assemble(layout, problems["prompt"], [None] * len(layout.turn_slices))
  tokens_BxT, logp_BxT, sampled_BxT = jax.jit(lambda c: sampling.generate(
      cfg, layout, params_R, c, jnp.zeros(c.shape, bool), jax.random.split(jax.random.PRNGKey(1), 4), 1.0))(canvas_BxT)
  score = lambda: jax.jit(lambda t: sampling.written_log_probs(cfg, layout, params_R, t, 1.0)[1])(tokens_BxT)
  gathered_NxBxV = score()
  monkeypatch.setattr(sampling, "gathered_passes", lambda *args: np.zeros(len(args[3]), bool))
  whole_NxBxV = score()  # traced again, every pass whole
  assert np.abs(np.asarray(gathered_NxBxV - whole_NxBxV)).max() > 0  # two programs, two roundings
  np.testing.assert_allclose(gathered_NxBxV, whole_NxBxV, atol=1e-5)
  targets_N = sampling.author_readouts(layout, pass_V)[0]
  forced_logp_BxT, _ = sampling.sampled_log_probs(targets_N, gathered_NxBxV, tokens_BxT)
  np.testing.assert_allclose(np.asarray(forced_logp_BxT)[np.asarray(sampled_BxT)],
                             np.asarray(logp_BxT)[np.asarray(sampled_BxT)], atol=1e-4)


@pytest.mark.slow  # several compiled programs: the fast tier stays under 4 minutes
def test_difference_and_shapley_credit_on_three_workers():
  """Three workers on '3*8,2*9,0*9=' (parts 4, 8, 0), each given its chain; a worker left out reports
  `<absent>` and the orchestrator copies the reports it has, writing 0 for a missing one.  Workers 0
  and 1 report right (4, 8); worker 2 reports 0, right, but the orchestrator's 0 for a missing
  report is right as well, so worker 2 adds nothing.

  Per part (the fraction right) the game is additive: v(S) = (|S & {0, 1}|  + 1) / 3, and
  difference credit equals Shapley: (1/3, 1/3, 0).
  All right: v(S) = 1 when S holds workers 0 and 1, else 0.  Difference credit gives each of them
  the whole outcome, (1, 1, 0), summing to 2; Shapley splits it, (1/2, 1/2, 0), summing to
  v(all) - v(none) = 1."""
  W = 3
  values_W = jnp.array([4, 8, 0])
  expected = {False: ([1 / 3, 1 / 3, 0], [1 / 3, 1 / 3, 0]), True: ([1, 1, 0], [.5, .5, 0])}
  for all_right, (difference_W, shapley_W) in expected.items():
    task = tasks.make("wide", num_chains=W, num_ops=1, all_right=all_right)
    protocol = protocols.make("delegate", task)
    layout = protocol.layout(task, (0, 1, 1, 1))
    problems = {"prompt": jnp.asarray([text.encode("<bos>3*8,2*9,0*9=")]),
                "answer": jnp.asarray([text.encode("480" + E)]), "part_values": values_W[None],
                "part_mistakes": jnp.array([[3, 2, 0]])}
    pad = lambda msg, n: jnp.asarray(text.encode(msg) + [text.PAD] * (n - len(text.encode(msg))))
    assignments = [pad(c + E, 4)[None] for c in ("3*8", "2*9", "0*9")]
    absent_1x2 = pad("<absent>" + E, 2)[None]

    def team_outcome(present_W):
      reports = [jnp.where(present_W[s], pad(f"{int(values_W[s])}" + E, 2)[None], absent_1x2) for s in range(W)]
      final_1xA = task.answer_of_parts(jnp.where(present_W, values_W, 0))[None]
      tokens_1xT = engine.assemble(layout, problems["prompt"], assignments + reports + [final_1xA])
      return protocol.rewards(task, layout, problems, tokens_1xT).team_B[0]

    np.testing.assert_allclose(difference.difference_rewards(team_outcome, W), difference_W, atol=1e-6)
    np.testing.assert_allclose(shapley.shapley_values(team_outcome, W), shapley_W, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("W, worker_sets, role_set_R", [
    (2, "per_slot", (0, 1, 2)),
    (16, "4", (0,) + (1,) * 4 + (2,) * 4 + (3,) * 4 + (4,) * 4),
])
def test_tiny_wide_run_trains_every_worker_set_through_the_cli(tmp_path, W, worker_sets, role_set_R):
  arg = f"task=wide,workers={W},worker_sets={worker_sets}"
  result = subprocess.run(
      [sys.executable, "-m", "marl_jax.main", f"--config={REPO / 'experiments' / 'delegate.py'}:size=tiny,{arg}",
       f"--workdir={tmp_path}", "--config.rl.entropy_coef=0.01"],  # entropy: a gradient in any case
      cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=1800)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "metrics.jsonl") as f:
    last = [json.loads(line) for line in f][-1]
  assert last["step"] == 4 and {f"worker{W - 1}/member_accuracy", "eval_accuracy", "coverage"} <= set(last)
  config = configs.sibling(str(REPO / "experiments" / "x.py"), "delegate").get_config(f"size=tiny,{arg}")
  config.num_devices = 1
  exp = experiment.build(config)
  assert exp.role_set_R == role_set_R and all(exp.trainable_R)
  params = {step: jax.tree.map(np.asarray, checkpoint.restore(str(tmp_path), state.abstract_state(exp),
                                                              step).params) for step in (0, 4)}
  moved_S = np.max([np.abs(a - b).reshape(a.shape[0], a.shape[1], -1).max(-1)
                    for a, b in zip(jax.tree.leaves(params[4]), jax.tree.leaves(params[0]))], axis=0)
  assert np.all(moved_S > 1e-5), moved_S  # every set, the workers' included, learned (per seed)


@pytest.mark.slow  # a warm start and two cells at the tiny size
def test_the_credit_study_runs_trained_and_frozen_workers_from_one_warm_start_and_resumes(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "SIZE": "tiny", "WORKERS": "2", "CREDITS": "per_role", "SEEDS": "0",
         "TARGET": "5"}
  study = lambda: subprocess.run(["bash", "scripts/wide_credit_results.sh", str(tmp_path)], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=1200)
  done = study()
  assert done.returncode == 0, done.stderr[-3000:]
  W2 = tmp_path / "seed0" / "W2"
  assert sorted(p.name for p in W2.iterdir()) == ["base", "per_role_frozen", "per_role_trained"]
  for cell, trainable in (("per_role_trained", "1,1"), ("per_role_frozen", "1,0")):
    config = json.loads((W2 / cell / "config.json").read_text())
    assert config["init_from"] == f"{W2}/base" and config["credit"]["name"] == "per_role"
    assert config["task"]["name"] == "wide" and config["roles"]["trainable"] == trainable
    assert config["task"]["num_ops"] == 2  # one-operation parts leave the warm-started workers nothing to learn
  assert "## seeds 0.., W = 2" in done.stdout and f"B = {W2}/per_role_trained" in done.stdout
  assert "| steps_to_target" in done.stdout  # TARGET: the steps each seed took to 5 %
  rows = (W2 / "per_role_trained" / "metrics.jsonl").read_text()
  assert study().returncode == 0 and (W2 / "per_role_trained" / "metrics.jsonl").read_text() == rows
