"""Credit assignment: every group baseline and credit kind against examples worked out by hand."""
import chex
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from marl_jax import credit

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
  with pytest.raises(ValueError, match=r"config.rl.baseline='ppo' is unknown; allowed: \['grpo'"):
    credit.group_advantage(R_B, G, "ppo")


# Credit kinds, two roles, G=2 (two groups): team outcome and each role's own verifiable signal.
TEAM_B = jnp.array([1., 0., 1., 1.])
ROLE_RxB = jnp.array([[1., 0., 0., 1.],
                      [1., 1., 0., 1.]])
# Team outcome with role r's messages re-drawn, K=2 times: team_RxKxB.
CF_RxKxB = jnp.array([[[0., 0., 1., 0.], [1., 0., 1., 0.]],
                      [[1., 0., 0., 1.], [1., 0., 0., 1.]]])


def _rl(credit_kind, outcome_weight=1.0, credit_weight=1.0):
  return ml_collections.ConfigDict(dict(group_size=2, baseline="dr_grpo", credit=credit_kind,
                                        outcome_weight=outcome_weight, credit_weight=credit_weight))


def _rewards():
  return {"team_B": TEAM_B, "role_RxB": ROLE_RxB}


def test_team_credit():
  # dr_grpo of the team outcome [1,0 | 1,1] is [1/2,-1/2 | 0,0], given to both roles.
  adv_RxB = credit.advantages(_rl("team"), _rewards())
  chex.assert_trees_all_close(adv_RxB, jnp.array([[.5, -.5, 0., 0.], [.5, -.5, 0., 0.]]))


def test_per_role_credit():
  # role 0 [1,0 | 0,1] -> [1/2,-1/2 | -1/2,1/2];  role 1 [1,1 | 0,1] -> [0,0 | -1/2,1/2].
  adv_RxB = credit.advantages(_rl("per_role"), _rewards())
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
  adv_RxB = credit.advantages(_rl("difference", outcome_weight=0.5, credit_weight=2.0), _rewards(),
                              CF_RxKxB)
  chex.assert_trees_all_close(adv_RxB, jnp.array([[1.25, -.25, 0., 2.], [.25, -.25, 2., 0.]]))


def test_unknown_credit():
  with pytest.raises(ValueError, match=r"config.rl.credit='shapley' is unknown; allowed: \['team'"):
    credit.advantages(_rl("shapley"), _rewards())
