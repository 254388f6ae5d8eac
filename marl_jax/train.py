"""The joint rollout-and-update step, and the compiled call that runs many of them.

`local_step` is one seed on this device's rows and reads top to bottom: sample problems, roll out the
protocol, score it, re-run the counterfactuals the credit estimator asks for, turn credit into token
advantages, update.  `make_train_call` scans it over `steps_per_call` steps, vmaps it over seeds and
shards it over the `data` mesh axis, in one jitted program.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from marl_jax import credit, parallel, rollout, sampling, update
from marl_jax.experiment import Experiment
from marl_jax.state import TrainState


def token_advantages(exp: Experiment, adv_xB, sampled_BxT):
  """Spreads advantages per role (RxB), or per turn (NxB), over the tokens each sampled: adv_BxT."""
  layout = exp.layout
  owner_T = np.where(layout.env_T, -1, layout.turn_T) if exp.credit.per_turn else layout.author_T
  mask_xBxT = sampled_BxT[None] & (owner_T[None, None] == np.arange(adv_xB.shape[0])[:, None, None])
  return jnp.einsum("xb,xbt->bt", adv_xB, mask_xBxT)


def local_step(exp: Experiment, state: TrainState, problem_key_B, sample_key_B, rerun_key_B,
               diagnose):
  """One seed, this device's rows: rollout, score, credit, update.  `diagnose` (a scalar bool, the
  same on every device and seed) adds diagnostics that cost extra backward passes."""
  rl, layout = exp.config.rl, exp.layout
  R, B = len(layout.roles), problem_key_B.shape[0]
  devices = jax.lax.psum(1, parallel.DATA)
  problems = jax.vmap(exp.task.sample)(problem_key_B)
  episodes = rollout.sample(exp, state.params, problems, sample_key_B)
  # Scored on the global batch, so the protocol's metrics are rates over every row (e.g. false_accept:
  # accepted among wrong answers), not means of per-device rates; credit takes this device's rows.
  scored = exp.protocol.rewards(exp.task, layout, *parallel.gather_rows((problems, episodes.tokens_BxT)))
  outcome = credit.Outcome(tokens_BxT=episodes.tokens_BxT, team_B=parallel.own_rows(scored.team_B, B),
                           role_RxB=parallel.own_rows(scored.role_RxB, B), group_size=rl.group_size)
  reruns = exp.credit.reruns(R)
  team_CxKxB = (None if reruns is None else
                rollout.rerun_team(exp, state.params, problems, episodes.tokens_BxT, rerun_key_B, reruns))
  adv_xB, credit_metrics = exp.credit.advantages(state.credit, outcome, team_CxKxB)
  credit_state, update_metrics = exp.credit.update(state.credit, outcome)

  role_mask_RxBxT = episodes.sampled_BxT[None] & (layout.author_T[None, None] == np.arange(R)[:, None, None])
  first_row = jax.lax.axis_index(parallel.DATA) * B
  batch = update.Batch(
      tokens_BxT=episodes.tokens_BxT, old_logp_BxT=episodes.logp_BxT,
      ref_logp_BxT=(sampling.token_log_probs(exp.model, layout, state.ref_params, episodes.tokens_BxT,
                                             rl.temperature)[0] if rl.kl_coef > 0 else None),
      adv_BxT=token_advantages(exp, adv_xB, episodes.sampled_BxT),
      role_mask_BxRxT=jnp.moveaxis(role_mask_RxBxT, 0, 1),
      group_B=(first_row + jnp.arange(B)) // rl.group_size)
  grad_norm_R = jax.lax.cond(diagnose, lambda: update.role_grad_norms(exp, state.params, batch, devices),
                             lambda: jnp.full(R, jnp.nan))
  params, opt_state, aux = update.apply(exp, state.params, state.opt_state, batch, devices)

  metrics = {**scored.metrics, "reward": scored.team_B.mean(),
             "tokens": episodes.sampled_BxT.sum().astype(jnp.float32) * devices}
  per_role = {"reward": scored.role_RxB.mean(1), "grad_norm_share": grad_norm_R / grad_norm_R.sum(),
              "loss": aux["loss"], "entropy": aux["entropy"], "approx_kl": aux["approx_kl"],
              **({"kl_to_base": aux["kl_to_base"]} if rl.kl_coef > 0 else {})}
  for name, value in {**credit_metrics, **update_metrics}.items():
    (per_role if jnp.ndim(value) else metrics)[name] = value
  for name, value_R in per_role.items():
    metrics.update({f"{role}/{name}": value_R[r] for r, role in enumerate(layout.roles)})
  metrics = {k: jax.lax.pmean(v, parallel.DATA) for k, v in metrics.items()}
  state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, credit=credit_state)
  return state, metrics


def make_train_call(exp: Experiment):
  """`train_call(state_S) -> (state_S, metrics_SxN)`: N = steps_per_call steps in one program.

  Diagnostics that cost extra compute (per-role gradient norms) are measured on the last step of each
  call and are NaN on the others (`loop.summarize` takes the mean over the steps that have them)."""
  config, rl = exp.config, exp.config.rl
  rows = jnp.arange(rl.batch_size)
  fold_rows = jax.vmap(jax.random.fold_in, in_axes=(None, 0))

  def row_keys(state):
    # Keys are per row of the global batch, so a row's episode does not depend on the device count.
    k_problem, k_sample, k_rerun = jax.random.split(jax.random.fold_in(state.key, state.step), 3)
    return (fold_rows(k_problem, rows // rl.group_size), fold_rows(k_sample, rows),
            fold_rows(k_rerun, rows))

  rows_spec = P(None, parallel.DATA)
  sharded_step = jax.shard_map(
      jax.vmap(functools.partial(local_step, exp), in_axes=(0, 0, 0, 0, None)), mesh=exp.mesh,
      in_specs=(P(), rows_spec, rows_spec, rows_spec, P()), out_specs=(P(), P()), check_vma=False)

  def one_step(state_S, i):
    return sharded_step(state_S, *jax.vmap(row_keys)(state_S), i == config.steps_per_call - 1)

  @functools.partial(jax.jit, donate_argnums=0)
  def train_call(state_S):
    state_S, metrics_NxS = jax.lax.scan(one_step, state_S, jnp.arange(config.steps_per_call))
    return state_S, jax.tree.map(lambda m: m.T, metrics_NxS)

  return train_call
