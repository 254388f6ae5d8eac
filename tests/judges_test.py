"""Judges whose verdicts carry their evidence: the expected statement of a distribution over levels, the
proper scores that teach it, the levels read off the policy, the judge loss in the update (only the
judges' sets, nothing at weight 0), planted answers whose truth is the task's construction, and every
new setting refused where it cannot work and run through the command line."""
import re

import chex
from workflows_test import _cli_rows
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from marl_jax import experiment, losses, parallel, rewards, rollout, sampling, text, train, update
from marl_jax.protocols import engine
from marl_jax.rewards import replay as replay_lib
from rewards_test import _config
from train_test import compiled_init_state

LEVELS = (0.0, 1 / 3, 2 / 3, 1.0)


def test_the_expected_level_of_a_hand_built_distribution():
  # p = (0.1, 0.2, 0.3, 0.4) over the levels 0, 1/3, 2/3, 1: 0.2/3 + 0.6/3 + 0.4 = 2/3.  A judge sure of
  # level 0 puts 0 on right, one sure of level 3 puts 1.
  logp_2xL = jnp.log(jnp.array([[0.1, 0.2, 0.3, 0.4], [1.0, 1e-30, 1e-30, 1e-30]]))
  np.testing.assert_allclose(engine.expected_level(logp_2xL, LEVELS), [2 / 3, 0.0], atol=1e-6)
  judgments = engine.Judgments(level_JxKxB=jnp.zeros((1, 1, 2), jnp.int32), truth_KxB=jnp.zeros((1, 2)),
                               levels=LEVELS, answer_roles=(0,), level_logp_JxKxBxL=logp_2xL[None, None])
  np.testing.assert_allclose(judgments.expected_JxKxB, [[[2 / 3, 0.0]]], atol=1e-6)


@pytest.mark.parametrize("loss", ["brier", "log"])
def test_the_judge_losses_are_least_in_expectation_at_the_true_probability(loss):
  # By hand at p = 1/2: Brier (1/2 - 1)^2 = (1/2 - 0)^2 = 1/4; log -log(1/2) = log 2 whatever the label.
  score = losses.JUDGE_LOSSES[loss]
  np.testing.assert_allclose([score(0.5, 1.0), score(0.5, 0.0)], [0.25, 0.25] if loss == "brier" else [np.log(2)] * 2,
                             rtol=1e-6)
  # An answer right with probability q = 0.3: the expected loss q L(p, 1) + (1 - q) L(p, 0) over a grid
  # of stated p is least at p = q (Brier: q (1 - q) + (p - q)^2 = 0.21 there).
  p_P = jnp.linspace(0.01, 0.99, 99)
  expected_P = 0.3 * score(p_P, 1.0) + 0.7 * score(p_P, 0.0)
  np.testing.assert_allclose(p_P[jnp.argmin(expected_P)], 0.3, atol=1e-6)
  if loss == "brier":
    np.testing.assert_allclose(expected_P.min(), 0.21, rtol=1e-5)
  assert np.isfinite(score(jnp.array([0.0, 1.0]), jnp.array([1.0, 0.0]))).all()  # certain and wrong: finite


def _peer_review(arg="size=tiny,pay=audited_balanced,audit_rate=0.5", **reward):
  config = _config("peer_review", arg)
  config.reward.update(reward)
  return experiment.build(config)


def test_the_levels_are_the_judges_policy_at_its_verdict_position_renormalised():
  # Each judge's log-probs of its levels: the difference between two levels' is the difference between
  # the teacher-forced log-probs of the canvas with either digit written there (an independent path,
  # `token_log_probs`), and they sum to 1 over the levels.
  exp = _peer_review()
  params_R = compiled_init_state(exp, jax.random.PRNGKey(0)).params
  problems = exp.task.sample_batch(jax.random.split(jax.random.PRNGKey(1), 4))
  tokens_BxT = jax.jit(lambda p, k: rollout.sample(exp, params_R, p, k).tokens_BxT)(
      problems, jax.random.split(jax.random.PRNGKey(2), 4))
  readout = exp.protocol.verdict_readout(exp.layout)
  temperature = exp.config.rl.temperature
  level_logp_JxKxBxL = jax.jit(lambda t: sampling.level_log_probs(exp.model, exp.layout, readout, params_R, t,
                                                                  temperature))(tokens_BxT)
  assert level_logp_JxKxBxL.shape == (2, 1, 4, 4)
  np.testing.assert_allclose(jnp.exp(level_logp_JxKxBxL).sum(-1), 1.0, rtol=1e-5)
  token_logp = jax.jit(lambda t: sampling.token_log_probs(exp.model, exp.layout, params_R, t, temperature)[0])
  for j in range(2):
    t = int(readout.position_JxK[j, 0])
    writing = lambda d: token_logp(tokens_BxT.at[:, t].set(text.DIGIT0 + d))[:, t]
    np.testing.assert_allclose(level_logp_JxKxBxL[j, 0, :, 3] - level_logp_JxKxBxL[j, 0, :, 1],
                               writing(3) - writing(1), rtol=1e-4, atol=1e-5)


def test_the_judge_loss_by_hand():
  # Two judges, two rows, one answer each; row 0 labelled right, row 1 unlabelled (weight 0).  Judge 0
  # puts (1/2, 0, 0, 1/2) on the levels of row 0: probability 1/2 on right, Brier (1/2 - 1)^2 = 1/4;
  # judge 1 puts all on level 2: 2/3, (2/3 - 1)^2 = 1/9.  Row 1 counts for nothing; the solver gets 0.
  exp = _peer_review(judge_loss="brier")
  tiny = 1e-30
  p_JxKxBxL = jnp.array([[[[0.5, tiny, tiny, 0.5], [0.25] * 4]], [[[tiny, tiny, 1.0, tiny], [0.25] * 4]]])
  mb = update.Batch(tokens_BxT=None, old_logp_BxT=None, ref_logp_BxT=None, adv_BxT=None, role_mask_BxRxT=None,
                    group_B=None, judge_weight_BxK=jnp.array([[1.0], [0.0]]), judge_label_BxK=jnp.array([[1.0], [0.0]]))
  loss_R = update.judge_losses(exp, jnp.log(p_JxKxBxL), mb, label_count=1.0)  # one labelled answer
  np.testing.assert_allclose(loss_R, [0.0, 0.25, 1 / 9], rtol=1e-5)
  # Weighted 3 (a rare class's label), the answer counts three times over its count of one: a minibatch's
  # loss is over how many answers are labelled, not over their weights, so the class weights hold.
  heavy = mb.replace(judge_weight_BxK=jnp.array([[3.0], [0.0]]))
  np.testing.assert_allclose(update.judge_losses(exp, jnp.log(p_JxKxBxL), heavy, label_count=1.0), [0.0, 0.75, 1 / 3],
                             rtol=1e-5)
  count = jax.jit(parallel.shard_map(lambda mb: update.label_count(mb, 1), parallel.make_mesh(1), in_specs=(P(),),
                                     out_specs=P()))
  assert count(heavy) == 1


def test_a_balanced_rule_weighs_the_judge_loss_by_class_so_its_reading_at_the_base_rate_applies_once():
  # audited_balanced at base rate 1/4 (counts 1 right, 3 wrong): a right answer weighs 1 / (2 * 1/4) = 2,
  # a wrong one 1 / (2 * 3/4) = 2/3; the plain rules weigh every labelled answer 1.
  label_A = jnp.array([1.0, 0.0])
  balanced = rewards.make("audited_balanced", source="peer", audit_rate=0.1)
  np.testing.assert_allclose(balanced.label_weight(jnp.array([1.0, 3.0]), label_A), [2.0, 2 / 3], rtol=1e-6)
  np.testing.assert_allclose(rewards.make("audited", source="peer", audit_rate=0.1).label_weight((), label_A), [1.0, 1.0])
  # A judge that believes right with probability q = 1/4 (the base rate) minimises the weighted Brier loss
  # 2 q (p - 1)^2 + (2/3)(1 - q) p^2 at p = 1/2: even prior odds.
  p_P = jnp.linspace(0.0, 1.0, 101)
  weighted_P = 2 * 0.25 * losses.brier_loss(p_P, 1.0) + (2 / 3) * 0.75 * losses.brier_loss(p_P, 0.0)
  np.testing.assert_allclose(p_P[jnp.argmin(weighted_P)], 0.5, atol=1e-6)


def _one_step(exp, start, keys_3xB):
  return jax.jit(parallel.shard_map(lambda s: train.local_step(exp, s, *keys_3xB, False), exp.mesh,
                                    in_specs=(P(),), out_specs=P()))(start)


@pytest.mark.slow  # three compiled training steps
def test_the_judge_loss_trains_the_judges_alone_and_at_weight_0_changes_nothing():
  # One step of the same episodes: with judge_loss=brier at weight 0 the state is bit-identical to the
  # policy gradient alone (judge_loss=none); at weight 1 the judges' set moves and the solver's set
  # (its own, sharing=judges) is bit-identical, so the loss reaches the judges alone.
  build = lambda **reward: _peer_review("size=tiny,pay=audited_balanced,audit_rate=0.5", **reward)
  plain = build()
  start = compiled_init_state(plain, jax.random.PRNGKey(0))
  B = plain.config.rl.batch_size
  keys_3xB = jax.random.split(jax.random.PRNGKey(1), 3 * B).reshape(3, B, -1)
  as_np = lambda tree: jax.tree.map(np.asarray, tree)
  plain_state, _ = _one_step(plain, start, keys_3xB)
  zero_state, _ = _one_step(build(judge_loss="brier", judge_weight=0.0), start, keys_3xB)
  chex.assert_trees_all_equal(as_np(plain_state.params), as_np(zero_state.params))
  judged_state, metrics = _one_step(build(judge_loss="brier"), start, keys_3xB)
  solver_set, judge_set = plain.role_set_R[0], plain.role_set_R[1]
  take = lambda params, s: as_np(jax.tree.map(lambda x: x[s], params))
  chex.assert_trees_all_equal(take(plain_state.params, solver_set), take(judged_state.params, solver_set))
  moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), take(plain_state.params, judge_set),
                       take(judged_state.params, judge_set))
  assert max(jax.tree.leaves(moved)) > 0
  assert metrics["judge0/judge_loss"] > 0 and metrics["solver/judge_loss"] == 0


def test_the_replay_writes_labelled_episodes_in_row_order_and_draws_only_those_written():
  tokens = lambda *rows: jnp.asarray([[r] * 3 for r in rows], jnp.int32)  # row r's transcript: r r r
  labelled = lambda weight_B, label_B: rewards.Labels(weight_BxK=jnp.asarray(weight_B, jnp.float32)[:, None],
                                                      label_BxK=jnp.asarray(label_B, jnp.float32)[:, None])
  empty = replay_lib.init(4, 3, 1)
  _, none = replay_lib.draw(empty, jax.random.PRNGKey(0), 5)
  assert np.all(none.weight_BxK == 0)  # nothing written: nothing reaches the loss
  # Rows 7 and 9 are labelled (weight 2 and 1, labels 1 and 0), row 8 is not: slots 0 and 1.
  replay = replay_lib.write(empty, tokens(7, 8, 9), labelled([2, 0, 1], [1, 0, 0]))
  assert int(replay.written) == 2
  np.testing.assert_array_equal(replay.tokens_NxT[:2, 0], [7, 9])
  np.testing.assert_array_equal(replay.weight_NxK[:, 0], [2, 1, 0, 0])
  np.testing.assert_array_equal(replay.label_NxK[:, 0], [1, 0, 0, 0])
  tokens_BxT, drawn = replay_lib.draw(replay, jax.random.PRNGKey(1), 64)
  assert set(np.asarray(tokens_BxT[:, 0]).tolist()) == {7, 9}  # only the written slots, both of them
  np.testing.assert_array_equal(drawn.weight_BxK[:, 0], np.where(tokens_BxT[:, 0] == 7, 2, 1))
  # Three more labelled rows: slots 2, 3 and 0 (the oldest, row 7's, overwritten).
  replay = replay_lib.write(replay, tokens(4, 5, 6), labelled([1, 1, 1], [0, 1, 1]))
  assert int(replay.written) == 5
  np.testing.assert_array_equal(replay.tokens_NxT[:, 0], [6, 9, 4, 5])
  np.testing.assert_array_equal(replay.label_NxK[:, 0], [1, 0, 0, 1])


@pytest.mark.slow  # four compiled training steps
def test_replayed_labels_teach_the_judges_alone():
  # Two steps from the same state and keys, with and without a replay: the first step draws from an
  # empty replay (so both runs agree), then writes the step's labelled episodes; the second draws them
  # again, which moves the judges' set and leaves the solver's as it is.  SGD, whose update is linear in
  # the gradient: Adam's first step is the gradient's sign, so float rounding of a gradient near 0
  # (replayed rows change the sums' lengths) would move a parameter by the whole learning rate.
  def build(**reward):
    config = _config("peer_review", "size=tiny,pay=audited_balanced,audit_rate=0.5")
    config.reward.update(verdict="expected", judge_loss="brier", judge_pg=False, **reward)
    config.optim.update(name="sgd", learning_rate=0.1)
    return experiment.build(config)
  plain, replaying = build(), build(replay=64, replay_rows=8)
  B = plain.config.rl.batch_size
  keys_3xB = jax.random.split(jax.random.PRNGKey(1), 3 * B).reshape(3, B, -1)
  as_np = lambda tree: jax.tree.map(np.asarray, tree)
  solver_set, judge_set = plain.role_set_R[0], plain.role_set_R[1]
  take = lambda params, s: as_np(jax.tree.map(lambda x: x[s], params))
  plain_state, replay_state = compiled_init_state(plain, jax.random.PRNGKey(0)), compiled_init_state(replaying, jax.random.PRNGKey(0))
  for step in range(2):
    plain_state, _ = _one_step(plain, plain_state, keys_3xB)
    replay_state, metrics = _one_step(replaying, replay_state, keys_3xB)
    if step == 0:
      chex.assert_trees_all_close(as_np(plain_state.params), as_np(replay_state.params), atol=1e-6)
      written = int(replay_state.replay.written)
      assert written == round(float(metrics["labels_per_episode"]) * B) > 0
  chex.assert_trees_all_close(take(plain_state.params, solver_set), take(replay_state.params, solver_set), atol=1e-6)
  moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), take(plain_state.params, judge_set),
                       take(replay_state.params, judge_set))
  assert max(jax.tree.leaves(moved)) > 1e-4


def test_planted_answers_are_the_reference_or_a_corruption_by_construction():
  exp = _peer_review("size=tiny,pay=audited_balanced,audit_rate=0", plant_rate=0.5)
  B = 8
  problems = exp.task.sample_batch(jax.random.split(jax.random.PRNGKey(1), B))
  plants = rewards.Plants(planted_B=jnp.arange(B) < 6, truth_BxK=(jnp.arange(B) % 2 == 0)[:, None].astype(jnp.float32))
  key_B = jax.random.split(jax.random.PRNGKey(2), B)
  params_R = compiled_init_state(exp, jax.random.PRNGKey(0)).params
  episodes = jax.jit(lambda p, k, planted: rollout.sample(exp, params_R, p, k, plants=planted))(problems, key_B, plants)
  answer_BxA = engine.message(exp.layout, episodes.tokens_BxT, 0)
  start, stop = exp.layout.turn_slices[0]
  for b in range(6):  # planted: never sampled; the reference where its truth is 1, a task's mistake else
    assert not episodes.sampled_BxT[b, start:stop].any()
    if b % 2 == 0:
      np.testing.assert_array_equal(answer_BxA[b], problems["answer"][b])
    else:
      assert exp.task.score(jax.tree.map(lambda x: x[b], problems), answer_BxA[b]) == 0
  assert episodes.sampled_BxT[6:, start].all()  # the others are the solver's own
  # The labels are the plants' truth on planted episodes, the checker's on audited ones only.
  labelled_KxB, label_KxB = rewards.labels(exp.reward, jnp.zeros((1, B)), jnp.zeros(B, bool), plants)
  np.testing.assert_array_equal(labelled_KxB[0], np.arange(B) < 6)
  np.testing.assert_array_equal(label_KxB[0], (np.arange(B) < 6) & (np.arange(B) % 2 == 0))


@pytest.mark.parametrize("experiment_name, arg, reward, message", [
    ("peer_review", "pay=audited", {"verdict": "mean"}, "config.reward.verdict='mean' is unknown; allowed: ['sampled', 'expected']"),
    ("peer_review", "pay=audited", {"judge_loss": "hinge"}, "config.reward.judge_loss='hinge' is unknown; allowed: ['none', 'brier', 'log']"),
    ("peer_review", "pay=audited", {"judge_weight": -1.0}, "config.reward.judge_weight=-1.0; allowed: a number >= 0"),
    ("peer_review", "pay=audited", {"plant_rate": 2.0}, "config.reward.plant_rate=2.0; allowed: a probability in [0, 1]"),
    ("peer_review", "pay=audited", {"judge_pg": False}, "config.reward.judge_pg=False leaves the judges no loss at all"),
    ("peer_review", "pay=team,audit_rate=0", {"judge_loss": "brier"}, "config.reward.judge_loss='brier' learns from labelled answers"),
    ("peer_review", "source=checker", {"verdict": "expected"}, "config.reward.verdict='expected' acts only with config.reward.source='peer'"),
    ("peer_review", "pay=audited", {"replay": 64}, "config.reward.replay=64 with config.reward.replay_rows=0"),
    ("peer_review", "pay=audited", {"replay": 64, "replay_rows": 8}, "config.reward.replay=64 replays labels for the judge loss, and there is none"),
    ("peer_review", "pay=audited", {"replay": 4, "replay_rows": 2, "judge_loss": "brier"},
     "config.reward.replay=4 holds fewer episodes than one step writes at most (config.rl.batch_size=32); allowed: >= 32"),
    ("debate", "task=subset_sum,scorer=verifier", {"source": "peer", "verdict": "expected"},
     "config.reward.verdict='expected' reads each judge's level as one token at a fixed position, which this workflow's judges do not write"),
])
def test_bad_judge_settings_are_refused_naming_the_key(experiment_name, arg, reward, message):
  config = _config(experiment_name, f"size=tiny,{arg}")
  config.reward.update(reward)
  with pytest.raises(ValueError, match=re.escape(message)):
    experiment.build(config)


def test_replayed_rows_split_into_the_minibatches():
  config = _config("peer_review", "size=tiny,pay=audited")
  config.reward.update(judge_loss="brier", replay=64, replay_rows=3)
  config.rl.minibatches = 2
  with pytest.raises(ValueError, match=re.escape("config.reward.replay_rows=3 does not split into config.rl.minibatches=2; "
                                                 "allowed: its multiples")):
    experiment.build(config)


def test_the_judges_width_and_learning_rate_are_their_parameter_sets_own():
  config = _config("peer_review", "size=tiny,judges=3,judge_width=32,judge_lr=0.1")
  assert (config.roles.sharing, config.roles.models, config.roles.lr_scale) == ("0,1,1,1", "model,judge", "1,0.1")
  assert config.models.judge.d_model == 32
  assert _config("peer_review", "size=tiny,sharing=isolated,judge_lr=0.5").roles.lr_scale == "1,0.5,0.5"
  for arg in ("judge_lr=0.1", "judge_width=32"):
    with pytest.raises(ValueError, match=f"config argument {arg.split('=')[0]} sets the judges' parameter sets apart"):
      _config("peer_review", f"size=tiny,sharing=shared,{arg}")


@pytest.mark.slow
@pytest.mark.parametrize("arg", ["peer_review.py:size=tiny,pay=audited_balanced,verdict=expected,judge_loss=brier",
                                 "peer_review.py:size=tiny,pay=audited_balanced,audit_rate=0,plant_rate=0.25,"
                                 "verdict=expected,judge_loss=log,judge_pg=false",
                                 "peer_review.py:size=tiny,pay=audited_balanced,verdict=expected,judge_loss=brier,"
                                 "judge_pg=false,replay=64",
                                 "solver_verifier.py:size=tiny,judge_loss=brier,credit=per_role,verifier_signal=final"])
def test_judges_read_by_probability_and_taught_by_a_proper_score_train_through_the_cli(tmp_path, arg):
  rows = _cli_rows(tmp_path, arg)
  trained, evaluated = [r for r in rows if "verifier/judge_loss" in r or "judge0/judge_loss" in r], \
      [r for r in rows if "eval_accuracy" in r]
  assert rows[-1]["step"] == 4 and len(trained) == 2
  judge = "verifier" if arg.startswith("solver") else "judge0"
  assert all(r[f"{judge}/judge_loss"] > 0 for r in trained)
  if judge == "judge0":
    for name in ("auroc", "auroc_greedy", "auroc_expected", "expected"):
      assert f"judge1/{name}" in trained[-1] and f"eval_judge1/{name}" in evaluated[-1], name
    assert "eval_judge0/auroc_sampled" in evaluated[-1]
    assert 0 < trained[-1]["labels_per_episode"]
