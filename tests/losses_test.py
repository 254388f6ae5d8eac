"""Token-level losses against values worked out by hand."""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import losses

CLIP = 0.2
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
  loss = losses.policy_loss_BxT("ppo", logp, old_logp, adv_1xN, CLIP)
  chex.assert_shape(loss, (1, len(PPO_CASES)))
  chex.assert_trees_all_close(loss, loss_1xN, atol=1e-5)
  grad = jax.grad(lambda lp: losses.policy_loss_BxT("ppo", lp, old_logp, adv_1xN, CLIP).sum())(logp)
  chex.assert_trees_all_close(grad, grad_1xN, atol=1e-5)


def test_ppo_on_policy_equals_reinforce_gradient():
  # At ratio 1 (the first minibatch of an epoch) PPO's gradient is REINFORCE's: -A.
  logp = jnp.array([-0.5, -2.0, -1.0])
  adv = jnp.array([2.0, -1.0, 0.5])
  g_ppo = jax.grad(lambda lp: losses.policy_loss_BxT("ppo", lp, logp, adv, CLIP).sum())(logp)
  g_pg = jax.grad(lambda lp: losses.policy_loss_BxT("reinforce", lp, logp, adv, CLIP).sum())(logp)
  chex.assert_trees_all_close(g_ppo, -adv)
  chex.assert_trees_all_close(g_pg, -adv)


def test_reinforce_by_hand():
  # -logp A: -(-0.5)(2) = 1;  -(-2)(-1) = -2;  -(-1)(0.5) = 0.5
  loss = losses.policy_loss_BxT("reinforce", jnp.array([-0.5, -2.0, -1.0]), jnp.zeros(3),
                                jnp.array([2.0, -1.0, 0.5]), CLIP)
  chex.assert_trees_all_close(loss, jnp.array([1.0, -2.0, 0.5]))


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


def test_masked_mean_per_role():
  x_BxT = jnp.array([[1., 2., 3.], [4., 5., 6.]])
  mask_RxBxT = jnp.array([[[1, 1, 0], [0, 0, 0]],  # role 0: (1 + 2) / 2 = 1.5
                          [[0, 0, 1], [1, 0, 1]],  # role 1: (3 + 4 + 6) / 3 = 13/3
                          [[0, 0, 0], [0, 0, 0]]], jnp.float32)  # role 2 wrote nothing: 0
  out_R = losses.masked_mean_per_role(x_BxT, mask_RxBxT)
  chex.assert_shape(out_R, (3,))
  chex.assert_trees_all_close(out_R, jnp.array([1.5, 13 / 3, 0.0]))
