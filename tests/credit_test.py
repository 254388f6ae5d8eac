"""Credit estimators: every group baseline and estimator against examples worked out by hand, one
contract every registered estimator keeps, and the registry's errors."""
import dataclasses
import math

import jax
import chex
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.stats

from marl_jax import credit, protocols, train
from marl_jax.tasks.arithmetic import Arithmetic

# Two groups of G=4 samples of one problem each.
R_B = jnp.array([1., 0., 0., 1., 1., 1., 1., 0.])
G = 4

# Group 1 [1,0,0,1]: mean 1/2, population std 1/2.
# Group 2 [1,1,1,0]: mean 3/4, std sqrt((3 * (1/4)^2 + (3/4)^2) / 4) = sqrt(3/16) = sqrt(3)/4.
S3 = np.sqrt(3.0)
EXPECTED = {
    # (r - mean) / std: group 1 (+-1/2)/(1/2) = +-1; group 2 (1/4)/(sqrt3/4) = 1/sqrt3, -(3/4)/(sqrt3/4) = -sqrt3
    "grpo": [1, -1, -1, 1, 1 / S3, 1 / S3, 1 / S3, -S3],
    # r - mean
    "dr_grpo": [.5, -.5, -.5, .5, .25, .25, .25, -.75],
    # r_i - mean of the other three: group 1: 1 - 1/3, 0 - 2/3; group 2: 1 - 2/3, 0 - 3/3
    "rloo": [2 / 3, -2 / 3, -2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3, -1],
    "none": [1, 0, 0, 1, 1, 1, 1, 0],
}


@pytest.mark.parametrize("kind", credit.BASELINES)
def test_group_baselines_by_hand(kind):
  adv_B = credit.group_advantage(R_B, G, kind)
  chex.assert_shape(adv_B, (8,))
  chex.assert_trees_all_close(adv_B, jnp.array(EXPECTED[kind], jnp.float32), atol=1e-5)


@pytest.mark.parametrize("kind", credit.BASELINES)
def test_group_baselines_work_on_leading_axes(kind):
  # Row 2 of a role axis is the same rewards with groups swapped: each row is baselined by itself.
  r_RxB = jnp.stack([R_B, jnp.roll(R_B, 4)])
  adv_RxB = credit.group_advantage(r_RxB, G, kind)
  chex.assert_shape(adv_RxB, (2, 8))
  chex.assert_trees_all_close(adv_RxB[0], jnp.array(EXPECTED[kind], jnp.float32), atol=1e-5)
  chex.assert_trees_all_close(adv_RxB[1], jnp.roll(jnp.array(EXPECTED[kind], jnp.float32), 4), atol=1e-5)


@pytest.mark.parametrize("kind", credit.BASELINES[:3])
@pytest.mark.parametrize("reward", [1.0, 0.7, 0.1])
def test_a_group_of_equal_rewards_has_no_advantage(kind, reward):
  # No signal, exactly: eight 0.7s do not average to 0.7 in float32, and grpo once turned that
  # rounding (over a std of the same size) into advantages of 0.06.  Three 0.1s the same.
  for size in (3, 8):
    assert (credit.group_advantage(jnp.full(2 * size, reward), size, kind) == 0).all(), size


def test_grpo_eps_only_guards_a_zero_std():
  # (r - mean) / (std + eps): rewards 1e-3 apart still standardise to -+1 (std 5e-4: 5e-4 / (5e-4 + 1e-6)
  # = 0.998).  With eps inside the root, sqrt(2.5e-7 + 1e-6) = 1.1e-3, they would shrink to -+0.45.
  adv_B = credit.group_advantage(jnp.array([0.0, 1e-3, 0.5, 0.5]), 2, "grpo")
  chex.assert_trees_all_close(adv_B, jnp.array([-1.0, 1.0, 0.0, 0.0]), atol=5e-3)


def test_unknown_baseline():
  with pytest.raises(ValueError, match=r"config.credit.baseline='ppo' is unknown; allowed: \['grpo'"):
    credit.group_advantage(R_B, G, "ppo")


# Two roles, G=2 (two groups): team outcome and each role's own verifiable signal.
TEAM_B = jnp.array([1., 0., 1., 1.])
ROLE_RxB = jnp.array([[1., 0., 0., 1.],
                      [1., 1., 0., 1.]])
# Team outcome with role r's messages re-drawn, K=2 times: team_RxKxB.
CF_RxKxB = jnp.array([[[0., 0., 1., 0.], [1., 0., 1., 0.]],
                      [[1., 0., 0., 1.], [1., 0., 0., 1.]]])
# Their canvas: solver-verifier on one-operation arithmetic.
LAYOUT = protocols.make("solver_verifier", Arithmetic(num_ops=1)).layout(Arithmetic(num_ops=1), (0, 1))
OUTCOME = credit.Outcome(tokens_BxT=jnp.zeros((4, LAYOUT.length), jnp.int32), team_B=TEAM_B,
                         role_RxB=ROLE_RxB, group_size=2)


def init(estimator, seed=0):
  """The estimator's state for LAYOUT (jitted, as in the step: a critic's eager init is slow)."""
  return jax.jit(lambda key: estimator.init(key, LAYOUT))(jax.random.PRNGKey(seed))


def advantages(name, team_CxKxB=None, **knobs):
  estimator = credit.make(name, **knobs)
  counterfactuals = None if team_CxKxB is None else credit.Counterfactuals(None, team_CxKxB)
  return estimator.advantages(init(estimator), OUTCOME, counterfactuals)


def test_team_credit():
  # dr_grpo of the team outcome [1,0 | 1,1] is [1/2,-1/2 | 0,0], given to both roles.
  adv_RxB, _ = advantages("team")
  chex.assert_trees_all_close(adv_RxB, jnp.array([[.5, -.5, 0., 0.], [.5, -.5, 0., 0.]]))


def test_per_role_credit():
  # role 0 [1,0 | 0,1] -> [1/2,-1/2 | -1/2,1/2];  role 1 [1,1 | 0,1] -> [0,0 | -1/2,1/2].
  adv_RxB, _ = advantages("per_role")
  chex.assert_trees_all_close(adv_RxB, jnp.array([[.5, -.5, -.5, .5], [0., 0., -.5, .5]]))


# The group baseline of TEAM_B and ROLE_RxB (G=2) under another baseline than the default dr_grpo: grpo
# standardises each pair to -+1 (a tied pair to 0), none leaves the rewards as they are.
OTHER_BASELINES = {
    "grpo": ([1., -1., 0., 0.], [[1., -1., -1., 1.], [0., 0., -1., 1.]]),
    "none": (TEAM_B.tolist(), ROLE_RxB.tolist()),
}


@pytest.mark.parametrize("baseline", OTHER_BASELINES)
def test_the_baseline_knob_picks_the_group_baseline(baseline):
  # team baselines the team outcome, per_role each role's own signal; difference (like shapley and the
  # critic, which share its mixing) baselines the team outcome in its outcome term.
  team_B, role_RxB = map(jnp.array, OTHER_BASELINES[baseline])
  chex.assert_trees_all_close(advantages("team", baseline=baseline)[0], jnp.stack([team_B] * 2), atol=1e-5)
  chex.assert_trees_all_close(advantages("per_role", baseline=baseline)[0], role_RxB, atol=1e-5)
  chex.assert_trees_all_close(advantages("difference", CF_RxKxB, baseline=baseline, credit_weight=0.0)[0],
                              jnp.stack([team_B] * 2), atol=1e-5)


def test_difference_credit():
  # D_r = team - mean_k counterfactual team:
  #   role 0: mean_k = [1/2, 0, 1, 0] -> D_0 = [1,0,1,1] - that = [1/2, 0, 0, 1]
  #   role 1: mean_k = [1, 0, 0, 1]   -> D_1 = [0, 0, 1, 0]
  d_RxB = credit.difference_credit(TEAM_B, CF_RxKxB)
  chex.assert_shape(d_RxB, (2, 4))
  chex.assert_trees_all_close(d_RxB, jnp.array([[.5, 0., 0., 1.], [0., 0., 1., 0.]]))


def test_difference_advantage_mixes_outcome_and_credit():
  # 1/2 x team advantage [1/2,-1/2,0,0] + 2 x D_r:
  #   role 0: [1/4,-1/4,0,0] + [1,0,0,2] = [5/4, -1/4, 0, 2]
  #   role 1: [1/4,-1/4,0,0] + [0,0,2,0] = [1/4, -1/4, 2, 0]
  adv_RxB, metrics = advantages("difference", CF_RxKxB, outcome_weight=0.5, credit_weight=2.0)
  chex.assert_trees_all_close(adv_RxB, jnp.array([[1.25, -.25, 0., 2.], [.25, -.25, 2., 0.]]))
  chex.assert_trees_all_close(metrics["influence"], jnp.array([1.5 / 4, 1 / 4]))  # mean |D_r|


def test_difference_asks_for_one_rerun_per_role():
  reruns = credit.make("difference", counterfactual="absent", samples=3).reruns(3)
  assert reruns.changed_CxR == ((True, False, False), (False, True, False), (False, False, True))
  assert (reruns.mode, reruns.samples) == ("absent", 3)


def sharded(update_fn):
  """A stateful estimator's update runs inside the sharded step: here, one device."""
  replicated = jax.sharding.PartitionSpec()
  return jax.jit(jax.shard_map(update_fn, mesh=jax.make_mesh((1,), ("data",)), in_specs=replicated,
                               out_specs=replicated))


def test_role_baseline_by_hand():
  # decay 0.9, team signal.  Step 1: no history, baseline 0: A = team = [1,0,1,1] for both roles;
  # then ema = 0.9 * 0 + 0.1 * mean(team) = 0.075, bias-corrected by 1 - 0.9 = 0.1: baseline 0.75.
  # Step 2, a team that always fails (mean 0): A = 0 - 0.75; ema = 0.9 * .075 + 0.1 * 0 = .0675,
  # corrected by 1 - 0.81: baseline .0675 / .19 = 27/76 (the means 0.75 and 0 weighted 0.09 and 0.1).
  estimator = credit.make("role_baseline", decay=0.9)
  update = sharded(estimator.update)
  state = init(estimator)
  adv_RxB, _ = estimator.advantages(state, OUTCOME, None)
  chex.assert_trees_all_close(adv_RxB, jnp.stack([TEAM_B, TEAM_B]))
  state, _ = update(state, OUTCOME)
  chex.assert_trees_all_close(estimator.baseline_R(state), jnp.array([.75, .75]))
  failed = OUTCOME.replace(team_B=jnp.zeros(4))
  adv_RxB, metrics = estimator.advantages(state, failed, None)
  chex.assert_trees_all_close(adv_RxB, jnp.full((2, 4), -.75))
  chex.assert_trees_all_close(metrics["baseline"], jnp.array([.75, .75]))
  state, _ = update(state, failed)
  chex.assert_trees_all_close(estimator.baseline_R(state), jnp.full(2, 27 / 76))
  # With each role's own signal, after one update: role 0's mean is 1/2, role 1's 3/4.
  by_role = credit.make("role_baseline", decay=0.9, signal="role")
  state, _ = sharded(by_role.update)(init(by_role), OUTCOME)
  chex.assert_trees_all_close(by_role.baseline_R(state), jnp.array([.5, .75]))


@pytest.mark.parametrize("knobs, message", [
    # decay 1 never moves the average from 0: no baseline at all (and no bias correction, 1 - 1^n = 0).
    ({"decay": 1.0}, r"config.credit.decay=1.0; allowed: a number in \[0, 1\)"),
    ({"decay": -0.1}, r"config.credit.decay=-0.1; allowed: a number in \[0, 1\)"),
    # Any signal but 'team' would otherwise read each role's own signal, silently.
    ({"signal": "x"}, r"config.credit.signal='x' is unknown; allowed: \['team', 'role'\]")])
def test_role_baseline_refuses_bad_knobs(knobs, message):
  with pytest.raises(ValueError, match=message):
    credit.make("role_baseline", **knobs).check(2, 2)


def test_the_step_credits_a_batch_before_the_estimator_learns_from_it():
  # The baseline a batch is judged against must not include that batch (its own rows would pull each
  # advantage toward 0): the step's advantages are the state's before the update, baseline 0 here,
  # not 0.75 (test_role_baseline_by_hand).
  estimator = credit.make("role_baseline", decay=0.9)
  step_credit = sharded(lambda state, outcome: train.credit_from_reruns(
      dataclasses.make_dataclass("Exp", ["credit"])(estimator), state, None, outcome, None))
  adv_RxB, state, _ = step_credit(init(estimator), OUTCOME)
  chex.assert_trees_all_close(adv_RxB, jnp.stack([TEAM_B, TEAM_B]))
  chex.assert_trees_all_close(estimator.baseline_R(state), jnp.array([.75, .75]))


@dataclasses.dataclass(frozen=True)
class _FirstTokenCritic(credit.REGISTRY["critic"]):
  """A stub critic: Q(transcript) = its first token."""

  def q(self, params, tokens_xT):
    return tokens_xT[..., 0].astype(jnp.float32)


def _first_tokens(first_xB):
  return jnp.zeros(first_xB.shape + (LAYOUT.length,), jnp.int32).at[..., 0].set(first_xB)


def test_critic_advantage_by_hand():
  # Q(z) = [4, 0, 2, 2].  Q of the re-runs with role r's messages replaced, K=2:
  #   role 0: [2,0,2,0], [4,0,0,2] -> mean [3,0,1,1] -> A_0 = Q - that = [1, 0, 1, 1]
  #   role 1: [4,1,2,2], [4,1,2,0] -> mean [4,1,2,1] -> A_1 = [0, -1, 0, 1]
  # 1/2 x team advantage [1/2,-1/2,0,0] + 2 x A_r:
  #   role 0: [1/4,-1/4,0,0] + [2,0,2,2] = [9/4, -1/4, 2, 2];  role 1: [1/4, -9/4, 0, 2]
  estimator = _FirstTokenCritic(outcome_weight=0.5, credit_weight=2.0)
  outcome = OUTCOME.replace(tokens_BxT=_first_tokens(jnp.array([4, 0, 2, 2])))
  cf_tokens = _first_tokens(jnp.array([[[2, 0, 2, 0], [4, 0, 0, 2]], [[4, 1, 2, 2], [4, 1, 2, 0]]]))
  counterfactuals = credit.Counterfactuals(tokens_CxKxBxT=cf_tokens, team_CxKxB=CF_RxKxB)
  adv_RxB, metrics = estimator.advantages({"params": None}, outcome, counterfactuals)
  chex.assert_trees_all_close(adv_RxB, jnp.array([[2.25, -.25, 2., 2.], [.25, -2.25, 0., 2.]]))
  chex.assert_trees_all_close(metrics["influence"], jnp.array([3 / 4, 2 / 4]))  # mean |A_r|
  reruns = estimator.reruns(3)  # each role's messages replaced, the other turns kept, K times
  assert reruns.changed_CxR == ((True, False, False), (False, True, False), (False, False, True))
  assert (reruns.mode, reruns.samples) == ("replace", 2)


def test_critic_loss_decreases_on_a_fixed_batch():
  # 8 random transcripts, team outcome 1 on half of them: the critic fits them in a few Adam steps.
  estimator = credit.make("critic", learning_rate=1e-2)
  outcome = credit.Outcome(tokens_BxT=jax.random.randint(jax.random.PRNGKey(0), (8, LAYOUT.length), 1, 40),
                           team_B=jnp.array([1., 0., 0., 1., 1., 0., 1., 0.]), role_RxB=None, group_size=2)
  update = sharded(estimator.update)
  state = init(estimator, seed=1)
  # The logged loss is that of the critic before the update.
  q_B = jax.jit(estimator.q)(state["params"], outcome.tokens_BxT)
  initial_loss = jnp.mean((q_B - outcome.team_B) ** 2)
  history = []
  for _ in range(20):
    state, metrics = jax.block_until_ready(update(state, outcome))  # CPU: never queue collectives
    history.append(metrics)
  first, last = history[0], history[-1]
  np.testing.assert_allclose(float(first["critic_loss"]), float(initial_loss), rtol=1e-5)
  assert float(last["critic_loss"]) < 0.2 * float(first["critic_loss"]), (first, last)
  assert float(last["critic_explained_variance"]) > 0.5 > float(first["critic_explained_variance"])
  # loss_weight scales the critic's loss: 0 freezes it.
  start = init(estimator, seed=1)
  after = {w: sharded(dataclasses.replace(estimator, loss_weight=w).update)(start, outcome)[0]["params"]
           for w in (0.0, 1.0)}
  chex.assert_trees_all_equal(after[0.0], start["params"])
  assert float(optax.tree_utils.tree_norm(jax.tree.map(jnp.subtract, after[1.0], start["params"]))) > 1e-2


def test_critic_fit_improves_with_adaptation():
  # The benchmark grades the critic after adaptation batches: on a tiny fixed set with a graded known
  # target (the share of tokens 1..3 below 20: 0, 1/3, 2/3 or 1), each Adam step lowers the loss and
  # raises the rank correlation of Q with the target, from chance to near 1.
  tokens_BxT = jax.random.randint(jax.random.PRNGKey(2), (16, LAYOUT.length), 1, 40)
  outcome = credit.Outcome(tokens_BxT=tokens_BxT, team_B=(tokens_BxT[:, 1:4] < 20).mean(1, dtype=jnp.float32),
                           role_RxB=None, group_size=2)
  estimator = credit.make("critic", learning_rate=1e-2)
  update, q = sharded(estimator.update), jax.jit(estimator.q)
  state = init(estimator, seed=1)
  loss_N, rho_N = [], []
  for _ in range(4):
    rho_N.append(scipy.stats.spearmanr(q(state["params"], tokens_BxT), outcome.team_B).statistic)
    for _ in range(10):
      state, metrics = jax.block_until_ready(update(state, outcome))  # CPU: never queue collectives
      loss_N.append(float(metrics["critic_loss"]))
  rho_N.append(scipy.stats.spearmanr(q(state["params"], tokens_BxT), outcome.team_B).statistic)
  assert loss_N[-1] < 0.1 * loss_N[0] and np.mean(loss_N[-10:]) < np.mean(loss_N[:10]), loss_N
  assert abs(rho_N[0]) < 0.5 and rho_N[-1] > 0.9, rho_N
  assert np.all(np.diff(rho_N[1:]) > -0.1), rho_N  # once it ranks, more steps do not lose the ranking


@pytest.mark.slow  # several compiled programs: the fast tier stays under 4 minutes
def test_critic_knobs_size_its_transformer_and_step_its_adam():
  # Its transformer's size follows d_model, n_layers and d_ff (each grows some weights), and its K.
  size = lambda estimator: sum(x.size for x in jax.tree.leaves(init(estimator)["params"]))
  default = size(credit.make("critic"))
  for knob, value in (("d_model", 16), ("n_layers", 2), ("d_ff", 32)):
    assert size(credit.make("critic", **{knob: value})) != default, knob
  assert credit.make("critic", samples=3).reruns(2).samples == 3
  # Adam's first step moves each parameter with a non-zero gradient by learning_rate exactly (the bias-
  # corrected m / sqrt(v) is g / |g|): the largest move is 0.05, not the default rate's 1e-3.
  estimator = credit.make("critic", learning_rate=0.05)
  outcome = credit.Outcome(tokens_BxT=jax.random.randint(jax.random.PRNGKey(0), (8, LAYOUT.length), 1, 40),
                           team_B=jnp.array([1., 0., 0., 1., 1., 0., 1., 0.]), role_RxB=None, group_size=2)
  state = init(estimator, seed=1)
  new_state, _ = sharded(estimator.update)(state, outcome)
  moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(new_state["params"]),
                                                          jax.tree.leaves(state["params"])))
  np.testing.assert_allclose(moved, 0.05, rtol=1e-3)


@pytest.mark.parametrize("target, prediction, expected", [
    ([0., 1., 0., 1.], [0., 1., 0., 1.], 1.0),  # exact
    ([0., 1., 0., 1.], [.5, .5, .5, .5], 0.0),  # the mean: Var(err) = Var(target) = 1/4
    ([0., 1., 0., 1.], [0., .5, 0., .5], 0.75),  # err [0,1/2,0,1/2]: Var 1/16, over 1/4
    ([1., 1., 1., 1.], [1., 1., 1., 1.], 1.0),  # constant target, predicted exactly
    ([1., 1., 1., 1.], [1., 0., 1., 1.], 0.0),  # constant target, missed
])
def test_critic_explained_variance_by_hand(target, prediction, expected):
  ev = sharded(credit.critic.explained_variance)(jnp.array(target), jnp.array(prediction))
  np.testing.assert_allclose(float(ev), expected, atol=1e-6)


def test_critic_refuses_bad_knobs():
  with pytest.raises(ValueError, match=r"config.credit.d_model=30 must divide by config.credit.n_heads=4"):
    credit.make("critic", d_model=30, n_heads=4).check(2, 2)
  with pytest.raises(ValueError, match=r"config.credit.samples=0; allowed: an integer >= 1"):
    credit.make("critic", samples=0).check(2, 2)
  with pytest.raises(ValueError, match=r"config.credit.learning_rate=0.0; allowed: a number > 0.0"):
    credit.make("critic", learning_rate=0.0).check(2, 2)


@pytest.mark.parametrize("name, key, value", [
    ("critic", "learning_rate", math.nan), ("critic", "learning_rate", math.inf),
    ("critic", "loss_weight", math.nan), ("critic", "outcome_weight", -math.inf),
    ("difference", "outcome_weight", math.nan), ("difference", "credit_weight", math.nan),
    ("shapley", "credit_weight", -1.0)])
def test_credit_weights_and_rates_must_be_finite_and_in_range(name, key, value):
  # NaN once passed `lr <= 0` (False for NaN) and trained nothing, every update skipped.
  with pytest.raises(ValueError, match=rf"config.credit.{key}={value!r}; allowed: a number >"):
    credit.make(name, **{key: value}).check(2, 2)


def test_shapley_permutation_seed_must_be_a_seed():
  # Once accepted, then a crash after the warm start (numpy: "expected non-negative integer").
  with pytest.raises(ValueError, match=r"config.credit.permutation_seed=-1; allowed: an integer >= 0"):
    credit.make("shapley", permutation_seed=-1).check(2, 2)


def _reruns_for(estimator, R, B=4):
  reruns = estimator.reruns(R)
  if reruns is None:
    return None
  # Any transcripts and outcomes in [0, 1] will do for the contract.
  CxKxB = (len(reruns.changed_CxR), reruns.samples, B)
  k_tokens, k_team = jax.random.split(jax.random.PRNGKey(1))
  return credit.Counterfactuals(
      tokens_CxKxBxT=jax.random.randint(k_tokens, CxKxB + (LAYOUT.length,), 0, 20),
      team_CxKxB=jax.random.bernoulli(k_team, 0.5, CxKxB).astype(jnp.float32))


@pytest.mark.parametrize("name", sorted(credit.REGISTRY))
def test_every_registered_estimator_keeps_the_contract(name):
  estimator = credit.make(name)
  estimator.check(2, 2)
  state = init(estimator)
  # Both run inside the sharded step (here, on one device).
  adv_xB, metrics = sharded(estimator.advantages)(state, OUTCOME, _reruns_for(estimator, 2))
  chex.assert_shape(adv_xB, (None if estimator.per_turn else 2, 4))
  chex.assert_tree_all_finite(adv_xB)
  # A stateful estimator's update keeps its state's structure (the step scans over it).
  new_state, update_metrics = sharded(estimator.update)(state, OUTCOME)
  chex.assert_trees_all_equal_shapes_and_dtypes(new_state, state)
  for value in {**metrics, **update_metrics}.values():  # scalars, or one value per role
    assert jnp.ndim(value) == 0 or jnp.shape(value) == (2,)
  assert dataclasses.is_dataclass(estimator) and estimator.__dataclass_params__.frozen
  assert set(credit.knobs(name)) == {f.name for f in dataclasses.fields(estimator)}


def test_unknown_estimator_and_knobs_are_refused_with_the_allowed_values():
  with pytest.raises(ValueError, match=r"config.credit.name='oracle' is unknown; allowed: \[.*'team'"):
    credit.make("oracle")
  with pytest.raises(ValueError, match=r"config.credit has keys \['samples'\] that estimator 'team' does "
                                       r"not take; allowed: \['baseline'\]"):
    credit.make("team", samples=2)
  with pytest.raises(ValueError, match=r"config.credit.counterfactual='maybe' is unknown; allowed: "
                                       r"\['resample', 'absent', 'replace'\]"):
    credit.make("difference", counterfactual="maybe").check(2, 2)
  # A group of one sample is its own baseline: every advantage would be 0.
  for name, baseline in (("team", "dr_grpo"), ("per_role", "grpo")):
    with pytest.raises(ValueError, match=rf"config.credit.baseline='{baseline}' needs config.rl.group_size "
                                         r">= 2 .*allowed with group_size 1: 'none'"):
      credit.make(name, baseline=baseline).check(2, 1)
  with pytest.raises(ValueError, match=r"config.credit.baseline='rloo' needs config.rl.group_size >= 2"):
    credit.make("difference", baseline="rloo").check(2, 1)
  credit.make("team", baseline="none").check(2, 1)
  # Beside a credit term the baselined outcome may be 0 for a group of one: refused only without credit.
  credit.make("difference").check(2, 1)
  with pytest.raises(ValueError, match=r"config.credit.baseline='dr_grpo' needs config.rl.group_size >= 2"):
    credit.make("difference", credit_weight=0.0).check(2, 1)


# Shapley values, pure: the glove game (agent 0 holds a left glove, 1 and 2 right ones; a pair is worth
# 1).  Agent 0 completes a pair whenever it is not first in the order (4 of 6 orders): 2/3; agent 1
# only in the order 0, 1, 2: 1/6, as agent 2.  Removing agent 0 loses the pair, removing 1 or 2 nothing.
def glove(mask_N):
  return (mask_N[0] & (mask_N[1] | mask_N[2])).astype(jnp.float32)


def test_shapley_values_and_difference_rewards_by_hand():
  chex.assert_trees_all_close(jax.jit(credit.shapley_values, static_argnums=(0, 1))(glove, 3),
                              jnp.array([2 / 3, 1 / 6, 1 / 6]))
  chex.assert_trees_all_close(jax.jit(credit.difference_rewards, static_argnums=(0, 1))(glove, 3),
                              jnp.array([1., 0., 0.]))
  # Two orders: in 0, 1, 2 agent 1 completes the pair, in 2, 0, 1 agent 0 does.
  perm_PxN = np.array([[0, 1, 2], [2, 0, 1]])
  values_PxK = jax.jit(jax.vmap(jax.vmap(glove)))(credit.prefix_coalitions(perm_PxN))
  chex.assert_trees_all_close(values_PxK, jnp.array([[0., 0., 1., 1.], [0., 0., 1., 1.]]))
  chex.assert_trees_all_close(credit.shapley_from_permutations(values_PxK, perm_PxN), jnp.array([.5, .5, 0.]))


def _table_game(table_C):
  """The game whose value of coalition mask m is table[sum_i m_i 2^i] (the `coalitions` order)."""
  return lambda mask_N: table_C[(mask_N * 2 ** jnp.arange(mask_N.shape[0])).sum()]


@pytest.mark.parametrize("n", [3, 4, 5])
def test_exact_shapley_axioms_on_random_games(n):
  tables_GxC = jax.random.uniform(jax.random.PRNGKey(n), (3, 2 ** n))
  shapley = jax.jit(jax.vmap(lambda table_C: credit.shapley_values(_table_game(table_C), n)))
  masks_CxN = credit.coalitions(n)
  phi_GxN = shapley(tables_GxC)
  # Efficiency: the values share out v(all) - v(empty).
  chex.assert_trees_all_close(phi_GxN.sum(1), tables_GxC[:, -1] - tables_GxC[:, 0], atol=1e-5)
  # Symmetry: a game that cannot tell agents 0 and 1 apart gives them the same value.
  swapped_C = (masks_CxN[:, [1, 0] + list(range(2, n))] * 2 ** np.arange(n)).sum(1)
  phi_GxN = shapley((tables_GxC + tables_GxC[:, swapped_C]) / 2)
  chex.assert_trees_all_close(phi_GxN[:, 0], phi_GxN[:, 1], atol=1e-6)
  # Dummy: an agent that adds 0.3 to every coalition it joins is worth exactly 0.3.
  without_last_C = np.arange(2 ** n) % 2 ** (n - 1)
  chex.assert_trees_all_close(shapley(tables_GxC[:, without_last_C] + 0.3 * masks_CxN[:, -1])[:, -1],
                              jnp.full(3, 0.3), atol=1e-6)
  # Additivity: the values of a sum of games are the sums of their values.
  chex.assert_trees_all_close(shapley(tables_GxC + tables_GxC[::-1]),
                              shapley(tables_GxC) + shapley(tables_GxC[::-1]), atol=1e-5)


def test_monte_carlo_shapley_converges_to_exact():
  table_C = jax.random.uniform(jax.random.PRNGKey(0), (2 ** 5,))
  exact_N, estimate_N = jax.jit(lambda table_C: (
      credit.shapley_values(_table_game(table_C), 5),
      credit.shapley_values(_table_game(table_C), 5, key=jax.random.PRNGKey(1), num_permutations=2000)
  ))(table_C)
  # Marginal contributions lie in [-1, 1]: the standard error is below 1/sqrt(2000) ~ 0.022.
  chex.assert_trees_all_close(estimate_N, exact_N, atol=0.06)
  # Each order shares out v(all) - v(empty) exactly.
  chex.assert_trees_all_close(estimate_N.sum(), table_C[-1] - table_C[0], atol=1e-5)


def test_shapley_of_10_agents_exact_and_64_by_monte_carlo_under_jit():
  # v(S) = (sum_{j in S} w_j)^2: agent i gains w_i^2 + 2 w_i W_S, and each other agent precedes it with
  # probability 1/2, so phi_i = w_i^2 + w_i (W - w_i) = w_i W.
  w_N = jnp.arange(1., 11.)
  square = lambda w_N: (lambda mask_N: (mask_N * w_N).sum() ** 2)
  phi_N = jax.jit(lambda w_N: credit.shapley_values(square(w_N), 10))(w_N)
  chex.assert_trees_all_close(phi_N, w_N * w_N.sum(), rtol=1e-5)
  w_N = jnp.linspace(0.5, 2.0, 64)
  phi_N = jax.jit(lambda key: credit.shapley_values(square(w_N), 64, key=key, num_permutations=100))(
      jax.random.PRNGKey(0))
  chex.assert_trees_all_close(phi_N.sum(), w_N.sum() ** 2, rtol=1e-5)
  chex.assert_trees_all_close(phi_N, w_N * w_N.sum(), rtol=0.3)  # relative standard error ~0.06


def test_pure_shapley_refuses_monte_carlo_without_key_or_permutations():
  with pytest.raises(ValueError, match=r"num_permutations=0; allowed: None \(exact\) or >= 1"):
    credit.shapley_values(glove, 3, key=jax.random.PRNGKey(0), num_permutations=0)
  with pytest.raises(ValueError, match="needs a key"):
    credit.shapley_values(glove, 3, num_permutations=4)


def shapley_credit(estimator, value_BxC):
  """The `shapley` estimator's phi_RxB when coalition S of episode b is worth value[b, sum_{r in S} 2^r]:
  its re-runs' outcomes looked up in that table (roles outside S are the changed ones)."""
  B, R = value_BxC.shape[0], int(np.log2(value_BxC.shape[1]))
  reruns = estimator.reruns(R)
  assert (reruns.mode, reruns.samples) == ("absent", 1)
  index_C = ((~np.array(reruns.changed_CxR)) * 2 ** np.arange(R)).sum(1)
  outcome = credit.Outcome(tokens_BxT=None, team_B=value_BxC[:, -1], role_RxB=jnp.zeros((R, B)),
                           group_size=2)
  return jax.jit(lambda team_CxKxB: estimator.advantages((), outcome, credit.Counterfactuals(
      None, team_CxKxB)))(value_BxC[:, index_C].T[:, None])


def test_shapley_estimator_by_hand():
  # Coalitions of 2 roles in `coalitions` order: {}, {0}, {1}, {0,1} (the sampled episode, TEAM_B).
  #   row 0: v = 0, 1, 1, 1 (either role suffices): phi = 1/2, 1/2
  #   row 1: all 0: phi = 0, 0
  #   row 2: v = 1, 0, 1, 1 (role 0 alone breaks it): phi_0 = (0-1)/2 + (1-1)/2 = -1/2, phi_1 = 1/2
  #   row 3: v = 0, 0, 0, 1 (both needed): phi = 1/2, 1/2
  value_BxC = jnp.array([[0., 1., 1., 1.], [0., 0., 0., 0.], [1., 0., 1., 1.], [0., 0., 0., 1.]])
  estimator = credit.make("shapley", outcome_weight=0.5, credit_weight=2.0)
  assert estimator.reruns(2).changed_CxR == ((True, True), (False, True), (True, False))
  # 1/2 x the team advantage [1/2,-1/2,0,0] + 2 x phi_r.
  adv_RxB, metrics = shapley_credit(estimator, value_BxC.astype(jnp.float32))
  chex.assert_trees_all_close(adv_RxB, jnp.array([[1.25, -.25, -1., 1.], [1.25, -.25, 1., 1.]]))
  chex.assert_trees_all_close(metrics["influence"], jnp.array([3 / 8, 3 / 8]))  # mean |phi_r|
  assert metrics["reruns_per_episode"] == 3


@pytest.mark.parametrize("R, value_BxC, centred_RxB", [
    # 2 roles, coalitions {}, {0}, {1}, {0,1}; rows 0-1 are one group, rows 2-3 another.
    #   row 0: role 0 alone decides: phi = 1, 0;  row 1: role 1 alone wins, together they lose:
    #   phi_0 = (0-0)/2 + (0-1)/2 = -1/2, phi_1 = 1/2.  Group mean 1/4, 1/4: centred 3/4, -1/4 (sum
    #   1/2 = v(all) 1 - the group's mean 1/2) and -3/4, 1/4 (sum 0 - 1/2).  Rows 2-3: every coalition
    #   0.7: 0.
    (2, [[0, 1, 0, 1], [0, 0, 1, 0], [.7] * 4, [.7] * 4],
     [[.75, -.75, 0, 0], [-.25, .25, 0, 0]]),
    # 3 roles, coalition c = sum of 2^r over its roles.  Row 0: majority (two suffice): phi = 1/3 each.
    #   Row 1: only {0} alone wins: phi_0 = 1/3 (joining nobody), phi_1 = phi_2 = -1/6 (joining {0},
    #   weight 1!1!/3!).  Group mean 1/3, 1/12, 1/12: centred 0, 1/4, 1/4 (sum 1/2 = 1 - 1/2) and 0,
    #   -1/4, -1/4 (sum -1/2 = 0 - 1/2): role 0 did the same in both.  Rows 2-3: every coalition 1: 0.
    (3, [[0, 0, 0, 1, 0, 1, 1, 1], [0, 1, 0, 0, 0, 0, 0, 0], [1] * 8, [1] * 8],
     [[0, 0, 0, 0], [.25, -.25, 0, 0], [.25, -.25, 0, 0]]),
])
def test_centred_shapley_by_hand(R, value_BxC, centred_RxB):
  value_BxC, centred_RxB = jnp.array(value_BxC, jnp.float32), jnp.array(centred_RxB)
  estimator = credit.make("shapley", outcome_weight=0.0, centre="dr_grpo")
  phi_RxB, _ = shapley_credit(estimator, value_BxC)
  chex.assert_trees_all_close(phi_RxB, centred_RxB, atol=1e-6)
  # Efficiency: the credits add up to v(all) minus the group's mean of v(all).
  team_B = value_BxC[:, -1]
  chex.assert_trees_all_close(phi_RxB.sum(0), team_B - jnp.repeat(team_B.reshape(-1, 2).mean(1), 2), atol=1e-6)
  # rloo: the other sample's values, here centred x 2; the sum is v(all) - the other's v(all).
  phi_RxB, _ = shapley_credit(dataclasses.replace(estimator, centre="rloo"), value_BxC)
  chex.assert_trees_all_close(phi_RxB, 2 * centred_RxB, atol=1e-6)
  chex.assert_trees_all_close(phi_RxB.sum(0), team_B - team_B.reshape(-1, 2)[:, ::-1].ravel(), atol=1e-6)


def test_centred_shapley_refuses_grpo_and_groups_of_one():
  with pytest.raises(ValueError, match=r"config.credit.centre='grpo' is unknown; allowed: \['none', "
                                       r"'dr_grpo', 'rloo'\]"):
    credit.make("shapley", centre="grpo").check(2, 2)
  with pytest.raises(ValueError, match=r"config.credit.centre='dr_grpo' needs config.rl.group_size >= 2"):
    credit.make("shapley", centre="dr_grpo").check(2, 1)
  credit.make("shapley").check(2, 1)


def test_shapley_estimator_monte_carlo_reruns_only_the_prefixes():
  # 4 roles above max_exact_roles=3: one order, so the re-runs are its prefixes of size 0..3 and
  # phi is each role's marginal contribution along it.
  value_BxC = jax.random.uniform(jax.random.PRNGKey(0), (4, 16))
  estimator = credit.make("shapley", max_exact_roles=3, num_permutations=1, outcome_weight=0.0)
  (order,) = estimator.plan(4).perm_PxR
  # The orders are numpy's from permutation_seed (default 0): seed 0 draws 2, 0, 1, 3 and seed 2 draws
  # 3, 2, 0, 1.
  np.testing.assert_array_equal(order, [2, 0, 1, 3])
  reseeded = dataclasses.replace(estimator, permutation_seed=2)
  np.testing.assert_array_equal(reseeded.plan(4).perm_PxR, [[3, 2, 0, 1]])
  prefix_K = np.cumsum([0] + [2 ** r for r in order])  # the coalitions' table indices
  assert sorted(((~np.array(estimator.reruns(4).changed_CxR)) * [1, 2, 4, 8]).sum(1)) == sorted(prefix_K[:-1])
  phi_RxB, metrics = shapley_credit(estimator, value_BxC)
  gain_KxB = jnp.diff(value_BxC[:, prefix_K].T, axis=0)
  chex.assert_trees_all_close(phi_RxB[order], gain_KxB, atol=1e-6)
  assert metrics["reruns_per_episode"] == 4
  # Many orders: close to the exact values, with at most 2^4 - 1 distinct re-runs.
  estimator = credit.make("shapley", max_exact_roles=3, num_permutations=400, outcome_weight=0.0)
  phi_RxB, metrics = shapley_credit(estimator, value_BxC)
  exact_BxR = jax.jit(jax.vmap(lambda table_C: credit.shapley_values(_table_game(table_C), 4)))(value_BxC)
  chex.assert_trees_all_close(phi_RxB, exact_BxR.T, atol=0.1)
  assert metrics["reruns_per_episode"] == 15


def test_shapley_estimator_refuses_bad_knobs():
  with pytest.raises(ValueError, match=r"config.credit.num_permutations=0 asks for exact Shapley, but "
                                       r"the protocol has 7 roles > config.credit.max_exact_roles=6"):
    credit.make("shapley", num_permutations=0).check(7, 2)
  credit.make("shapley", num_permutations=0).check(6, 2)
  with pytest.raises(ValueError, match=r"config.credit.num_permutations=-1; allowed: an integer >= 0 "
                                       r"\(0: exact only; "):
    credit.make("shapley", num_permutations=-1).check(2, 2)
  with pytest.raises(ValueError, match=r"config.credit.max_exact_roles=-1; allowed: an integer >= 0"):
    credit.make("shapley", max_exact_roles=-1).check(2, 2)
  with pytest.raises(ValueError, match=r"config.credit.baseline='x' is unknown"):
    credit.make("shapley", baseline="x").check(2, 2)


def test_role_normalized_by_hand():
  S2 = np.sqrt(2.0)
  # Team: dr_grpo of [1,0 | 1,1] is [1/2,-1/2 | 0,0] for both roles: mean 0, std sqrt(1/8) = 1/(2 sqrt2).
  adv_RxB, metrics = sharded(credit.make("role_normalized").advantages)((), OUTCOME, None)
  chex.assert_trees_all_close(adv_RxB, jnp.array([[S2, -S2, 0., 0.]] * 2), atol=1e-5)
  chex.assert_trees_all_close(metrics["advantage_std"], jnp.full(2, 1 / (2 * S2)))
  # Own signals, no group baseline: role 0 [1,0,0,1] has mean 1/2, std 1/2 -> [1,-1,-1,1];
  # role 1 [1,1,0,1] has mean 3/4, std sqrt3/4 -> [1/sqrt3, 1/sqrt3, -sqrt3, 1/sqrt3].
  estimator = credit.make("role_normalized", signal="role", baseline="none")
  adv_RxB, _ = sharded(estimator.advantages)((), OUTCOME, None)
  chex.assert_trees_all_close(adv_RxB, jnp.array([[1., -1., -1., 1.], [1 / S3, 1 / S3, -S3, 1 / S3]]),
                              atol=1e-5)
  with pytest.raises(ValueError, match=r"config.credit.signal='x' is unknown; allowed: \['team', 'role'\]"):
    credit.make("role_normalized", signal="x").check(2, 2)


@pytest.mark.parametrize("baseline", ["dr_grpo", "none"])
def test_role_normalized_of_equal_rewards_is_zero(baseline):
  # Every team reward 0.7: no signal.  Standardising the rounding of a one-pass variance once gave
  # every row -0.12 (while logging advantage_std 0).
  outcome = credit.Outcome(tokens_BxT=jnp.zeros((64, LAYOUT.length), jnp.int32), team_B=jnp.full(64, 0.7),
                           role_RxB=jnp.full((2, 64), 0.7), group_size=8)
  adv_RxB, metrics = sharded(credit.make("role_normalized", baseline=baseline).advantages)((), outcome, None)
  assert (adv_RxB == 0).all() and (metrics["advantage_std"] == 0).all()
