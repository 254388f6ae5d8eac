"""Token-level losses against values worked out by hand."""
import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from marl_jax import losses

CLIP = 0.2
RL = ml_collections.ConfigDict(dict(clip_eps=CLIP))


def policy_loss_BxT(name, logp_BxT, old_logp_BxT, adv_BxT):
  """The registered loss `name` on these tokens (every token role 0's, one group per row)."""
  x = losses.LossInput(logp_BxT=logp_BxT, old_logp_BxT=old_logp_BxT, ref_logp_BxT=None,
                       adv_BxT=adv_BxT, role_mask_RxBxT=jnp.ones((1,) + logp_BxT.shape, bool),
                       group_B=jnp.arange(logp_BxT.shape[0]))
  return losses.REGISTRY.lookup(name)(x, RL)
# (ratio, advantage) -> PPO-clip loss -min(ratio A, clip(ratio, 0.8, 1.2) A), and d loss / d logp.
PPO_CASES = [
    (1.1, 2.0, -2.2, -2.2),  # inside the range: -ratio A, gradient -ratio A
    (1.5, 2.0, -2.4, 0.0),  # above, A > 0: clipped to -1.2 * 2, no gradient
    (1.5, -2.0, 3.0, 3.0),  # above, A < 0: the unclipped (worse) term -1.5 * -2 stays
    (0.5, 2.0, -1.0, -1.0),  # below, A > 0: the unclipped term -0.5 * 2 stays
    (0.5, -2.0, 1.6, 0.0),  # below, A < 0: clipped to -0.8 * -2, no gradient
    (0.9, -1.0, 0.9, 0.9),  # inside, A < 0
]


def test_ppo_clip_by_hand():
  ratio_1xN, adv_1xN, loss_1xN, grad_1xN = (jnp.array([c]) for c in zip(*PPO_CASES))
  old_logp = jnp.full_like(ratio_1xN, -1.3)
  logp = old_logp + jnp.log(ratio_1xN)
  loss = policy_loss_BxT("ppo", logp, old_logp, adv_1xN)
  chex.assert_shape(loss, (1, len(PPO_CASES)))
  chex.assert_trees_all_close(loss, loss_1xN, atol=1e-5)
  grad = jax.grad(lambda lp: policy_loss_BxT("ppo", lp, old_logp, adv_1xN).sum())(logp)
  chex.assert_trees_all_close(grad, grad_1xN, atol=1e-5)


def test_ppo_on_policy_equals_reinforce_gradient():
  # At ratio 1 (the first minibatch of an epoch) PPO's gradient is REINFORCE's: -A.
  logp = jnp.array([[-0.5, -2.0, -1.0]])
  adv = jnp.array([[2.0, -1.0, 0.5]])
  g_ppo = jax.grad(lambda lp: policy_loss_BxT("ppo", lp, logp, adv).sum())(logp)
  g_pg = jax.grad(lambda lp: policy_loss_BxT("reinforce", lp, logp, adv).sum())(logp)
  chex.assert_trees_all_close(g_ppo, -adv)
  chex.assert_trees_all_close(g_pg, -adv)


def test_reinforce_by_hand():
  # -logp A: -(-0.5)(2) = 1;  -(-2)(-1) = -2;  -(-1)(0.5) = 0.5
  loss = policy_loss_BxT("reinforce", jnp.array([[-0.5, -2.0, -1.0]]), jnp.zeros((1, 3)),
                         jnp.array([[2.0, -1.0, 0.5]]))
  chex.assert_trees_all_close(loss, jnp.array([[1.0, -2.0, 0.5]]))


def test_k3_kl_by_hand():
  # d = ref - logp; k3 = exp(d) - d - 1:  d=-1: e^-1 = 0.36787944;  d=0: 0;  d=1: e - 2 = 0.71828183
  logp = jnp.array([-1.0, -1.5, -2.0])
  ref = jnp.array([-2.0, -1.5, -1.0])
  chex.assert_trees_all_close(losses.kl_to_reference(logp, ref), jnp.array([0.36787944, 0.0, 0.71828183]),
                              atol=1e-6)
  # Non-negative everywhere, and an unbiased estimate of KL(pi || ref) under samples from pi:
  # pi = [0.5, 0.5], ref = [0.9, 0.1]: E_pi[k3] = KL = 0.5 log(0.5/0.9) + 0.5 log(0.5/0.1) = 0.5108256
  p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
  k3 = losses.kl_to_reference(jnp.log(p), jnp.log(q))
  assert np.all(np.asarray(k3) >= 0)
  np.testing.assert_allclose(float((p * k3).sum()), 0.5108256, atol=1e-6)


@pytest.mark.parametrize("name", sorted(losses.REGISTRY))
def test_every_registered_loss_keeps_the_contract(name):
  # Per-token, finite, and at ratio 1 its gradient pushes up the log-prob of tokens with A > 0 and
  # down those with A < 0 (the sign every policy-gradient loss must have on-policy).
  key_lp, key_adv = jax.random.split(jax.random.PRNGKey(0))
  logp_BxT = -jax.random.uniform(key_lp, (3, 5), minval=0.1, maxval=3.0)
  adv_BxT = jax.random.normal(key_adv, (3, 5))
  loss_BxT = policy_loss_BxT(name, logp_BxT, logp_BxT, adv_BxT)
  chex.assert_shape(loss_BxT, (3, 5))
  chex.assert_tree_all_finite(loss_BxT)
  grad_BxT = jax.grad(lambda lp: policy_loss_BxT(name, lp, logp_BxT, adv_BxT).sum())(logp_BxT)
  np.testing.assert_array_equal(np.sign(grad_BxT), -np.sign(adv_BxT))


def test_unknown_loss_is_refused_with_the_allowed_names():
  with pytest.raises(ValueError, match=r"config.rl.algorithm='dpo' is unknown; allowed: \['ppo', 'reinforce'\]"):
    losses.REGISTRY.lookup("dpo")
