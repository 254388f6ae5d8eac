"""The update's per-role losses: each role's surrogate averaged over its own tokens, plus the k3 KL to
the base model and the entropy bonus, checked against the same quantities computed by hand."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from marl_jax import experiment, losses, parallel, rollout, sampling, state, update
from train_test import tiny_config


def test_role_losses_add_kl_and_entropy_per_role():
  config = tiny_config(**{"protocol.name": "solver_verifier", "task.num_ops": 1, "sft.steps": 0,
                          "rl.kl_coef": 0.5, "rl.entropy_coef": 0.1})
  exp = experiment.build(config)
  B = 8
  params_R = state.init_state(exp, jax.random.PRNGKey(0)).params
  ref_params_R = state.init_state(exp, jax.random.PRNGKey(1)).params  # another "base model"
  problems = jax.vmap(exp.task.sample)(jax.random.split(jax.random.PRNGKey(2), B))
  episodes = jax.jit(lambda p, k: rollout.sample(exp, p, problems, k))(
      params_R, jax.random.split(jax.random.PRNGKey(3), B))
  log_probs = jax.jit(lambda p, t: sampling.token_log_probs(exp.model, exp.layout, p, t, 1.0))
  layout = exp.layout
  role_mask_BxRxT = episodes.sampled_BxT[:, None] & (layout.author_T[None, None] == np.arange(2)[None, :, None])
  adv_BxT = jnp.where(episodes.sampled_BxT, jnp.linspace(-1, 1, B)[:, None], 0.0)
  ref_logp_BxT, _ = log_probs(ref_params_R, episodes.tokens_BxT)
  batch = update.Batch(tokens_BxT=episodes.tokens_BxT, old_logp_BxT=episodes.logp_BxT,
                       ref_logp_BxT=ref_logp_BxT, adv_BxT=adv_BxT, role_mask_BxRxT=role_mask_BxRxT,
                       group_B=jnp.arange(B) // 4)
  mesh = jax.make_mesh((1,), (parallel.DATA,))
  losses_fn = jax.jit(jax.shard_map(lambda b: update.role_losses(exp, params_R, b, 1), mesh=mesh,
                                    in_specs=P(), out_specs=P(), check_vma=False))
  loss_R, aux = losses_fn(batch)

  # By hand: per role r, the mean over r's sampled tokens of ppo + 0.5 k3 - 0.1 entropy.
  logp_BxT, entropy_BxT = log_probs(params_R, episodes.tokens_BxT)
  x = losses.LossInput(logp_BxT, episodes.logp_BxT, ref_logp_BxT, adv_BxT, None, None)
  per_token_BxT = (losses.ppo(x, config.rl) + 0.5 * losses.kl_to_reference(logp_BxT, ref_logp_BxT)
                   - 0.1 * entropy_BxT)
  for r in range(2):
    mask_BxT = np.asarray(role_mask_BxRxT[:, r])
    assert mask_BxT.sum() > 0
    mean = lambda v: float(np.asarray(v)[mask_BxT].mean())
    np.testing.assert_allclose(loss_R[r], mean(per_token_BxT), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(aux["kl_to_base"][r], mean(losses.kl_to_reference(logp_BxT, ref_logp_BxT)),
                               rtol=1e-5)
    np.testing.assert_allclose(aux["entropy"][r], mean(entropy_BxT), rtol=1e-5)
  assert float(aux["kl_to_base"].min()) > 0  # two different models: the KL term is not vacuous
