"""Token-level policy losses, registered by name (`config.rl.algorithm`), over one typed input.

A loss maps a `LossInput` and the static `config.rl` to a per-token surrogate to minimise, loss_BxT;
the update averages it over each role's sampled tokens.  A new loss is a function here with
`@register("name")`; it may read any field of `LossInput` and its own `config.rl` keys.
"""
import flax
import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks, registry


@flax.struct.dataclass
class LossInput:
  logp_BxT: jax.Array  # log-probs of the sampled tokens under the parameters being trained
  old_logp_BxT: jax.Array  # ... under the parameters that sampled them
  ref_logp_BxT: jax.Array | None  # ... under the warm-started base model (when a KL term is on)
  adv_BxT: jax.Array  # each token's advantage (its role's or its turn's credit)
  role_mask_RxBxT: jax.Array  # token t of row b was sampled by role r
  group_B: jax.Array  # the problem each row samples (rows of a group share it)


REGISTRY = registry.Registry("rl.algorithm", "loss")  # name -> (LossInput, config.rl) -> per-token loss_BxT
register = REGISTRY.register


@register("ppo")
def ppo(x: LossInput, rl) -> jax.Array:
  """PPO-clip: -min(ratio A, clip(ratio, 1 -+ clip_eps) A)."""
  ratio = jnp.exp(x.logp_BxT - x.old_logp_BxT)
  clipped = jnp.clip(ratio, 1 - rl.clip_eps, 1 + rl.clip_eps)
  return -jnp.minimum(ratio * x.adv_BxT, clipped * x.adv_BxT)


@register("reinforce")
def reinforce(x: LossInput, rl) -> jax.Array:
  """-logp A: its gradient is the plain score-function estimator."""
  del rl
  return -x.logp_BxT * x.adv_BxT


def entropy_coef_R(rl, roles: tuple[str, ...]) -> np.ndarray:
  """Each role's entropy-bonus coefficient: `rl.entropy_coef` for the roles `rl.entropy_roles` names
  (comma-separated; '' is every role), 0 for the others, so that one role's exploration (a judge's,
  say) can be kept up without flattening the others' policies."""
  named = checks.role_names("rl.entropy_roles", rl.entropy_roles, roles) or roles
  return np.array([rl.entropy_coef if r in named else 0.0 for r in roles], np.float32)


def kl_to_reference(logp_BxT, ref_logp_BxT):
  """k3 estimator of KL(pi || ref) on tokens sampled from pi: exp(d) - d - 1, d = ref - logp."""
  d = ref_logp_BxT - logp_BxT
  return jnp.exp(d) - d - 1


def brier_loss(p, label):
  """(p - label)^2: the quadratic (Brier) loss of a probability against a 0/1 label, proper: its
  expectation under label ~ Bernoulli(q) is q (1 - q) + (p - q)^2, least at p = q (Brier 1950)."""
  return (p - label) ** 2


# Keeps the log loss finite where a judge puts all its mass on one end.
LOG_LOSS_EPS = 1e-6


def log_loss(p, label):
  """-log of the probability p gives the label: the logarithmic loss, proper (its expectation under
  label ~ Bernoulli(q) is the cross-entropy of q and p, least at p = q; Good 1952)."""
  p = jnp.clip(p, LOG_LOSS_EPS, 1 - LOG_LOSS_EPS)
  return -(label * jnp.log(p) + (1 - label) * jnp.log1p(-p))


# `config.reward.judge_loss`: a proper score of a judge's probability against the labelled answers.
JUDGE_LOSSES = {"brier": brier_loss, "log": log_loss}
