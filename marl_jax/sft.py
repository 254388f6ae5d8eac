"""Warm start: supervised training on protocol demonstrations (every role's messages), producing the
"base model" that RL starts from.  Demonstrations are noisy on purpose (`task.demo_error_rate`, and the
protocol's own knobs), so the base team starts weak but not random.  The optimiser is
`experiment.make_optimizer` over `config.optim` with `config.sft`'s keys replacing its own."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from marl_jax import experiment
from marl_jax import model as model_lib
from marl_jax import parallel, sampling, text


def demonstration_loss(exp, params_R, tokens_BxT):
  """Mean cross-entropy over every role-authored, non-padding token."""
  logp_BxT, _ = sampling.token_log_probs(exp.model, exp.layout, params_R, tokens_BxT, 1.0)
  mask_BxT = (exp.layout.author_T[None] >= 0) & (tokens_BxT != text.PAD)
  return -jnp.sum(logp_BxT * mask_BxT) / jnp.maximum(mask_BxT.sum(), 1)


def warm_start(exp, keys_S):
  """params_S: `config.sft.steps` steps on fresh demonstrations, one model per seed, from random
  parameters or from the model's pretrained ones (a checkpoint)."""
  cfg = exp.config.sft
  tx = model_lib.trainable(exp.model, experiment.make_optimizer(experiment.sft_optim(exp.config), cfg.steps,
                                                                "sft"))

  def demonstrations(key):
    k_problem, k_demo = jax.random.split(key)
    problems = jax.vmap(exp.task.sample)(jax.random.split(k_problem, cfg.batch_size))
    return exp.protocol.demonstrate(exp.task, exp.layout, problems,
                                    jax.random.split(k_demo, cfg.batch_size))

  def one_seed(key, pretrained_R):
    k_init, k_data = jax.random.split(jax.random.fold_in(key, 7))
    params = (model_lib.init_stack(exp.model, k_init, exp.num_sets) if pretrained_R is None
              else pretrained_R)

    def sgd_step(carry, k):
      params, opt_state = carry
      loss, grads = jax.value_and_grad(functools.partial(demonstration_loss, exp))(
          params, demonstrations(k))
      updates, opt_state = tx.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), loss

    (params, _), loss = jax.lax.scan(sgd_step, (params, tx.init(params)),
                                     jax.random.split(k_data, cfg.steps))
    return params, loss[-10:].mean()

  # A checkpoint's parameters enter as an argument (shared by the seeds), not as constants of the
  # program.  On a mesh with a `model` axis they and the result are split as the run's parameters
  # are, so that the warm start runs split too (random initial weights included: they are made where
  # they will live).
  pretrained_R = model_lib.pretrained_stack(exp.model, exp.num_sets)
  def every_seed(keys_S, pretrained_R):
    return parallel.over_seeds(lambda key: one_seed(key, pretrained_R), exp.config.seeds_at_once)(keys_S)

  split = {}
  if exp.splits_parameters:
    if pretrained_R is not None:
      pretrained_R = jax.device_put(pretrained_R, exp.shardings(pretrained_R))
    split["out_shardings"] = exp.shardings(jax.eval_shape(every_seed, keys_S, pretrained_R))
  params_S, loss_S = jax.jit(every_seed, **split)(keys_S, pretrained_R)
  print(f"warm start: {cfg.steps} steps, final demonstration loss per seed "
        f"{np.round(np.asarray(loss_S), 3).tolist()}")
  return params_S
