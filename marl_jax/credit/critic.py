"""Critic credit: a learned centralised critic Q(transcript) of the team outcome, and the COMA
counterfactual baseline (Foerster et al. 2018) without re-running the turns that read the message:

  A_r = Q(z) - mean over K of Q(z with role r's messages re-drawn from its policy, every other turn
        kept as it was)                                    (re-run mode `replace`)

mixed like `difference`: outcome_weight x the team outcome's group-baseline advantage + credit_weight
x A_r.  The critic is a small transformer of its own (`model.Value`, its size the knobs below) that
reads the whole canvas, every role's messages, trained on the team outcome by mean squared error with
its own Adam; `loss_weight` scales that loss (Adam undoes a positive scale but for its eps: 0 freezes
the critic).  Its parameters and optimiser state live in `TrainState.credit` (gradients averaged over
devices), so a run resumes exactly.  Q and the baseline use the critic before this step's update."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from marl_jax import checks, parallel
from marl_jax import model as model_lib
from marl_jax.credit import base, difference


def explained_variance(target_B, prediction_B):
  """1 - Var(target - prediction) / Var(target) over the global batch (every device holds the same
  number of rows).  A constant target gives 1 when predicted exactly, else 0 (scikit-learn's rule)."""
  err_B = target_B - prediction_B
  moments = parallel.mean_over_devices(jnp.stack([err_B.mean(), (err_B ** 2).mean(), target_B.mean(),
                                                  (target_B ** 2).mean()]))
  var_err, var_target = moments[1] - moments[0] ** 2, moments[3] - moments[2] ** 2
  return jnp.where(var_target > 1e-12, 1.0 - var_err / jnp.maximum(var_target, 1e-12),
                   (var_err <= 1e-12).astype(jnp.float32))


@base.register("critic")
@dataclasses.dataclass(frozen=True)
class Critic(difference.OutcomeAndCredit):
  samples: int = 2  # K alternative messages per role
  learning_rate: float = 1e-3  # the critic's Adam
  loss_weight: float = 1.0  # scales the critic's loss
  d_model: int = 32  # the critic's transformer
  n_layers: int = 1
  n_heads: int = 2
  d_ff: int = 64

  def check(self, num_roles, group_size):
    super().check(num_roles, group_size)
    checks.integer("credit.samples", self.samples, 1)
    checks.number("credit.learning_rate", self.learning_rate, 0.0, above=True)
    checks.number("credit.loss_weight", self.loss_weight, 0.0)
    for key in ("d_model", "n_layers", "n_heads", "d_ff"):
      checks.integer(f"credit.{key}", getattr(self, key), 1)
    if self.d_model % self.n_heads:
      raise ValueError(f"config.credit.d_model={self.d_model} must divide by config.credit.n_heads="
                       f"{self.n_heads}")

  def reruns(self, num_roles):
    return base.Reruns(tuple(map(tuple, np.eye(num_roles, dtype=bool))), "replace", self.samples)

  def _model(self, length: int) -> model_lib.ModelConfig:
    return model_lib.ModelConfig(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                                 d_ff=self.d_ff, max_len=length)

  def init(self, key, layout):
    params = model_lib.init_value(self._model(layout.length), key)
    return {"params": params, "opt_state": optax.adam(self.learning_rate).init(params)}

  def q(self, params, tokens_xT):
    """The critic's value of transcripts with any leading axes: q_x."""
    T = tokens_xT.shape[-1]
    q = model_lib.value(self._model(T), params, tokens_xT.reshape(-1, T))
    return q.reshape(tokens_xT.shape[:-1])

  def advantages(self, state, outcome, counterfactuals):
    baseline_RxB = self.q(state["params"], counterfactuals.tokens_CxKxBxT).mean(1)
    return self.mix(outcome, self.q(state["params"], outcome.tokens_BxT)[None] - baseline_RxB)

  def update(self, state, outcome):
    def loss(params):
      q_B = self.q(params, outcome.tokens_BxT)
      return self.loss_weight * jnp.mean((q_B - outcome.team_B) ** 2), q_B

    grads, q_B = jax.grad(loss, has_aux=True)(state["params"])
    updates, opt_state = optax.adam(self.learning_rate).update(
        parallel.mean_over_devices(grads), state["opt_state"])
    metrics = {"critic_loss": parallel.mean_over_devices(jnp.mean((q_B - outcome.team_B) ** 2)),
               "critic_explained_variance": explained_variance(outcome.team_B, q_B)}
    return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, metrics
