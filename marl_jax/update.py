"""The update: per-role token-level losses (`losses` registry), epochs x minibatches, per-set optimiser.

Each role's loss is its registered surrogate averaged over the tokens it sampled in the global batch
(plus an entropy bonus, for every role or the roles `rl.entropy_roles` names, and a k3 KL to the base
model); the gradient of the sum over roles updates every parameter set at once, with one optimiser
state per set (`model.per_set`: vmapped over each model group's sets), and frozen sets get zero updates.
"""
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from marl_jax import losses, parallel, sampling
from marl_jax import model as model_lib
from marl_jax.protocols import engine


@flax.struct.dataclass
class Batch:
  """This device's rows for the update; every field is row-major, so minibatches index rows."""
  tokens_BxT: jax.Array
  old_logp_BxT: jax.Array
  ref_logp_BxT: jax.Array | None  # None without a KL term
  adv_BxT: jax.Array
  role_mask_BxRxT: jax.Array
  group_B: jax.Array
  # The judge loss's weight (0: unlabelled) and label of each row's K judged answers (`rewards.Labels`),
  # None without one.
  judge_weight_BxK: jax.Array | None = None
  judge_label_BxK: jax.Array | None = None


@flax.struct.dataclass
class TokenMeans:
  """Per role, means over the role's sampled tokens in the global minibatch, beside its loss."""
  entropy_R: jax.Array
  kl_to_base_R: jax.Array  # the k3 KL to the base model; 0 without a KL term (`rl.kl_coef` = 0)
  approx_kl_R: jax.Array  # old log-probability less new: how far the policy moved from the sampler
  # The judges' proper score over the labelled answers (`judge_losses`, 0 for the other roles); None
  # without a judge loss.
  judge_loss_R: jax.Array | None = None


@flax.struct.dataclass
class Diagnostics:
  """What `apply` reports of an update: the last minibatch's per-role loss and token means, each
  parameter set's gradient norm there, and whether every minibatch's loss and gradient were finite."""
  loss_R: jax.Array
  means: TokenMeans
  grad_norm_S: jax.Array
  finite_loss_R: jax.Array
  finite_grad_S: jax.Array


def token_counts(mb: Batch, devices: int):
  """count_R: each role's sampled tokens in the global minibatch, over the devices (the average per
  device), the denominator of every per-role token mean."""
  return parallel.sum_over_devices(mb.role_mask_BxRxT.sum((0, 2))) / devices


def label_count(mb: Batch, devices: int):
  """The labelled judged answers in the global minibatch over the devices, the judge loss's denominator
  (as `token_counts` is the surrogate's).  A count, not the weights' sum: a minibatch without a right
  label would otherwise give its wrong ones the whole weight, undoing a rule's class weights."""
  return parallel.sum_over_devices((mb.judge_weight_BxK > 0).sum()) / devices


def judge_losses(exp, level_logp_JxKxBxL, mb: Batch, label_count):
  """loss_R: each judge's proper score (`config.reward.judge_loss`) of the probability it puts on each
  labelled answer being right against the label, weighted (`PayRule.label_weight`) and summed over
  `mb`'s labelled answers over `label_count`; 0 for the other roles."""
  rule, readout = exp.reward, exp.protocol.verdict_readout(exp.layout)
  p_JxKxB = engine.expected_level(level_logp_JxKxBxL, readout.levels)
  loss_JxKxB = losses.JUDGE_LOSSES[rule.judge_loss](p_JxKxB, mb.judge_label_BxK.T[None])
  judge_J = jnp.einsum("jkb,bk->j", loss_JxKxB, mb.judge_weight_BxK) / jnp.maximum(label_count, 1e-9)
  return jnp.zeros(len(exp.layout.roles)).at[np.asarray(exp.protocol.judge_roles)].set(judge_J)


def role_losses(exp, params_R, mb: Batch, count_R, label_count=None):
  """(loss_R, TokenMeans): per role the sum over its sampled tokens in `mb` of the surrogate, over
  count_R (`token_counts` of the whole minibatch: on all of it, the mean over the global minibatch),
  plus the judges' weighted proper score (`judge_losses`, over `label_count`) where
  `config.reward.judge_loss` asks for one; with `config.reward.judge_pg=False` instead of their
  surrogate."""
  rl, rule = exp.config.rl, exp.reward
  targets_N, logp_NxBxV = sampling.written_log_probs(exp.model, exp.layout, params_R, mb.tokens_BxT,
                                                     rl.temperature)
  logp_BxT, entropy_BxT = sampling.sampled_log_probs(targets_N, logp_NxBxV, mb.tokens_BxT)
  mask_RxBxT = jnp.moveaxis(mb.role_mask_BxRxT, 1, 0)
  x = losses.LossInput(logp_BxT=logp_BxT, old_logp_BxT=mb.old_logp_BxT, ref_logp_BxT=mb.ref_logp_BxT,
                       adv_BxT=mb.adv_BxT, role_mask_RxBxT=mask_RxBxT, group_B=mb.group_B)
  entropy_coef_BxT = jnp.einsum("r,rbt->bt", losses.entropy_coef_R(rl, exp.layout.roles), mask_RxBxT)
  surrogate_BxT = exp.loss(x, rl)
  if not rule.judge_pg:  # a supervised judge: no surrogate on its tokens
    pg_R = np.array([r not in exp.protocol.judge_roles for r in range(len(exp.layout.roles))])
    surrogate_BxT = surrogate_BxT * jnp.einsum("r,rbt->bt", pg_R, mask_RxBxT)
  per_token_BxT = surrogate_BxT - entropy_coef_BxT * entropy_BxT
  kl_BxT = jnp.zeros_like(logp_BxT)
  if rl.kl_coef > 0:
    kl_BxT = losses.kl_to_reference(logp_BxT, mb.ref_logp_BxT)
    per_token_BxT = per_token_BxT + rl.kl_coef * kl_BxT
  # Token means over the global batch: this device's sum over the average token count per device,
  # so that `pmean` of the gradients is exactly the gradient of the global mean.
  total = lambda x_BxT: jnp.einsum("bt,rbt->r", x_BxT, mask_RxBxT) / jnp.maximum(count_R, 1e-9)
  means = TokenMeans(entropy_R=total(entropy_BxT), kl_to_base_R=total(kl_BxT),
                     approx_kl_R=total(mb.old_logp_BxT - logp_BxT))
  loss_R = total(per_token_BxT)
  if rule.judge_loss != "none":
    level_logp_JxKxBxL = sampling.levels_at(exp.protocol.verdict_readout(exp.layout), targets_N, logp_NxBxV)
    judge_R = judge_losses(exp, level_logp_JxKxBxL, mb, label_count)
    means = means.replace(judge_loss_R=judge_R)
    loss_R = loss_R + rule.judge_weight * judge_R
  return loss_R, means


def minibatch_rows(exp, batch_size: int) -> np.ndarray:
  """Row indices of each minibatch, MxB/M.  Minibatch m holds the rows i with i % M == m, so each
  group's G samples of one problem are spread over the minibatches (problems are drawn afresh every
  step, so no shuffle is needed); every device holds whole minibatch strides, so the split of the
  global batch is the same on any device count (sharded and single-device runs agree)."""
  M = exp.config.rl.minibatches
  return np.arange(batch_size).reshape(batch_size // M, M).T


def minibatch_gradient(exp, params_R, mb: Batch, devices: int):
  """(grads, loss_R, TokenMeans): this device's gradient of the sum over roles of `role_losses` on
  minibatch `mb`, with the losses and their token means.  With `config.rl.microbatch_size` the rows go through
  the model that many at a time and the parts are summed (the losses are sums over tokens, so this is
  the same gradient up to float rounding): a smaller working set, faster on CPU caches and lighter on
  accelerator memory.  0 is one pass over the whole minibatch."""
  R = len(exp.layout.roles)
  count_R = token_counts(mb, devices)
  labels = None if mb.judge_weight_BxK is None else label_count(mb, devices)

  def part(part_mb):
    loss_R, vjp_fn, means = jax.vjp(lambda p: role_losses(exp, p, part_mb, count_R, labels), params_R,
                                    has_aux=True)
    return vjp_fn(jnp.ones(R))[0], loss_R, means

  return parallel.summed_over_row_chunks(part, exp.config.rl.microbatch_size, mb)


def apply(exp, params_R, opt_state, batch: Batch, devices: int):
  """Epochs of minibatch updates over this device's rows: (params_R, opt_state, Diagnostics)."""
  def minibatch_update(carry, rows):
    params, opt_state = carry
    grads, loss_R, means = minibatch_gradient(exp, params, jax.tree.map(lambda x: x[rows], batch), devices)
    grads = parallel.mean_over_devices(grads)
    updates, opt_state = exp.optimizer.update(grads, opt_state, params)  # per set; frozen sets still
    # Each device's token means are over `token_counts`' per-device average, so the global mean is
    # their mean over devices (as for the gradients), not their sum.
    loss_R, means = parallel.mean_over_devices((loss_R, means))
    return (optax.apply_updates(params, updates), opt_state), (loss_R, means, model_lib.set_norms(exp.model, grads))

  def epoch(carry, _):
    return jax.lax.scan(minibatch_update, carry, minibatch_rows(exp, batch.tokens_BxT.shape[0]))

  (params_R, opt_state), (loss_ExMxR, means_ExM, grad_norm_ExMxS) = jax.lax.scan(
      epoch, (params_R, opt_state), None, length=exp.config.rl.epochs)
  last = lambda x: x[-1, -1]
  return params_R, opt_state, Diagnostics(
      loss_R=last(loss_ExMxR), means=jax.tree.map(last, means_ExM), grad_norm_S=last(grad_norm_ExMxS),
      finite_loss_R=jnp.isfinite(loss_ExMxR).all((0, 1)), finite_grad_S=jnp.isfinite(grad_norm_ExMxS).all((0, 1)))


def role_grad_norms(exp, params_R, batch: Batch, devices: int):
  """grad_norm_R: the norm of the gradient of each role's loss alone (over every parameter set), on
  the first minibatch.  One backward pass per role, so the step computes it only on logging steps."""
  R = len(exp.layout.roles)
  mb = jax.tree.map(lambda x: x[minibatch_rows(exp, batch.tokens_BxT.shape[0])[0]], batch)
  count_R = token_counts(mb, devices)
  labels = None if mb.judge_weight_BxK is None else label_count(mb, devices)
  _, vjp_fn, _ = jax.vjp(lambda p: role_losses(exp, p, mb, count_R, labels), params_R, has_aux=True)
  # One role's backward pass at a time (not vmapped), each reduced to its norm before the next: the
  # memory of one pass and one gradient whatever R (65 roles in a 64-worker delegate held 65 backward
  # passes at once), for the same R passes of compute.
  norm = lambda onehot_R: optax.tree_utils.tree_norm(parallel.mean_over_devices(vjp_fn(onehot_R)[0]))
  return jax.lax.map(norm, jnp.eye(R))
