"""The joint rollout-and-update step, and the compiled call that runs many of them.

`local_step` is one seed on this device's rows and reads top to bottom: sample problems, roll out the
protocol, score it, reward it (from the checker, or from the judging roles' verdicts with audits),
re-run the counterfactuals the credit estimator asks for, turn credit into token advantages, update.  `make_train_call` scans it over `steps_per_call` steps, vmaps it over seeds
(`config.seeds_at_once` at a time) and shards it over the `data` mesh axis, in one jitted program.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from marl_jax import credit, parallel, rewards, rollout, sampling, update
from marl_jax.experiment import Experiment
from marl_jax.protocols import engine
from marl_jax.rewards import replay as replay_lib
from marl_jax.state import TrainState


def token_advantages(exp: Experiment, adv_xB, sampled_BxT, turn_NxB=None):
  """Spreads advantages per role (RxB), or per turn (NxB), over the tokens each sampled, plus the
  protocol's per-turn reward `turn_NxB` (if any) on each turn's tokens: adv_BxT."""
  layout = exp.layout
  turn_T = np.where(layout.env_T, -1, layout.turn_T)

  def spread(a_xB, owner_T):
    mask_xBxT = sampled_BxT[None] & (owner_T[None, None] == np.arange(a_xB.shape[0])[:, None, None])
    return jnp.einsum("xb,xbt->bt", a_xB, mask_xBxT)

  adv_BxT = spread(adv_xB, turn_T if exp.credit.per_turn else layout.author_T)
  return adv_BxT if turn_NxB is None else adv_BxT + spread(turn_NxB, turn_T)


def score(exp: Experiment, problems, episodes: rollout.Episodes, step=None, params_R=None):
  """Scores the global batch, so the protocol's metrics are rates over every row (e.g. false_accept:
  accepted among wrong answers), not means of per-device rates; credit gets this device's rows, with
  the protocol's auxiliary rewards weighted for training step `step` (`engine.training_rewards`).  Where
  `rollout.reads_levels` and `params_R` (the parameters that sampled them) are given, the judgments carry the
  judges' distributions over their levels under them."""
  B = episodes.tokens_BxT.shape[0]
  all_problems, all_tokens_BxT = parallel.gather_rows((problems, episodes.tokens_BxT))
  scored = exp.protocol.rewards(exp.task, exp.layout, all_problems, all_tokens_BxT)
  if params_R is not None and rollout.reads_levels(exp):
    scored = rollout.with_levels(exp, params_R, scored, episodes.tokens_BxT)
  team_B, role_RxB = engine.training_rewards(exp.protocol, scored, step)
  outcome = credit.Outcome(tokens_BxT=episodes.tokens_BxT, team_B=parallel.own_rows(team_B, B),
                           role_RxB=parallel.own_rows(role_RxB, B),
                           group_size=exp.config.rl.group_size,
                           turn_NxB=jax.tree.map(lambda x: parallel.own_rows(x, B), scored.turn_NxB))
  return scored, outcome


def rows(B: int):
  """rows_B: this device's rows' indices in the global batch."""
  return jax.lax.axis_index(parallel.DATA) * B + jnp.arange(B)


def update_batch(exp: Experiment, state: TrainState, episodes: rollout.Episodes, adv_xB,
                 turn_NxB=None, labels: rewards.Labels | None = None) -> update.Batch:
  """What the update reads: tokens, sampling and base-model log-probs, token advantages (with the
  protocol's per-turn rewards `turn_NxB`), role masks, each row's problem (group) index in the global
  batch and the judge loss's `labels` (if any)."""
  rl, layout = exp.config.rl, exp.layout
  B = episodes.tokens_BxT.shape[0]
  roles_R = np.arange(len(layout.roles))
  role_mask_BxRxT = episodes.sampled_BxT[:, None] & (layout.author_T[None, None] == roles_R[None, :, None])
  ref_logp_BxT = None
  if rl.kl_coef > 0:
    ref_logp_BxT, _ = sampling.token_log_probs(exp.model, layout, state.ref_params, episodes.tokens_BxT,
                                               rl.temperature)
  adv_BxT = token_advantages(exp, adv_xB, episodes.sampled_BxT, turn_NxB)
  return update.Batch(tokens_BxT=episodes.tokens_BxT, old_logp_BxT=episodes.logp_BxT,
                      ref_logp_BxT=ref_logp_BxT, adv_BxT=adv_BxT,
                      role_mask_BxRxT=role_mask_BxRxT, group_B=rows(B) // rl.group_size,
                      judge_weight_BxK=None if labels is None else labels.weight_BxK,
                      judge_label_BxK=None if labels is None else labels.label_BxK)


def replayed(exp: Experiment, state: TrainState, batch: update.Batch, labels: rewards.Labels):
  """(the update's batch with `config.reward.replay_rows` episodes drawn from the replay added, the
  replay with the global batch's labelled episodes written): replayed rows sample no token, so only
  the judge loss reads them (`rewards.replay`).  They are drawn before this step's are written."""
  B, K = batch.tokens_BxT.shape[0], exp.reward.replay_rows
  key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(state.key, state.step), rewards.REPLAY_STREAM),
                           jax.lax.axis_index(parallel.DATA))
  tokens_KxT, old = replay_lib.draw(state.replay, key, K)
  zeros = lambda x: None if x is None else jnp.zeros((K,) + x.shape[1:], x.dtype)
  extra = update.Batch(tokens_BxT=tokens_KxT, old_logp_BxT=zeros(batch.old_logp_BxT),
                       ref_logp_BxT=zeros(batch.ref_logp_BxT), adv_BxT=zeros(batch.adv_BxT),
                       role_mask_BxRxT=zeros(batch.role_mask_BxRxT), group_B=jnp.full(K, -1, batch.group_B.dtype),
                       judge_weight_BxK=old.weight_BxK, judge_label_BxK=old.label_BxK)
  batch = jax.tree.map(lambda x, y: jnp.concatenate([x, y]), batch, extra)
  new = parallel.gather_rows((batch.tokens_BxT[:B], labels))
  return batch, replay_lib.write(state.replay, *new)


def step_metrics(exp: Experiment, scored, episodes: rollout.Episodes, devices, role_metrics: dict,
                 other: dict):
  """Scalars averaged over devices: the protocol's rates, the reward paid (`reward`), sampled tokens,
  and per-role values (R-vectors, logged as ROLE/NAME) of the update and the credit estimator."""
  metrics = {**scored.metrics, "reward": scored.team_B.mean(),
             "tokens": episodes.sampled_BxT.sum().astype(jnp.float32) * devices}
  role_metrics = {"reward": scored.role_RxB.mean(1), **role_metrics}
  for name, value in other.items():
    (role_metrics if jnp.ndim(value) else metrics)[name] = value
  for name, value_R in role_metrics.items():
    metrics.update({f"{role}/{name}": value_R[r] for r, role in enumerate(exp.layout.roles)})
  return parallel.mean_over_devices(metrics)


NONFINITE = ("reward", "advantage", "loss", "gradient", "credit state", "parameters",
             "optimiser state")  # in the step's order


def all_finite(tree) -> jax.Array:
  """Whether every float leaf of `tree` is finite: one reduction per leaf."""
  return jnp.array([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)
                    if jnp.issubdtype(x.dtype, jnp.inexact)] + [True]).all()


def every_role(exp: Experiment, *trees) -> jax.Array:
  """nonfinite_QxR for whole trees (an updated state), one quantity each: non-finite for every role."""
  return jnp.stack([jnp.full(len(exp.layout.roles), ~all_finite(tree)) for tree in trees])


def on_any_device(nonfinite_QxR) -> jax.Array:
  """Whether each was True on any device, so that every device skips the same updates."""
  return parallel.max_over_devices(nonfinite_QxR.astype(jnp.int32)) > 0


def nonfinite(exp: Experiment, outcome: credit.Outcome, adv_xB, aux: update.Diagnostics, credit_state) -> jax.Array:
  """nonfinite_QxR: whether quantity q of NONFINITE (up to the credit state) was non-finite for role r
  on any device (per-turn values count for the turn's role, a set's gradient for every role that
  uses the set, the credit estimator's updated state, with the payment rule's, for every role)."""
  R = len(exp.layout.roles)
  turn_role_NxR = np.asarray(exp.layout.turn_roles)[:, None] == np.arange(R)
  by_turn = lambda bad_N: (bad_N[:, None] & turn_role_NxR).any(0)
  bad = lambda x_xB: ~jnp.isfinite(x_xB).all(-1)
  reward_R = bad(outcome.role_RxB) | bad(outcome.team_B)
  if outcome.turn_NxB is not None:
    reward_R = reward_R | by_turn(bad(outcome.turn_NxB))
  adv_R = by_turn(bad(adv_xB)) if exp.credit.per_turn else bad(adv_xB)
  gradient_R = ~aux.finite_grad_S[np.asarray(exp.role_set_R)]
  nonfinite_QxR = jnp.stack([reward_R, adv_R, ~aux.finite_loss_R, gradient_R])
  return on_any_device(jnp.concatenate([nonfinite_QxR, every_role(exp, credit_state)]))


def assign_credit(exp: Experiment, params_R, credit_state, problems, outcome: credit.Outcome, rerun_key_B,
                  step=None):
  """The credit estimator on this device's rows: the counterfactual re-runs it asks for (if any, in one
  batched re-run), its advantages (adv_RxB, or adv_NxB per turn) and its updated state and metrics."""
  reruns = exp.credit.reruns(len(exp.layout.roles))
  tokens_CxKxBxT = None if reruns is None else rollout.rerun_tokens(
      exp, params_R, outcome.tokens_BxT, rerun_key_B, reruns)
  return credit_from_reruns(exp, credit_state, problems, outcome, tokens_CxKxBxT, step)


def credit_from_reruns(exp: Experiment, credit_state, problems, outcome: credit.Outcome, tokens_CxKxBxT,
                       step=None):
  """`assign_credit` given the re-drawn transcripts (None when the estimator asks for none)."""
  counterfactuals = None if tokens_CxKxBxT is None else rollout.score_reruns(
      exp, problems, tokens_CxKxBxT, step)
  adv_xB, metrics = exp.credit.advantages(credit_state, outcome, counterfactuals)
  credit_state, update_metrics = exp.credit.update(credit_state, outcome)
  return adv_xB, credit_state, {**metrics, **update_metrics}


def plants(exp: Experiment, state: TrainState, B: int) -> rewards.Plants | None:
  """The answers planted into this device's B rows at this step (`config.reward.plant_rate`), drawn per
  problem before sampling; None without any."""
  if not exp.reward.plant_rate > 0:
    return None
  key_B = rewards.audit_keys(state.key, state.step, rows(B) // exp.config.rl.group_size, rewards.PLANT_STREAM)
  return rewards.draw_plants(key_B, exp.reward.plant_rate, len(exp.protocol.verdict_readout(exp.layout).answer_turn_K))


def reward(exp: Experiment, state: TrainState, scored, outcome: credit.Outcome, plants=None):
  """The reward stage (`marl_jax.rewards`): the rewards paid, from the checker (as scored) or from the
  judges' verdicts with audits drawn for this device's rows (and `plants`), as `scored` (for the
  metrics) and as the outcome credit reads; the payment rule's updated state, its metrics and the judge
  loss's labels."""
  audit_key_B = rewards.audit_keys(state.key, state.step, rows(outcome.team_B.shape[0]))
  return rewards.assign(exp.reward, exp.layout.roles, exp.protocol.judge_roles, state.reward, scored,
                        outcome, audit_key_B, plants)


def local_step(exp: Experiment, state: TrainState, problem_key_B, sample_key_B, rerun_key_B,
               diagnose):
  """One seed, this device's rows: rollout, score, reward, credit, update.  `diagnose` (a scalar bool,
  the same on every device and seed) adds diagnostics that cost extra backward passes."""
  R = len(exp.layout.roles)
  devices = jax.lax.axis_size(parallel.DATA)
  problems = exp.task.sample_batch(problem_key_B)
  planted = plants(exp, state, problem_key_B.shape[0])
  episodes = rollout.sample(exp, state.params, problems, sample_key_B,
                            rows_per_pass=exp.config.rl.rollout_batch_size, plants=planted)
  scored, outcome = score(exp, problems, episodes, state.step, state.params)
  scored, outcome, reward_state, reward_metrics, labels = reward(exp, state, scored, outcome, planted)
  adv_xB, credit_state, credit_metrics = assign_credit(exp, state.params, state.credit, problems, outcome,
                                                       rerun_key_B, state.step)
  batch = update_batch(exp, state, episodes, adv_xB, outcome.turn_NxB, labels)
  replay = state.replay
  if exp.reward.replay:
    batch, replay = replayed(exp, state, batch, labels)
  params, opt_state, aux = update.apply(exp, state.params, state.opt_state, batch, devices)
  # Per-role gradient norms: free with isolated sets (a set's gradient is its role's); otherwise a
  # backward pass per role, so only when asked.
  if sorted(exp.role_set_R) == list(range(R)):
    grad_norm_R = aux.grad_norm_S[np.asarray(exp.role_set_R)]
  else:
    grad_norm_R = jax.lax.cond(diagnose, lambda: update.role_grad_norms(exp, state.params, batch, devices),
                               lambda: jnp.full(R, jnp.nan))

  # 0 for every role, not 0/0, on a step without gradient (every advantage zero).
  share_R = grad_norm_R / jnp.maximum(grad_norm_R.sum(), 1e-30)
  role_metrics = {"grad_norm_share": share_R, "loss": aux.loss_R, "entropy": aux.means.entropy_R,
                  "approx_kl": aux.means.approx_kl_R}
  if exp.config.rl.kl_coef > 0:
    role_metrics["kl_to_base"] = aux.means.kl_to_base_R
  if aux.means.judge_loss_R is not None:
    role_metrics["judge_loss"] = aux.means.judge_loss_R
  metrics = step_metrics(exp, scored, episodes, devices, role_metrics,
                         {**credit_metrics, **reward_metrics})
  # A non-finite reward, advantage, loss, gradient or credit state skips the update: parameters,
  # optimiser and credit state stay as they were, so no NaN enters the state (the host counts it, or
  # stops).
  keep = lambda bad, new, old: jax.tree.map(lambda n, o: jnp.where(bad, o, n), new, old)
  nonfinite_QxR = nonfinite(exp, outcome, adv_xB, aux, (credit_state, reward_state))
  params, opt_state, credit_state, reward_state = keep(
      nonfinite_QxR.any(), (params, opt_state, credit_state, reward_state),
      (state.params, state.opt_state, state.credit, state.reward))
  # So does an update that overflows finite gradients into the parameters or optimiser state (a huge
  # learning rate).  They are read behind a barrier: a reader inside the update's fusion would change
  # XLA's fusion of it, and so the float rounding of every finite run.
  params, opt_state = jax.lax.optimization_barrier((params, opt_state))
  updated_QxR = on_any_device(every_role(exp, params, opt_state))
  params, opt_state = keep(updated_QxR.any(), (params, opt_state), (state.params, state.opt_state))
  state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, credit=credit_state,
                        reward=reward_state, replay=replay)
  return state, {**metrics, "nonfinite_QxR": jnp.concatenate([nonfinite_QxR, updated_QxR])}


def make_train_call(exp: Experiment):
  """`train_call(state_S, diagnose=True) -> (state_S, metrics_SxN)`: N = steps_per_call steps in one
  program (`nonfinite_QxR` per step and seed: SxNxQxR).

  Diagnostics that cost extra compute (per-role gradient norms of shared sets: a backward pass per
  role) are measured on the last step of a call asked to `diagnose` (the loop asks on the calls it
  logs) and are NaN on the others (`loop.summarize` averages the steps that have them)."""
  config, rl = exp.config, exp.config.rl
  rows = jnp.arange(rl.batch_size)
  fold_rows = jax.vmap(jax.random.fold_in, in_axes=(None, 0))

  def row_keys(state):
    # Keys are per row of the global batch, so a row's episode does not depend on the device count.
    k_problem, k_sample, k_rerun = jax.random.split(jax.random.fold_in(state.key, state.step), 3)
    return (fold_rows(k_problem, rows // rl.group_size), fold_rows(k_sample, rows),
            fold_rows(k_rerun, rows))

  rows_spec = P(None, parallel.DATA)
  def seeds_step(state_S, problem_key_SxB, sample_key_SxB, rerun_key_SxB, diagnose):
    step = lambda *args: local_step(exp, *args, diagnose)
    return parallel.over_seeds(step, config.seeds_at_once)(state_S, problem_key_SxB, sample_key_SxB,
                                                           rerun_key_SxB)

  sharded_step = parallel.shard_map(seeds_step, exp.mesh,
                                    in_specs=(P(), rows_spec, rows_spec, rows_spec, P()),
                                    out_specs=(P(), P()))

  judge_sets = tuple(sorted({exp.role_set_R[r] for r in exp.protocol.judge_roles}))

  def one_step(diagnose, state_S, i):
    state_S, metrics_S = sharded_step(state_S, *jax.vmap(row_keys)(state_S),
                                      diagnose & (i == config.steps_per_call - 1))
    if exp.reward.cross == "rotate":  # cross-judging: the judges move on to the next seed's team
      state_S = rewards.rotate_judges(state_S, judge_sets)
    return state_S, metrics_S

  @functools.partial(jax.jit, donate_argnums=0)
  def train_call(state_S, diagnose=True):
    state_S, metrics_NxS = jax.lax.scan(functools.partial(one_step, jnp.asarray(diagnose)), state_S,
                                        jnp.arange(config.steps_per_call))
    if exp.splits_parameters:  # split parameters leave as they came, not as XLA prefers
      state_S = jax.lax.with_sharding_constraint(state_S, exp.shardings(state_S))
    return state_S, jax.tree.map(lambda m: jnp.swapaxes(m, 0, 1), metrics_NxS)

  return train_call
