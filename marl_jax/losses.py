"""Token-level policy-gradient losses over sampled tokens, one loss per role."""
import jax.numpy as jnp

ALGORITHMS = ("ppo", "reinforce")


def policy_loss_BxT(algorithm: str, logp_BxT, old_logp_BxT, adv_BxT, clip_eps: float):
  """Per-token surrogate (to minimise).  PPO-clip: -min(ratio A, clip(ratio) A);
  REINFORCE: -logp A (its gradient is the plain score-function estimator)."""
  if algorithm == "reinforce":
    return -logp_BxT * adv_BxT
  ratio = jnp.exp(logp_BxT - old_logp_BxT)
  clipped = jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps)
  return -jnp.minimum(ratio * adv_BxT, clipped * adv_BxT)


def kl_to_reference(logp_BxT, ref_logp_BxT):
  """k3 estimator of KL(pi || ref) on tokens sampled from pi: exp(d) - d - 1, d = ref - logp."""
  d = ref_logp_BxT - logp_BxT
  return jnp.exp(d) - d - 1


def masked_mean_per_role(x_BxT, role_mask_RxBxT):
  """Mean of x over each role's tokens: x_R (0 for a role with no tokens)."""
  total = jnp.einsum("bt,rbt->r", x_BxT, role_mask_RxBxT)
  return total / jnp.maximum(role_mask_RxBxT.sum((1, 2)), 1)
