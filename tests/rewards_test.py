"""Rewards from peers: every payment rule against a case worked out by hand, the audit draw, the stage
(audits, penalty, what reaches the loss), the refusals, and a training step in which, without audits,
the checker's verdicts cannot change the update."""
import dataclasses
import functools
import pathlib
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from marl_jax import cli, codes, configs, credit, experiment, judging, loop, parallel, protocols, rewards, state, tasks, text, train
from marl_jax.protocols import engine
from marl_jax.rewards import audited, audited_balanced, audited_team, peer_prediction, reputation
from train_test import compiled_init_state
from workflows_test import _cli_rows, compiled_demonstrate, compiled_rewards

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"
LEVELS = (0.0, 1 / 3, 2 / 3, 1.0)


def _reviewed(level_JxA, audited_A, truth_A, levels=LEVELS):
  audited_A, truth_A = jnp.asarray(audited_A), jnp.asarray(truth_A, jnp.float32)
  return rewards.Reviewed(level_JxA=jnp.asarray(level_JxA), labelled_A=audited_A,
                          label_A=jnp.where(audited_A, truth_A, 0.0), levels=levels)


def _judgments(level_JxB, truth_B, levels=LEVELS):
  """One judged answer per episode (the solver's)."""
  return engine.Judgments(level_JxKxB=jnp.asarray(level_JxB)[:, None], truth_KxB=jnp.asarray(truth_B, jnp.float32)[None],
                          levels=levels, answer_roles=(0,))


def _peer(pay, **settings):
  return rewards.make(pay, source="peer", **settings)


@pytest.mark.parametrize("pay", sorted(rewards.REGISTRY))
def test_every_payment_rule_keeps_the_contract(pay):
  # Three judges, 16 episodes, half audited: the shapes, finite values and a state that keeps its shape.
  rule = _peer(pay, audit_rate=0.5)
  J, B = 3, 16
  level_JxB = jax.random.randint(jax.random.key(0), (J, B), 0, len(LEVELS))
  judgments = _judgments(level_JxB, jnp.arange(B) % 3 == 0)
  state0 = rule.init(J)
  judged_KxB, pay_JxB, state1, metrics = jax.jit(lambda s: rewards.settle(rule, s, judgments, jnp.arange(B) % 2 == 0))(state0)
  assert judged_KxB.shape == (1, B) and pay_JxB.shape == (J, B)
  chex.assert_tree_all_finite((judged_KxB, pay_JxB, state1))
  chex.assert_trees_all_equal_shapes(state0, state1)
  assert all(jnp.ndim(v) == 0 or jnp.shape(v) == (J,) for v in metrics.values())
  with pytest.raises(dataclasses.FrozenInstanceError):
    rule.audit_rate = 0.2


def test_the_docs_list_every_payment_rules_settings_and_show_team_whole():
  page = (EXPERIMENTS.parent / "docs" / "peer_review.md").read_text()
  knobs = {pay: rewards.knobs(pay) for pay in sorted(rewards.REGISTRY)}
  shared = {key: value for key, value in knobs["team"].items() if all(key in k for k in knobs.values())}
  listed = lambda settings: ", ".join(f"`{key}={value}`" for key, value in settings.items())
  assert f"\n| every rule | {listed(shared)} |\n" in page
  without = []
  for pay, settings in knobs.items():
    own = {key: value for key, value in settings.items() if key not in shared}
    if own:
      assert f"\n| `{pay}` | {listed(own)} |\n" in page, pay
    else:
      without.append(f"`{pay}`")
  assert f"\n| {', '.join(without)} | none of their own |\n" in page
  assert "```{literalinclude} ../marl_jax/rewards/team.py\n" in page


def test_team_pays_every_judge_the_judged_reward():
  # Two judges state 1 and 1/3 (mean 2/3), then 0 and 0 (mean 0); the second episode is audited, right.
  rule = _peer("team", audit_rate=0.5)
  judged_KxB, pay_JxB, _, _ = rewards.settle(rule, (), _judgments([[3, 0], [1, 0]], [0, 1]), jnp.array([False, True]))
  np.testing.assert_allclose(judged_KxB, [[2 / 3, 1.0]], rtol=1e-6)
  np.testing.assert_allclose(pay_JxB, [[2 / 3, 1.0], [2 / 3, 1.0]], rtol=1e-6)


def test_the_stage_rewards_audited_episodes_by_the_checker_and_charges_caught_accepts():
  # One judge; episodes: accepted wrong (audited: caught), accepted wrong (not audited: paid its 1),
  # rejected right (audited: the truth, 1), stated 2/3 of a right answer (not audited: 2/3).
  rule = _peer("audited", audit_rate=0.5, penalty=0.5)
  judgments = _judgments([[3, 3, 0, 2]], [0, 0, 1, 1])
  judged_KxB, pay_JxB, _, metrics = rewards.settle(rule, (), judgments, jnp.array([True, False, True, False]))
  np.testing.assert_allclose(judged_KxB, [[-0.5, 1.0, 1.0, 2 / 3]], rtol=1e-6)
  # The judge: the Brier score on audited episodes, 1 - (1 - 0)^2 and 1 - (0 - 1)^2; nothing elsewhere.
  np.testing.assert_allclose(pay_JxB, [[0.0, 0.0, 0.0, 0.0]], atol=1e-7)
  np.testing.assert_allclose(metrics["labels_per_episode"], 0.5)
  np.testing.assert_allclose(metrics["true_accuracy"], 0.5)
  np.testing.assert_allclose(metrics["reported_accuracy"], (1 + 1 + 0 + 2 / 3) / 4, rtol=1e-6)
  np.testing.assert_allclose(metrics["distortion"], (1 + 1 + 0 + 2 / 3) / 4 - 0.5, rtol=1e-6)
  np.testing.assert_allclose(metrics["false_accept"], [1.0])  # both wrong answers accepted
  np.testing.assert_allclose(metrics["false_reject"], [0.5])  # one of the two right ones rejected


def test_each_judged_answer_pays_its_role_and_the_team_gets_their_mean():
  # Best-of-n's shape: a judge picks one of two candidates (levels 0 and 1).  Episode 0 picks candidate
  # 1 (wrong; candidate 0 is right), episode 1 candidate 0 (both right).
  judgments = engine.Judgments(level_JxKxB=jnp.array([[[0, 1], [1, 0]]]), truth_KxB=jnp.array([[1.0, 1.0], [0.0, 1.0]]),
                               levels=(0.0, 1.0), answer_roles=(0, 1))
  # Without audits, through the stage: each solver is paid for being picked; the team outcome and the
  # judge (team pay) the mean over the two candidates.
  roles, judge_roles = ("solver0", "solver1", "judge"), (2,)
  outcome = credit.Outcome(tokens_BxT=jnp.zeros((2, 3), jnp.int32), team_B=jnp.zeros(2), role_RxB=jnp.zeros((3, 2)),
                           group_size=2)
  scored = engine.Scored(team_B=jnp.zeros(2), role_RxB=jnp.zeros((3, 2)), metrics={}, judgments=judgments)
  mesh = parallel.make_mesh(1, 1)
  stage = parallel.shard_map(lambda key_B: rewards.assign(_peer("team"), roles, judge_roles, (), scored, outcome, key_B)[1],
                             mesh, in_specs=(P(parallel.DATA),), out_specs=P())
  paid = stage(jax.random.split(jax.random.key(0), 2))
  np.testing.assert_allclose(paid.role_RxB, [[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]])
  np.testing.assert_allclose(paid.team_B, [0.5, 0.5])
  # Both episodes audited, a penalty of 0.5: the right candidates get 1, the picked wrong one -0.5, and
  # each audit sends both candidates' labels to the loss.
  judged_KxB, pay_JxB, _, metrics = rewards.settle(_peer("team", audit_rate=1.0, penalty=0.5), (), judgments,
                                                   jnp.array([True, True]))
  np.testing.assert_allclose(judged_KxB, [[1.0, 1.0], [-0.5, 1.0]])
  np.testing.assert_allclose(pay_JxB, [[0.25, 1.0]])
  np.testing.assert_allclose(metrics["labels_per_episode"], 2.0)
  np.testing.assert_allclose(metrics["false_accept"], [1.0])  # the one wrong candidate was picked


def test_audited_pays_the_brier_score_on_audited_episodes_only():
  reviewed = _reviewed([[2, 2, 1, 3]], [True, True, True, False], [1, 0, 0, 1])
  pay_JxB, _, _ = _peer("audited", audit_rate=0.5).pay((), reviewed, None)
  np.testing.assert_allclose(pay_JxB, [[1 - 1 / 9, 1 - 4 / 9, 1 - 1 / 9, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("q", [0.0, 0.2, 1 / 3, 0.45, 0.6, 2 / 3, 0.9, 1.0])
def test_the_brier_scores_expected_pay_is_largest_at_the_level_nearest_the_true_probability(q):
  # A judge who believes the answer right with probability q expects q S(p, 1) + (1 - q) S(p, 0).
  levels_L = np.asarray(LEVELS)
  expected_L = q * audited.brier_score(levels_L, 1.0) + (1 - q) * audited.brier_score(levels_L, 0.0)
  assert np.argmax(expected_L) == np.argmin(np.abs(levels_L - q))
  # Off the vocabulary too: the true probability itself pays most of all.
  grid = np.linspace(0, 1, 101)
  assert abs(grid[np.argmax(q * audited.brier_score(grid, 1.0) + (1 - q) * audited.brier_score(grid, 0.0))] - q) < 0.006


def test_audited_team_pays_the_brier_score_on_audits_and_a_share_of_the_judged_reward_elsewhere():
  # One judge states 1, 0, 2/3, 1/3; the first and third episodes are audited (wrong, right).
  reviewed = _reviewed([[3, 0, 2, 1]], [True, False, True, False], [0, 1, 1, 0])
  pay_JxB, _, _ = _peer("audited_team", audit_rate=0.5, share=0.5).pay((), reviewed, jnp.array([0.0, 0.0, 1.0, 1 / 3]))
  np.testing.assert_allclose(pay_JxB, [[0.0, 0.0, 1 - 1 / 9, 0.5 / 3]], rtol=1e-6)


@pytest.mark.parametrize("q,audit_rate,share,judges", [(0.2, 0.1, 0.1, 2), (0.5, 0.25, 0.2, 1), (0.1, 0.5, 1.0, 2),
                                                       (0.6, 0.1, 1.0, 2), (0.3, 1.0, 1.0, 3)])
def test_audited_team_pays_most_for_the_belief_inflated_by_the_share(q, audit_rate, share, judges):
  # A judge who believes the answer right with probability q, the other judges stating 1/2: its expected
  # pay for statement s, from the rule's own pay, is largest at q + inflation (clipped to [0, 1]).
  rule = _peer("audited_team", audit_rate=audit_rate, share=share)
  grid = np.linspace(0, 1, 301)
  levels = tuple(grid)
  level_A = jnp.arange(len(grid))
  pay = lambda audited_A, truth: rule.pay((), _reviewed(level_A[None], audited_A, truth, levels),
                                         (grid + 0.5 * (judges - 1)) / judges)[0][0]
  audited_pay = q * pay(True, 1) + (1 - q) * pay(True, 0)
  expected = audit_rate * np.asarray(audited_pay) + (1 - audit_rate) * np.asarray(pay(False, 0))
  best = min(1.0, q + audited_team.inflation(share, audit_rate, judges))
  assert abs(grid[np.argmax(expected)] - best) < 0.004


def test_audited_balanced_weighs_each_class_by_the_inverse_of_its_share_by_hand():
  # A record of 1 right and 3 wrong audited answers: base rate 1/4, a right answer weighs 1 / (2 * 1/4) = 2,
  # a wrong one 1 / (2 * 3/4) = 2/3.  One judge states 1, 2/3, 0, 1/3; the first three episodes are
  # audited (right, wrong, wrong).
  rule = _peer("audited_balanced", audit_rate=0.5)
  reviewed = _reviewed([[3, 2, 0, 1]], [True, True, True, False], [1, 0, 0, 1])
  pay_JxA, counts_2, metrics = rule.pay(jnp.array([1.0, 3.0]), reviewed, None)
  np.testing.assert_allclose(pay_JxA, [[2 * 1.0, 2 / 3 * (1 - 4 / 9), 2 / 3 * 1.0, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(counts_2, [2.0, 5.0])
  np.testing.assert_allclose(metrics["base_rate"], 0.25)
  # The judged roles get each statement read at the base rate: 1 stays 1, 0 stays 0, 2/3 (odds 2) is odds
  # 2 / 3, probability 2/5; 1/3 is odds 1/6, probability 1/7.
  np.testing.assert_allclose(rule.aggregate(jnp.array([1.0, 3.0]), reviewed), [1.0, 2 / 5, 0.0, 1 / 7], rtol=1e-6)


@pytest.mark.parametrize("q,rate", [(0.07, 0.07), (0.2, 0.07), (0.5, 0.3), (0.02, 0.1), (0.9, 0.5)])
def test_audited_balanced_pays_most_for_the_belief_at_even_odds_and_reads_it_back(q, rate):
  # A judge who believes the answer right with probability q, the record at base rate `rate`: its
  # expected pay for statement s, from the rule's own pay, is largest where s / (1 - s) = (q / (1 - q))
  # ((1 - rate) / rate); that statement, read at the base rate, is q again.
  rule = _peer("audited_balanced", audit_rate=0.5)
  grid = np.linspace(0, 1, 1001)
  level_A = jnp.arange(len(grid))
  counts_2 = jnp.array([rate, 1 - rate]) * 100
  pay = lambda truth: np.asarray(rule.pay(counts_2, _reviewed(level_A[None], True, truth, tuple(grid)), None)[0][0])
  expected = q * pay(1) + (1 - q) * pay(0)
  best = q * (1 - rate) / (q * (1 - rate) + (1 - q) * rate)
  assert abs(grid[np.argmax(expected)] - best) < 0.002
  np.testing.assert_allclose(audited_balanced.at_base_rate(best, rate), q, rtol=1e-6)
  # A judge that knows nothing (q = rate) does best to state 1/2, not the base rate.
  uninformed = rate * pay(1) + (1 - rate) * pay(0)
  assert abs(grid[np.argmax(uninformed)] - 0.5) < 0.002


def test_correlated_agreement_by_hand():
  # Binary reports on 4 episodes: judge 0 says 1,1,0,0, judge 1 says 1,0,0,0.  Delta(x, y) = P(x, y) -
  # P(x) P(y): (0,0) .5 - .5*.75 > 0, (1,1) .25 - .5*.25 > 0, the others < 0: S is the identity.
  # Judge 0's pay: agreement on the episode (1,0,1,1) less its agreement with judge 1's reports on the
  # other three episodes (0, 1/3, 2/3, 2/3); judge 1's: (1,0,1,1) less (1/3, 2/3, 1/3, 1/3).
  pay_JxB = peer_prediction.correlated_agreement(jnp.array([[1, 1, 0, 0], [1, 0, 0, 0]]), 2)
  np.testing.assert_allclose(pay_JxB, [[1, -1 / 3, 1 / 3, 1 / 3], [2 / 3, -2 / 3, 2 / 3, 2 / 3]], rtol=1e-6)
  # An uninformed judge (always accepting) agrees no more than chance: Delta = 0, S = 0, paid 0.
  np.testing.assert_allclose(peer_prediction.correlated_agreement(jnp.array([[1, 1, 1, 1], [1, 0, 0, 0]]), 2)[0], 0.0)
  # Reports that disagree more than chance are informative too: S is the anti-identity.
  pay_JxB = peer_prediction.correlated_agreement(jnp.array([[1, 0, 1, 0], [0, 1, 0, 1]]), 2)
  np.testing.assert_allclose(pay_JxB, np.full((2, 4), 1 - 1 / 3), rtol=1e-6)


def test_peer_prediction_ignores_the_checker():
  rule = _peer("peer_prediction")
  level_JxB = jnp.array([[3, 0, 2, 1], [3, 1, 0, 0]])
  pays = [rule.pay((), _reviewed(level_JxB, [True] * 4, truth), None)[0] for truth in ([1, 0, 1, 0], [0, 1, 1, 1])]
  np.testing.assert_array_equal(*pays)


def test_reputation_weighs_judges_by_the_log_odds_of_their_audited_accuracy():
  # Records Beta(4, 1) and Beta(2, 1): accuracies 4/5 and 2/3, log-odds log 4 = 2 log 2 and log 2, so
  # weights 2/3 and 1/3.  Judge 0 states 1 then 0, judge 1 states 0 then 1.
  rule = _peer("reputation", audit_rate=0.5)
  counts_2xJ = jnp.array([[4.0, 2.0], [1.0, 1.0]])
  reviewed = _reviewed([[3, 0], [0, 3]], [True, False], [1, 1])
  np.testing.assert_allclose(rule.aggregate(counts_2xJ, reviewed), [2 / 3, 1 / 3], rtol=1e-6)
  # The audited first episode is right: judge 0 accepted it (right), judge 1 rejected it (wrong).
  pay_JxB, counts_2xJ, metrics = rule.pay(counts_2xJ, reviewed, jnp.array([1.0, 1 / 3]))
  np.testing.assert_allclose(counts_2xJ, [[5.0, 2.0], [1.0, 2.0]])
  np.testing.assert_allclose(pay_JxB, [[1.0, 1 / 3], [1.0, 1 / 3]], rtol=1e-6)  # the judged reward
  np.testing.assert_allclose(metrics["reputation"], [5 / 6, 1 / 2], rtol=1e-6)
  # A judge no better than chance counts for nothing; with every judge there, the plain mean.
  np.testing.assert_allclose(rule.aggregate(jnp.array([[1.0, 3.0], [1.0, 1.0]]), reviewed), [0.0, 1.0])
  np.testing.assert_allclose(rule.aggregate(jnp.ones((2, 2)), reviewed), [0.5, 0.5])
  np.testing.assert_allclose(rule.init(2), [[1.0, 1.0], [1.0, 1.0]])


def test_audits_are_drawn_at_the_rate_and_the_same_for_the_same_keys():
  rows_B = jnp.arange(20000)
  audits = lambda key, step, rate: rewards.draw_audits(rewards.audit_keys(key, step, rows_B), rate)
  key = jax.random.key(3)
  for rate in (0.0, 0.1, 0.5, 1.0):
    assert abs(float(audits(key, 4, rate).mean()) - rate) < 0.01
  np.testing.assert_array_equal(audits(key, 4, 0.3), audits(key, 4, 0.3))
  assert (audits(key, 4, 0.3) != audits(key, 5, 0.3)).any()  # each step draws anew
  assert (audits(key, 4, 0.3) != audits(jax.random.key(4), 4, 0.3)).any()  # and each run


def _config(experiment_name, arg):
  """experiments/NAME.py:ARG on one device, without a warm start."""
  config = configs.sibling(str(EXPERIMENTS / "x.py"), experiment_name).get_config(arg)
  config.num_devices = 1  # other tests may have forced several CPU devices in this process
  config.sft.steps = 0
  return config


@pytest.mark.parametrize("overrides, message", [
    ({"reward.source": "peers"}, "config.reward.source='peers' is unknown; allowed: ['checker', 'peer']"),
    ({"reward.pay": "vote"}, "config.reward.pay='vote' is unknown; allowed: ['audited', 'audited_balanced', 'audited_team', "
                             "'peer_prediction', 'reputation', 'team']"),
    ({"reward.audit_rate": 1.5}, "config.reward.audit_rate=1.5; allowed: a probability in [0, 1]"),
    ({"reward.penalty": -1.0}, "config.reward.penalty=-1.0; allowed: a number >= 0"),
    ({"reward.source": "checker"}, "config.reward.pay='reputation' acts only with config.reward.source='peer'"),
    ({"reward.audit_rate": 0.0, "reward.penalty": 0.5}, "config.reward.penalty acts on audited episodes"),
    ({"protocol.judges": 1, "roles.sharing": "isolated"}, "config.reward.pay='reputation' needs at least 2 judging roles; this workflow has 1"),
    ({"reward.audit_rate": 0.0}, "config.reward.pay='reputation' learns from labelled answers"),
    ({"reward.prior_wrong": 0.0}, "config.reward.prior_wrong=0.0; allowed: a number > 0"),
    ({"credit.name": "difference"}, "the re-runs' outcomes come from the task's checker"),
    ({"reward.cross": "seed"}, "config.reward.cross='seed' is unknown; allowed: ['none', 'other_set', 'frozen', 'rotate']"),
    ({"reward.cross": "other_set", "roles.sharing": "shared"}, "config.reward.cross='other_set': "
     "config.roles.sharing=0,0,0 gives judged roles [0] a judge's parameter set"),
    ({"reward.cross": "frozen"}, "config.reward.cross='frozen': the judges' parameter sets [1] are trained"),
    ({"protocol.channel": -1}, "config.protocol.channel=-1; allowed: an integer >= 0"),
])
def test_bad_reward_settings_are_refused_naming_the_key(overrides, message):
  config = _config("peer_review", "size=tiny,pay=reputation")
  for key, value in overrides.items():
    group, leaf = key.split(".")
    config[group] = configs.credit_config(value) if key == "credit.name" else config[group]
    config[group][leaf] = value
  with pytest.raises(ValueError, match=re.escape(message)):
    experiment.build(config)


def test_a_rule_that_pays_judges_their_own_reward_needs_credit_that_gives_each_role_its_own():
  config = _config("peer_review", "size=tiny,pay=audited,credit=team")
  with pytest.raises(ValueError, match="config.reward.pay='audited' pays each judge its own reward"):
    experiment.build(config)
  config.credit = configs.credit_config("role_normalized")
  config.credit.signal = "role"
  experiment.build(config)


def test_the_solver_verifier_pair_runs_on_peer_rewards_with_its_one_judge():
  config = _config("solver_verifier", "size=tiny,credit=per_role")
  config.reward = configs.reward_config("audited", source="peer", audit_rate=0.2)
  assert experiment.build(config).protocol.judge_roles == (1,)
  config.reward = configs.reward_config("peer_prediction", source="peer")
  with pytest.raises(ValueError, match="config.reward.pay='peer_prediction' needs at least 2 judging roles; "
                                       "this workflow has 1"):
    experiment.build(config)


def _debate_rewarded_by_its_verifier(pay):
  config = _config("debate", "size=tiny,task=subset_sum,scorer=verifier")
  config.reward = configs.reward_config(pay, source="peer")
  return config


@pytest.mark.parametrize("config", [
    lambda: _config("peer_review", "size=tiny,pay=team,audit_rate=0"),
    pytest.param(lambda: _config("peer_review", "size=tiny,pay=peer_prediction,audit_rate=0"), marks=pytest.mark.slow),
    # Its per-turn influence rewards read the verifier (8 s: in the slow tier, as the fast tier nears 5 minutes).
    pytest.param(lambda: _debate_rewarded_by_its_verifier("team"), marks=pytest.mark.slow),
    # Half the problems planted, the judges read by probability and taught on the planted labels (with
    # and without their policy gradient): labels reach the loss, none of them the checker's.
    pytest.param(lambda: _config("peer_review", "size=tiny,pay=audited_balanced,audit_rate=0,plant_rate=0.5,"
                                                "verdict=expected,judge_loss=brier"), marks=pytest.mark.slow),
    pytest.param(lambda: _config("peer_review", "size=tiny,pay=audited_balanced,audit_rate=0,plant_rate=0.5,"
                                                "judge_loss=log,judge_pg=false"), marks=pytest.mark.slow),
], ids=["peer_review:team", "peer_review:peer_prediction", "debate:team", "planted+brier+expected",
        "planted+supervised"])
def test_without_audits_the_checker_does_not_reach_the_update(config):
  # source=peer, audit_rate=0: one compiled step, run with the task's checker and with a checker that
  # says the opposite (a traced switch, so both runs are one program): the updated state is
  # bit-identical, and no ground-truth label reached the loss (a planted answer's label is the task's
  # construction).
  exp = experiment.build(config())
  start = compiled_init_state(exp, jax.random.PRNGKey(0))
  keys_3xB = jax.random.split(jax.random.PRNGKey(1), 3 * exp.config.rl.batch_size).reshape(
      3, exp.config.rl.batch_size, -1)

  @jax.jit
  def step(flip):
    class FlippedChecker(type(exp.protocol)):
      def rewards(self, task, layout, problems, tokens_BxT):
        scored = super().rewards(task, layout, problems, tokens_BxT)
        f = lambda x: jnp.where(flip, 1 - x, x)
        return scored.replace(team_B=f(scored.team_B), role_RxB=f(scored.role_RxB),
                              judgments=scored.judgments.replace(truth_KxB=f(scored.judgments.truth_KxB)))

    protocol = FlippedChecker(**{f.name: getattr(exp.protocol, f.name) for f in dataclasses.fields(exp.protocol)})
    flipped = dataclasses.replace(exp, protocol=protocol)
    return parallel.shard_map(lambda s: train.local_step(flipped, s, *keys_3xB, False), exp.mesh,
                              in_specs=(P(),), out_specs=P())(start)

  (state_true, metrics_true), (state_flipped, metrics_flipped) = step(False), step(True)
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, state_true), jax.tree.map(np.asarray, state_flipped))
  planted = exp.reward.plant_rate > 0
  assert (metrics_true["labels_per_episode"] > 0) if planted else (metrics_true["labels_per_episode"] == 0)
  assert metrics_true["reward"] == metrics_flipped["reward"]
  assert metrics_true["true_accuracy"] + metrics_flipped["true_accuracy"] == 1  # the checker did flip


def test_the_pay_flag_selects_the_rules_settings():
  # --config.reward.pay=NAME makes config.reward that rule's group, the shared settings at the file's values.
  argv = ["main", "--config.reward.pay=reputation", "--config.reward.prior_right=2"]
  parse = cli._selecting(lambda arg: _config("peer_review", arg), argv)
  reward = parse("size=tiny,pay=audited,audit_rate=0.3").reward
  assert reward.to_dict() == {**rewards.knobs("reputation"), "pay": "reputation", "source": "peer", "audit_rate": 0.3}


@pytest.mark.slow
@pytest.mark.parametrize("arg", ["pay=team,audit_rate=0", "pay=audited,penalty=0.5", "pay=peer_prediction,audit_rate=0",
                                 "pay=reputation,judges=3", "pay=audited_balanced"])
def test_each_payment_rule_trains_through_the_cli(tmp_path, arg):
  rows = _cli_rows(tmp_path, f"peer_review.py:size=tiny,{arg}")
  assert rows[-1]["step"] == 4 and 0 <= rows[-1]["eval_accuracy"] <= 1
  trained = [r for r in rows if "labels_per_episode" in r]
  assert len(trained) == 2  # steps 2 and 4
  assert {"true_accuracy", "reported_accuracy", "distortion", "judge0/false_accept", "judge1/false_reject",
          "judge0/reward", "solver/reward"} <= set(trained[-1])
  for row in trained:
    assert row["distortion"] == pytest.approx(row["reported_accuracy"] - row["true_accuracy"], abs=1e-6)
    if "audit_rate=0" in arg:
      assert row["labels_per_episode"] == 0
    else:  # audits at 0.1 of the 32 episodes of a step
      assert 0 <= row["labels_per_episode"] <= 0.5
  if "reputation" in arg:
    assert 0 < trained[-1]["judge2/reputation"] < 1


def test_judge_measures_by_hand():
  # One judge states levels 3, 1, 1, 0, 2 of answers right, right, wrong, wrong, wrong.  AUROC: the
  # right answer at 3 beats all 3 wrong ones, the one at 1 beats the 0, ties the 1 (1/2) and loses to
  # the 2: (3 + 1.5) / 6.  It accepts (level > 1/2 of the vocabulary 0, 1/3, 2/3, 1) answers 0 and 4:
  # 1 of 2 right ones, rejects 2 of 3 wrong ones, balanced accuracy (1/2 + 2/3) / 2.  A judge that
  # states one level for everything: 1/2 for both.
  level_JxA, truth_A = jnp.array([[3, 1, 1, 0, 2], [1, 1, 1, 1, 1]]), jnp.array([1.0, 1.0, 0.0, 0.0, 0.0])
  np.testing.assert_allclose(judging.auroc(level_JxA, truth_A), [0.75, 0.5])
  # Scores need not be levels: probabilities 0.9, 0.4 on the right answers, 0.4, 0.1, 0.6 on the wrong
  # ones order the pairs as the first judge's levels do.
  np.testing.assert_allclose(judging.auroc(jnp.array([[0.9, 0.4, 0.4, 0.1, 0.6]]), truth_A), [0.75])
  accept_JxA = jnp.asarray(LEVELS)[level_JxA] > 0.5
  np.testing.assert_allclose(judging.balanced_accuracy(accept_JxA, truth_A), [7 / 12, 0.5], rtol=1e-6)
  # Right answers only; judges reject (err on) answers {0, 1}, {0, 2}, {0, 3}: their errors are
  # uncorrelated in pairs, so three judges are worth three, and agree on 1/2 of the answers.  Copies of
  # one judge are worth one, and agree on everything.
  right_A = jnp.ones(4)
  independent_JxA = ~jnp.array([[1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]], bool)
  np.testing.assert_allclose(judging.effective_judges(independent_JxA[:2], right_A), 2.0)
  np.testing.assert_allclose(judging.effective_judges(independent_JxA, right_A), 3.0)
  np.testing.assert_allclose(judging.agreement(independent_JxA), 0.5)
  copies_JxA = jnp.stack([independent_JxA[0]] * 3)
  np.testing.assert_allclose(judging.effective_judges(copies_JxA, right_A), 1.0)
  np.testing.assert_allclose(judging.agreement(copies_JxA), 1.0)
  # Half correlated (rho = 1/2 for two judges): 2 / (1 + 1/2).  Errors that never vary: undefined.
  half_JxA = ~jnp.array([[1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 1]], bool)
  rho = np.corrcoef(~np.asarray(half_JxA))[0, 1]
  np.testing.assert_allclose(judging.effective_judges(half_JxA, jnp.ones(6)), 2 / (1 + rho), rtol=1e-6)
  assert np.isnan(judging.effective_judges(jnp.ones((2, 4), bool), right_A))
  # Errors that anti-correlate (one judge errs exactly where the other does not: rho = -1) sent
  # 1 + (J - 1) rho to 0 and the count to infinity; they count as independent judges, J.
  opposite_JxA = ~jnp.array([[1, 1, 0, 0], [0, 0, 1, 1]], bool)
  np.testing.assert_allclose(judging.error_correlation(opposite_JxA, right_A), -1.0, rtol=1e-6)
  np.testing.assert_allclose(judging.effective_judges(opposite_JxA, right_A), 2.0)
  nearly_JxA = ~jnp.array([[1, 1, 0, 0, 0], [0, 0, 1, 1, 0]], bool)  # rho = -2/3: 2 / (1 - 2/3) = 6 before
  assert judging.error_correlation(nearly_JxA, jnp.ones(5)) < 0
  np.testing.assert_allclose(judging.effective_judges(nearly_JxA, jnp.ones(5)), 2.0)


def test_channel_information_by_hand():
  # The plug-in part, among the wrong answers: six wrong answers and one right one; messages a, a, a,
  # b, b, b on the wrong ones.  A judge that accepts exactly the a's reads its verdict off the channel:
  # 1 bit.  One that accepts one a and one b, or two of each, reads nothing: 0.  The right answer does
  # not count, whatever it says.  A message that decides an unbalanced verdict: its entropy H(1/3).
  a, b = text.TOKEN_ID["a"], text.TOKEN_ID["b"]
  message_AxL = jnp.array([[a], [a], [a], [b], [b], [b], [a]])
  wrong_A = jnp.array([1, 1, 1, 1, 1, 1, 0], bool)
  accept_JxA = jnp.array([[1, 1, 1, 0, 0, 0, 0], [1, 0, 0, 1, 0, 0, 1], [1, 1, 0, 1, 1, 0, 0]], bool)
  # Each measure compiled as one program (op by op, each of its ops would compile on its own).
  mutual_information, channel_information = jax.jit(codes.mutual_information), jax.jit(judging.channel_information)
  plug_in = lambda m_AxL, a_A: float(mutual_information(m_AxL, a_A[:, None], among_B=wrong_A))
  np.testing.assert_allclose([plug_in(message_AxL, a_A) for a_A in accept_JxA], [1.0, 0.0, 0.0], atol=1e-6)
  skewed_AxL = jnp.array([[a], [b], [b], [a], [b], [b], [b]])
  h = -(1 / 3) * np.log2(1 / 3) - (2 / 3) * np.log2(2 / 3)
  np.testing.assert_allclose(plug_in(skewed_AxL, skewed_AxL[:, 0] == a), h, rtol=1e-5)
  # Chance: each wrong answer's verdict paired with another wrong answer's message (one cycle through
  # them), the right one with its own.
  perm_NxA = np.asarray(jax.jit(judging.chance_pairings)(wrong_A))
  assert (perm_NxA[:, 6] == 6).all() and (perm_NxA[:, :6] != np.arange(6)).all()
  assert all(sorted(p[:6]) == list(range(6)) for p in perm_NxA)
  # Beyond chance, on 200 wrong answers: a message distinct on every row "determines" any verdict by
  # the plug-in estimate, and so does chance: 0.  A verdict read off a two-valued message: about its
  # 1 bit.  A verdict independent of the message (alternating within each): about 0.  A constant verdict: 0.
  A = 200
  two_AxL, wrong = (jnp.arange(A) // 100)[:, None], jnp.zeros(A)
  verdicts_JxA = jnp.stack([jax.random.bernoulli(jax.random.key(3), 0.4, (A,)), two_AxL[:, 0] == 1,
                            jnp.arange(A) % 2 == 0, jnp.zeros(A, bool)])
  np.testing.assert_allclose(channel_information(jnp.arange(A)[:, None], verdicts_JxA[:1], wrong), [0.0],
                             atol=1e-5)
  information_J = channel_information(two_AxL, verdicts_JxA[1:], wrong)
  assert information_J[0] > 0.98 and abs(information_J[1]) < 0.02 and abs(information_J[2]) < 1e-6


def test_the_channel_ablation_replaces_the_channel_by_noise_and_redraws_the_verdicts_alone():
  task = tasks.make("subset_sum")
  protocol = protocols.make("peer_review", task, judges=2, channel=3)
  layout = protocol.layout(task, (0, 1, 1))
  problems = task.sample_batch(jax.random.split(jax.random.key(0), 8))
  key_B = jax.random.split(jax.random.key(1), 8)
  tokens_BxT = compiled_demonstrate(protocol, task, layout, problems, key_B)
  canvas_BxT, redraw_T = protocol.ablation(layout, tokens_BxT, jax.random.split(jax.random.key(2), 8))
  (a, b), (c, d), (e, f) = layout.turn_slices[1:]  # the channel, then each judge's verdict
  np.testing.assert_array_equal(np.flatnonzero(redraw_T), [*range(c, d), *range(e, f)])
  np.testing.assert_array_equal(np.delete(canvas_BxT, np.s_[a:b], 1), np.delete(tokens_BxT, np.s_[a:b], 1))
  letters_BxC = np.asarray(canvas_BxT[:, a:b]) - text.TOKEN_ID["a"]
  assert ((letters_BxC >= 0) & (letters_BxC < 26)).all() and (canvas_BxT[:, a:b] != tokens_BxT[:, a:b]).any()
  assert protocols.make("peer_review", task).ablation(layout, tokens_BxT, key_B) is None


def _role_maps(R):
  """Every role map of R roles (sets numbered in order of first use)."""
  maps = [(0,)]
  for _ in range(R - 1):
    maps = [m + (s,) for m in maps for s in range(max(m) + 2)]
  return maps


@pytest.mark.parametrize("experiment_name, arg", [("peer_review", "size=tiny,judges=2"),
                                                  ("best_of_n", "size=tiny,task=subset_sum,credit=per_role")])
def test_cross_judging_never_pairs_a_judge_with_a_set_it_judges(experiment_name, arg):
  # Every role map: cross=other_set builds exactly those in which no judged answer's role (from a
  # scored batch of demonstrations) uses a judge's set; cross=frozen those whose judges' sets are frozen too.
  config = _config(experiment_name, arg)
  config.num_seeds = 2  # cross=rotate moves judges between seeds
  config.reward = configs.reward_config("team", source="peer", cross="other_set")
  exp = experiment.build(config)
  problems = exp.task.sample_batch(jax.random.split(jax.random.key(0), 4))
  keys = jax.random.split(jax.random.key(1), 4)
  tokens_BxT = compiled_demonstrate(exp.protocol, exp.task, exp.layout, problems, keys)
  answer_roles = compiled_rewards(exp.protocol, exp.task, exp.layout, problems, tokens_BxT).judgments.answer_roles
  judges = exp.protocol.judge_roles
  built = 0
  for role_set_R in _role_maps(len(exp.layout.roles)):
    config.roles.sharing = ",".join(map(str, role_set_R))
    separate = not {role_set_R[r] for r in judges} & {role_set_R[r] for r in answer_roles}
    for cross in ("other_set", "frozen", "rotate"):
      config.reward.cross = cross
      config.roles.trainable = ",".join("0" if s in {role_set_R[r] for r in judges} else "1"
                                        for s in range(max(role_set_R) + 1)) if cross == "frozen" else ""
      if separate:
        built += 1
        assert experiment.build(config).role_set_R == role_set_R
      else:
        with pytest.raises(ValueError, match="gives judged roles"):
          experiment.build(config)
  assert built >= 2  # e.g. isolated sets, and the judges' set apart from the rest


def test_rotation_moves_the_judges_sets_and_records_one_seed_down():
  # 3 seeds, parameter sets 0 (the solver's) and 1 (the judges'); each leaf's value names its seed and set.
  seed_set_SxRx1 = (10 * jnp.arange(3)[:, None] + jnp.arange(2)[None])[..., None]
  start = state.TrainState(step=jnp.zeros(3, jnp.int32), params={"w": seed_set_SxRx1}, ref_params=(),
                           opt_state=({"mu": seed_set_SxRx1 + 100},), credit=(), key=jnp.zeros(3),
                           reward=jnp.arange(3)[:, None, None] * jnp.ones((3, 2, 2)))
  moved = rewards.rotate_judges(start, (1,))
  np.testing.assert_array_equal(moved.params["w"][..., 0], [[0, 11], [10, 21], [20, 1]])
  np.testing.assert_array_equal(moved.opt_state[0]["mu"][..., 0], [[100, 111], [110, 121], [120, 101]])
  np.testing.assert_array_equal(moved.reward[:, 0, 0], [1, 2, 0])  # the judges' records go with them
  # After S moves every judge is home again.
  home = functools.reduce(lambda s, _: rewards.rotate_judges(s, (1,)), range(3), start)
  chex.assert_trees_all_equal(home, start)


def test_rotation_needs_two_seeds():
  config = _config("peer_review", "size=tiny,cross=rotate")
  with pytest.raises(ValueError, match=r"config.reward.cross='rotate' passes the judges from seed to seed; "
                                       r"config.num_seeds=1; allowed: 2 or more"):
    experiment.build(config)


@pytest.mark.slow
def test_a_rotating_step_is_the_step_then_the_judges_moved_on():
  # Two seeds, one step a call: the state after a call with cross=rotate is the state after the same
  # call with cross=other_set, the judges' set then moved one seed down.
  def run(cross):
    config = _config("peer_review", f"size=tiny,cross={cross}")
    config.num_seeds, config.steps_per_call = 2, 1
    exp = experiment.build(config)
    return exp, train.make_train_call(exp)(state.place(exp, loop.initial_state(exp)))[0]
  exp, rotated = run("rotate")
  _, plain = run("other_set")
  judge_sets = tuple(sorted({exp.role_set_R[r] for r in exp.protocol.judge_roles}))
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, rotated),
                              jax.tree.map(np.asarray, rewards.rotate_judges(plain, judge_sets)))


@pytest.mark.slow
def test_the_covert_channel_trains_through_the_cli(tmp_path):
  rows = _cli_rows(tmp_path, "peer_review.py:size=tiny,pay=team,audit_rate=0,channel=2")
  trained = [r for r in rows if "labels_per_episode" in r]
  evaluated = [r for r in rows if "eval_accuracy" in r]
  assert rows[-1]["step"] == 4 and len(trained) == 2
  for name in ("judge0/channel_information", "judge1/auroc", "judge0/balanced_accuracy", "effective_judges",
               "judge_agreement"):
    assert name in trained[-1] and f"eval_{name}" in evaluated[-1], name
  # The judges re-run on a noise channel: their accepts of wrong answers without the signal.
  assert {"eval_distortion", "eval_judge1/false_accept", "eval_ablated_false_accept",
          "eval_ablated_judge0/channel_information"} <= set(evaluated[0])
  # Bits of a binary verdict, less chance: within [-1, 1].
  assert all(-1 <= r["judge0/channel_information"] <= 1 for r in trained if np.isfinite(r["judge0/channel_information"]))
