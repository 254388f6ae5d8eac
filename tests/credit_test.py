"""Credit estimators: every group baseline and estimator against examples worked out by hand, one
contract every registered estimator keeps, and the registry's errors."""
import dataclasses

import jax
import chex
import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import credit, protocols
from marl_jax.tasks import Arithmetic

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


def test_grpo_of_a_constant_group_is_zero():
  # All four right: no signal, and the eps keeps 0/0 finite.
  chex.assert_trees_all_close(credit.group_advantage(jnp.ones(4), 4, "grpo"), jnp.zeros(4))


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


def advantages(name, team_CxKxB=None, **knobs):
  estimator = credit.make(name, **knobs)
  counterfactuals = None if team_CxKxB is None else credit.Counterfactuals(None, team_CxKxB)
  return estimator.advantages(estimator.init(jax.random.PRNGKey(0), LAYOUT), OUTCOME, counterfactuals)


def test_team_credit():
  # dr_grpo of the team outcome [1,0 | 1,1] is [1/2,-1/2 | 0,0], given to both roles.
  adv_RxB, _ = advantages("team")
  chex.assert_trees_all_close(adv_RxB, jnp.array([[.5, -.5, 0., 0.], [.5, -.5, 0., 0.]]))


def test_per_role_credit():
  # role 0 [1,0 | 0,1] -> [1/2,-1/2 | -1/2,1/2];  role 1 [1,1 | 0,1] -> [0,0 | -1/2,1/2].
  adv_RxB, _ = advantages("per_role")
  chex.assert_trees_all_close(adv_RxB, jnp.array([[.5, -.5, -.5, .5], [0., 0., -.5, .5]]))


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
  # decay 0.5, team signal.  Step 1: no history, baseline 0: A = team = [1,0,1,1] for both roles;
  # then ema = 0.5 * 0 + 0.5 * mean(team) = 0.375, bias-corrected by 1 - 0.5 = 0.5: baseline 0.75.
  # Step 2 (same outcome): A = team - 0.75 = [.25,-.75,.25,.25]; ema = 0.5 * .375 + 0.5 * .75 = .5625,
  # corrected by 1 - 0.25: baseline 0.75 (a constant reward is its own average).
  estimator = credit.make("role_baseline", decay=0.5)
  update = sharded(estimator.update)
  state = estimator.init(jax.random.PRNGKey(0), LAYOUT)
  adv_RxB, _ = estimator.advantages(state, OUTCOME, None)
  chex.assert_trees_all_close(adv_RxB, jnp.stack([TEAM_B, TEAM_B]))
  state, _ = update(state, OUTCOME)
  chex.assert_trees_all_close(estimator.baseline_R(state), jnp.array([.75, .75]))
  adv_RxB, metrics = estimator.advantages(state, OUTCOME, None)
  chex.assert_trees_all_close(adv_RxB, jnp.stack([TEAM_B - .75] * 2))
  chex.assert_trees_all_close(metrics["baseline"], jnp.array([.75, .75]))
  state, _ = update(state, OUTCOME)
  chex.assert_trees_all_close(estimator.baseline_R(state), jnp.array([.75, .75]))
  # With each role's own signal, after one update: role 0's mean is 1/2, role 1's 3/4.
  by_role = credit.make("role_baseline", decay=0.5, signal="role")
  state, _ = sharded(by_role.update)(by_role.init(jax.random.PRNGKey(0), LAYOUT), OUTCOME)
  chex.assert_trees_all_close(by_role.baseline_R(state), jnp.array([.5, .75]))


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
  state = estimator.init(jax.random.PRNGKey(0), LAYOUT)
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
  with pytest.raises(ValueError, match=r"config.credit.baseline='rloo' needs config.rl.group_size >= 2"):
    credit.make("per_role", baseline="rloo").check(2, 1)
