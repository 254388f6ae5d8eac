"""The update's per-role losses: each role's surrogate averaged over its own tokens, plus the k3 KL to
the base model and the entropy bonus, checked against the same quantities computed by hand."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from marl_jax import experiment, losses, parallel, rollout, sampling, update
from train_test import compiled_init_state, tiny_config


def _solver_verifier_batch(exp, B: int):
  """params_R and an update Batch of B sampled solver-verifier episodes with made-up advantages and
  another random model as the KL reference."""
  params_R = compiled_init_state(exp, jax.random.PRNGKey(0)).params
  ref_params_R = compiled_init_state(exp, jax.random.PRNGKey(1)).params  # another "base model"
  problems = exp.task.sample_batch(jax.random.split(jax.random.PRNGKey(2), B))
  episodes = jax.jit(lambda p, k: rollout.sample(exp, p, problems, k))(
      params_R, jax.random.split(jax.random.PRNGKey(3), B))
  role_mask_BxRxT = episodes.sampled_BxT[:, None] & (
      exp.layout.author_T[None, None] == np.arange(2)[None, :, None])
  adv_BxT = jnp.where(episodes.sampled_BxT, jnp.linspace(-1, 1, B)[:, None], 0.0)
  ref_logp_BxT, _ = jax.jit(lambda p, t: sampling.token_log_probs(exp.model, exp.layout, p, t, 1.0))(
      ref_params_R, episodes.tokens_BxT)
  return params_R, update.Batch(tokens_BxT=episodes.tokens_BxT, old_logp_BxT=episodes.logp_BxT,
                                ref_logp_BxT=ref_logp_BxT, adv_BxT=adv_BxT, role_mask_BxRxT=role_mask_BxRxT,
                                group_B=jnp.arange(B) // 4)


def on_one_device(fn):
  """fn jitted on a one-device data mesh (the update's collectives need the axis)."""
  mesh = jax.make_mesh((1,), (parallel.DATA,))
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))


def test_role_losses_add_kl_and_entropy_per_role():
  # A temperature other than 1, so that the losses must read config.rl.temperature.
  config = tiny_config(**{"protocol.name": "solver_verifier", "task.num_ops": 1, "sft.steps": 0,
                          "rl.kl_coef": 0.5, "rl.entropy_coef": 0.1, "rl.temperature": 1.3})
  exp = experiment.build(config)
  params_R, batch = _solver_verifier_batch(exp, 8)
  # Off-policy by a made-up amount, so that the PPO ratio and approx_kl are not trivially 1 and 0.
  sampled_BxT = batch.role_mask_BxRxT.any(1)
  shift_BxT = jnp.where(sampled_BxT, 0.2 * jnp.sin(jnp.arange(sampled_BxT.size)).reshape(sampled_BxT.shape), 0.0)
  batch = batch.replace(old_logp_BxT=batch.old_logp_BxT + shift_BxT)
  ref_logp_BxT = batch.ref_logp_BxT
  loss_R, aux = on_one_device(lambda b: update.role_losses(exp, params_R, b, update.token_counts(b, 1)))(batch)

  # By hand: per role r, the mean over r's sampled tokens of ppo + 0.5 k3 - 0.1 entropy.
  logp_BxT, entropy_BxT = jax.jit(lambda p, t: sampling.token_log_probs(exp.model, exp.layout, p, t, 1.3))(
      params_R, batch.tokens_BxT)
  x = losses.LossInput(logp_BxT, batch.old_logp_BxT, ref_logp_BxT, batch.adv_BxT, None, None)
  per_token_BxT = (losses.ppo(x, config.rl) + 0.5 * losses.kl_to_reference(logp_BxT, ref_logp_BxT)
                   - 0.1 * entropy_BxT)
  for r in range(2):
    mask_BxT = np.asarray(batch.role_mask_BxRxT[:, r])
    assert mask_BxT.sum() > 0
    mean = lambda v: float(np.asarray(v)[mask_BxT].mean())
    np.testing.assert_allclose(loss_R[r], mean(per_token_BxT), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(aux.kl_to_base_R[r], mean(losses.kl_to_reference(logp_BxT, ref_logp_BxT)),
                               rtol=1e-5)
    np.testing.assert_allclose(aux.entropy_R[r], mean(entropy_BxT), rtol=1e-5)
    np.testing.assert_allclose(aux.approx_kl_R[r], mean(batch.old_logp_BxT - logp_BxT), rtol=1e-5, atol=1e-7)
  assert float(aux.kl_to_base_R.min()) > 0  # two different models: the KL term is not vacuous
  assert float(jnp.abs(aux.approx_kl_R).min()) > 1e-3  # off-policy: approx_kl is not vacuous

  # The gradient too: the KL and entropy terms pull the parameters (a stop_gradient on either keeps
  # every value above but trains only the surrogate).
  def by_hand(p):
    logp_BxT, entropy_BxT = sampling.token_log_probs(exp.model, exp.layout, p, batch.tokens_BxT, 1.3)
    x = losses.LossInput(logp_BxT, batch.old_logp_BxT, ref_logp_BxT, batch.adv_BxT, None, None)
    per_token_BxT = (losses.ppo(x, config.rl) + 0.5 * losses.kl_to_reference(logp_BxT, ref_logp_BxT)
                     - 0.1 * entropy_BxT)
    mask_RxBxT = jnp.moveaxis(batch.role_mask_BxRxT, 1, 0)
    return ((per_token_BxT * mask_RxBxT).sum((1, 2)) / mask_RxBxT.sum((1, 2))).sum()
  expected = jax.jit(jax.grad(by_hand))(params_R)
  grads = on_one_device(lambda b: jax.grad(
      lambda p: update.role_losses(exp, p, b, update.token_counts(b, 1))[0].sum())(params_R))(batch)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(expected))
  for g, g_expected in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
    np.testing.assert_allclose(g, g_expected, rtol=1e-4, atol=1e-5 * scale)


def test_entropy_roles_give_the_bonus_to_the_named_roles_only():
  config = tiny_config(**{"protocol.name": "solver_verifier", "task.num_ops": 1, "sft.steps": 0,
                          "rl.entropy_coef": 0.1, "rl.entropy_roles": "verifier"})
  exp = experiment.build(config)
  np.testing.assert_allclose(losses.entropy_coef_R(config.rl, exp.layout.roles), [0.0, 0.1])
  params_R, batch = _solver_verifier_batch(exp, 8)
  loss_R, aux = on_one_device(lambda b: update.role_losses(exp, params_R, b, update.token_counts(b, 1)))(batch)
  config.rl.entropy_roles = ""
  every_R, _ = on_one_device(lambda b: update.role_losses(experiment.build(config), params_R, b,
                                                         update.token_counts(b, 1)))(batch)
  # The solver's loss is its surrogate alone; the verifier's keeps its bonus (0.1 x its mean entropy).
  np.testing.assert_allclose(loss_R[0], every_R[0] + 0.1 * aux.entropy_R[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(loss_R[1], every_R[1], rtol=1e-6)
  assert float(aux.entropy_R[0]) > 0.1  # an untrained policy: the term is not vacuous


def test_an_entropy_role_that_is_not_a_role_is_refused_with_the_roles():
  config = tiny_config(**{"protocol.name": "solver_verifier", "rl.entropy_roles": "solver,judge"})
  with pytest.raises(ValueError, match=r"entropy_roles='solver,judge' names \['judge'\].*'solver', 'verifier'"):
    experiment.build(config)


@pytest.mark.slow  # several compiled programs: the fast tier stays under 4 minutes
def test_microbatches_sum_to_the_minibatch_gradient():
  """rl.microbatch_size=2 runs an 8-row minibatch through the model two rows at a time and sums the
  gradients: the gradient of one pass (to float rounding), with the same losses and diagnostics."""
  out = {}
  for micro in (0, 2):
    exp = experiment.build(tiny_config(**{"protocol.name": "solver_verifier", "task.num_ops": 1,
                                          "sft.steps": 0, "rl.kl_coef": 0.5, "rl.entropy_coef": 0.1,
                                          "rl.minibatches": 1, "rl.microbatch_size": micro}))
    params_R, batch = _solver_verifier_batch(exp, 8)
    out[micro] = on_one_device(lambda p, b: update.minibatch_gradient(exp, p, b, 1))(params_R, batch)
  (whole, whole_loss_R, whole_aux), (parts, parts_loss_R, parts_aux) = out[0], out[2]
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(whole))
  assert scale > 1e-3
  for g_whole, g_parts in zip(jax.tree.leaves(whole), jax.tree.leaves(parts)):
    np.testing.assert_allclose(g_parts, g_whole, rtol=1e-4, atol=1e-5 * scale)
  # Both are the gradient of the sum over roles of their losses: every role's loss trains.
  total = on_one_device(lambda p, b: jax.grad(
      lambda p: update.role_losses(exp, p, b, update.token_counts(b, 1))[0].sum())(p))(params_R, batch)
  for g_whole, g_total in zip(jax.tree.leaves(whole), jax.tree.leaves(total)):
    np.testing.assert_allclose(g_whole, g_total, rtol=1e-4, atol=1e-5 * scale)
  np.testing.assert_allclose(parts_loss_R, whole_loss_R, rtol=1e-5, atol=1e-7)
  for key in ("entropy_R", "kl_to_base_R", "approx_kl_R"):
    np.testing.assert_allclose(getattr(parts_aux, key), getattr(whole_aux, key), rtol=1e-5, atol=1e-6)  # approx_kl ~ 0


def test_a_microbatch_size_of_the_whole_minibatch_or_more_is_one_pass():
  """rl.microbatch_size caps a pass's rows: at or above the per-device minibatch (a config written for
  fewer devices) it runs the minibatch in one pass, the same program as 0; else it must divide it."""
  assert [parallel.rows_per_pass(m, 8) for m in (0, 2, 8, 64)] == [8, 2, 8, 8]
  grads = {}
  for micro in (0, 64):
    exp = experiment.build(tiny_config(**{"protocol.name": "solver_verifier", "task.num_ops": 1,
                                          "sft.steps": 0, "rl.minibatches": 1, "rl.microbatch_size": micro}))
    params_R, batch = _solver_verifier_batch(exp, 8)
    grads[micro] = on_one_device(lambda p, b: update.minibatch_gradient(exp, p, b, 1)[0])(params_R, batch)
  for g_whole, g_capped in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[64])):
    np.testing.assert_array_equal(g_capped, g_whole)


def test_role_grad_norms_are_each_roles_gradient_alone():
  # The norm of the gradient of each role's loss alone, on the first minibatch: grad_norm_share's input.
  exp = experiment.build(tiny_config(**{"protocol.name": "solver_verifier", "task.num_ops": 1, "sft.steps": 0,
                                        "rl.minibatches": 2}))
  params_R, batch = _solver_verifier_batch(exp, 8)
  norms_R = on_one_device(lambda p, b: update.role_grad_norms(exp, p, b, 1))(params_R, batch)
  first = jax.tree.map(lambda x: x[update.minibatch_rows(exp, 8)[0]], batch)
  role_loss = lambda p, r: update.role_losses(exp, p, first, update.token_counts(first, 1))[0][r]
  alone_R = [on_one_device(lambda p, r=r: optax.tree_utils.tree_norm(jax.grad(role_loss)(p, r)))(params_R)
             for r in range(2)]
  np.testing.assert_allclose(norms_R, alone_R, rtol=1e-5)
  assert abs(float(alone_R[0] - alone_R[1])) > 0.1 * float(max(alone_R))  # roles apart: a swap would show


def test_apply_runs_epochs_of_minibatch_steps_and_reports_the_last():
  """rl.epochs=2 x rl.minibatches=2 on 8 rows: four optimiser steps, on rows {0,2,4,6} then {1,3,5,7}
  (minibatch m holds the rows i % 2 == m, so each group of G spreads over both), twice; the losses and
  diagnostics are the last minibatch's, under the parameters of its step."""
  config = tiny_config(**{"protocol.name": "solver_verifier", "task.num_ops": 1, "sft.steps": 0,
                          "rl.kl_coef": 0.5, "rl.entropy_coef": 0.1, "rl.epochs": 2, "rl.minibatches": 2,
                          "optim.learning_rate": 1e-2})
  exp = experiment.build(config)
  params_R, batch = _solver_verifier_batch(exp, 8)
  opt_state = compiled_init_state(exp, jax.random.PRNGKey(0)).opt_state
  np.testing.assert_array_equal(update.minibatch_rows(exp, 8), [[0, 2, 4, 6], [1, 3, 5, 7]])

  def by_hand(params, opt_state, batch):
    for _ in range(2):
      for rows in (np.array([0, 2, 4, 6]), np.array([1, 3, 5, 7])):
        mb = jax.tree.map(lambda x, rows=rows: x[rows], batch)
        grads, loss_R, means = update.minibatch_gradient(exp, params, mb, 1)
        updates, opt_state = exp.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return params, (loss_R, means)

  params, _, aux = on_one_device(lambda p, o, b: update.apply(exp, p, o, b, 1))(params_R, opt_state, batch)
  expected, (expected_loss_R, expected_means) = on_one_device(by_hand)(params_R, opt_state, batch)
  flat = lambda tree: jnp.concatenate([x.ravel() for x in jax.tree.leaves(tree)])
  moved = float(jnp.linalg.norm(flat(expected) - flat(params_R)))
  assert moved > 1e-2  # four steps of 1e-2 moved the parameters: the comparison is not vacuous
  # Rounding only (scan against unrolled steps): 0.4% measured, as Adam turns near-zero gradients into
  # whole steps; one epoch, or other minibatches, end tens of percent away.
  assert float(jnp.linalg.norm(flat(params) - flat(expected))) < 2e-2 * moved
  np.testing.assert_allclose(aux.loss_R, expected_loss_R, rtol=1e-4, atol=1e-6)
  for key in ("entropy_R", "kl_to_base_R", "approx_kl_R"):
    np.testing.assert_allclose(getattr(aux.means, key), getattr(expected_means, key), rtol=1e-4, atol=1e-6,
                               err_msg=key)
  assert bool(aux.finite_loss_R.all()) and bool(aux.finite_grad_S.all())
