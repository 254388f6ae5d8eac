"""Joint rollout-and-update training: one pure step, jitted once, `lax.scan`ned over steps, vmapped
over seeds and sharded over devices; and the host loop (evaluation, logging, checkpoints).

  step(state, key):
    problems   = task.sample                         # G samples of each problem
    episodes   = sampling.generate(params_R, ...)    # every role's messages on one canvas
    rewards    = protocol.rewards(...)               # team outcome + per-role verifiable signals
    credit     = counterfactual re-runs (difference credit only)
    adv_RxB    = credit.advantages(...)
    params     = PPO / REINFORCE epochs over minibatches, one loss per role, vmapped optimiser per set
"""
import dataclasses
import functools
import json
import os
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from marl_jax import checkpoint, credit, losses, metrics as metrics_lib, sampling, sft
from marl_jax import model as model_lib
from marl_jax import parallel, protocols, tasks, text
from marl_jax.protocols import engine


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any  # params_R: parameter sets stacked on a leading axis
  ref_params: Any  # the warm-started base model, for the KL penalty
  opt_state: Any  # one optimiser state per parameter set (vmapped)
  key: jax.Array


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Everything static a run closes over, built (and validated) from the config before compiling."""
  config: ml_collections.ConfigDict
  task: tasks.Task
  protocol: protocols.Protocol
  layout: engine.Layout
  model: model_lib.ModelConfig
  role_set_R: tuple[int, ...]
  trainable_R: tuple[bool, ...]
  optimizer: optax.GradientTransformation
  mesh: jax.sharding.Mesh

  @property
  def num_sets(self) -> int:
    return len(self.trainable_R)


def role_map(roles, sharing) -> tuple[int, ...]:
  if sharing == "isolated":
    return tuple(range(len(roles)))
  if sharing == "shared":
    return (0,) * len(roles)
  try:
    role_set = tuple(int(s) for s in str(sharing).split(","))
  except ValueError:
    role_set = ()
  if len(role_set) != len(roles) or min(role_set) < 0:
    raise ValueError(f"config.roles.sharing={sharing!r}; allowed: 'isolated', 'shared', or a "
                     f"parameter set for each role {list(roles)} such as '0,1'")
  return role_set


def make_optimizer(optim, total_updates: int) -> optax.GradientTransformation:
  schedules = {
      "constant": lambda: optax.constant_schedule(optim.learning_rate),
      "cosine": lambda: optax.warmup_cosine_decay_schedule(
          0.0, optim.learning_rate, optim.warmup_steps, max(total_updates, optim.warmup_steps + 1)),
  }
  if optim.schedule not in schedules:
    raise ValueError(f"config.optim.schedule={optim.schedule!r} is unknown; allowed: {sorted(schedules)}")
  lr = schedules[optim.schedule]()
  optimizers = {
      "adam": lambda: optax.adam(lr, b1=optim.b1, b2=optim.b2),
      "adamw": lambda: optax.adamw(lr, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay),
      "sgd": lambda: optax.sgd(lr),
  }
  if optim.name not in optimizers:
    raise ValueError(f"config.optim.name={optim.name!r} is unknown; allowed: {sorted(optimizers)}")
  return optax.chain(optax.clip_by_global_norm(optim.max_grad_norm), optimizers[optim.name]())


def build(config: ml_collections.ConfigDict) -> Experiment:
  """Validates the config and builds the static pieces; raises a clear error before any compile."""
  task_kwargs = {k: v for k, v in config.task.items() if k != "name"}
  task = tasks.make(config.task.name, **task_kwargs)
  proto_kwargs = {k: v for k, v in config.protocol.items() if k != "name"}
  protocol = protocols.make(config.protocol.name, task, **proto_kwargs)
  role_set_R = role_map(protocol.roles, config.roles.sharing)
  num_sets = max(role_set_R) + 1
  if sorted(set(role_set_R)) != list(range(num_sets)):
    raise ValueError(f"config.roles.sharing={list(role_set_R)} names parameter sets "
                     f"{sorted(set(role_set_R))}; sets must be numbered 0..n-1 without gaps")
  trainable = str(config.roles.trainable)
  trainable_R = tuple(t.strip().lower() in ("1", "true") for t in trainable.split(",")) if trainable else (True,) * num_sets
  if len(trainable_R) != num_sets:
    raise ValueError(f"config.roles.trainable has {len(trainable_R)} entries; there are {num_sets} "
                     f"parameter sets (from config.roles.sharing)")
  layout = protocol.layout(task, role_set_R)
  if layout.length > config.model.max_len:
    raise ValueError(f"prompt plus messages take {layout.length} tokens but config.model.max_len="
                     f"{config.model.max_len}; raise config.model.max_len or shrink the task")
  if config.model.d_model % config.model.n_heads:
    raise ValueError(f"config.model.d_model={config.model.d_model} must divide by "
                     f"config.model.n_heads={config.model.n_heads}")
  rl = config.rl
  if rl.algorithm not in losses.ALGORITHMS:
    raise ValueError(f"config.rl.algorithm={rl.algorithm!r} is unknown; allowed: {list(losses.ALGORITHMS)}")
  if rl.baseline not in credit.BASELINES:
    raise ValueError(f"config.rl.baseline={rl.baseline!r} is unknown; allowed: {list(credit.BASELINES)}")
  if rl.credit not in credit.CREDITS:
    raise ValueError(f"config.rl.credit={rl.credit!r} is unknown; allowed: {list(credit.CREDITS)}")
  if rl.counterfactual not in credit.COUNTERFACTUALS:
    raise ValueError(f"config.rl.counterfactual={rl.counterfactual!r} is unknown; "
                     f"allowed: {list(credit.COUNTERFACTUALS)}")
  if rl.counterfactual_samples < 1:
    raise ValueError(f"config.rl.counterfactual_samples={rl.counterfactual_samples}; K must be >= 1")
  if rl.group_size < 1 or rl.batch_size % rl.group_size:
    raise ValueError(f"config.rl.batch_size={rl.batch_size} must divide by config.rl.group_size="
                     f"{rl.group_size}")
  if rl.baseline == "rloo" and rl.group_size < 2:
    raise ValueError("config.rl.baseline='rloo' needs config.rl.group_size >= 2")
  mesh = parallel.make_mesh(config.num_devices)
  devices = mesh.devices.size
  local_batch = rl.batch_size // devices
  if rl.batch_size % devices or local_batch % rl.group_size:
    raise ValueError(f"config.rl.batch_size={rl.batch_size} must split into {devices} devices with "
                     f"whole groups of config.rl.group_size={rl.group_size} on each")
  if local_batch % rl.minibatches:
    raise ValueError(f"the per-device batch {local_batch} must divide by config.rl.minibatches="
                     f"{rl.minibatches}")
  for key in ("log_every", "eval_every", "checkpoint_every"):
    if config[key] % config.steps_per_call:
      raise ValueError(f"config.{key}={config[key]} must be a multiple of config.steps_per_call="
                       f"{config.steps_per_call}")
  if config.total_steps % config.steps_per_call:
    raise ValueError(f"config.total_steps={config.total_steps} must be a multiple of "
                     f"config.steps_per_call={config.steps_per_call}")
  model_cfg = model_lib.ModelConfig(
      d_model=config.model.d_model, n_layers=config.model.n_layers, n_heads=config.model.n_heads,
      d_ff=config.model.d_ff, max_len=config.model.max_len,
      dtype=model_lib.compute_dtype(config.model.dtype))
  total_updates = config.total_steps * rl.epochs * rl.minibatches
  return Experiment(config, task, protocol, layout, model_cfg, role_set_R, trainable_R,
                    make_optimizer(config.optim, total_updates), mesh)


def init_state(exp: Experiment, key, params_R=None) -> TrainState:
  """One seed's state; `params_R` (e.g. a warm start) replaces the random initialisation."""
  k_init, k_run = jax.random.split(key)
  if params_R is None:
    params_R = model_lib.init_stack(exp.model, k_init, exp.num_sets)
  opt_state = jax.vmap(exp.optimizer.init)(params_R)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params_R, ref_params=params_R,
                    opt_state=opt_state, key=k_run)


# ---------------------------------------------------------------------------------------------
# Rollout, rewards and credit (one seed, this device's rows).


def rollout(exp: Experiment, params_R, problems, key_B, greedy: bool = False):
  canvas_BxT = engine.assemble(exp.layout, problems["prompt"], [None] * len(exp.layout.turn_slices))
  return sampling.generate(exp.model, exp.layout, params_R, canvas_BxT,
                           jnp.zeros(canvas_BxT.shape, bool), key_B, exp.config.rl.temperature, greedy)


def counterfactual_tokens(exp: Experiment, params_R, problems, tokens_BxT, key_B):
  """Transcripts with each role's messages re-drawn, K times: tokens_RxKxBxT.

  For role r its messages are resampled from its policy (or replaced by the absent message) and the
  later turns that can react to them (`Layout.resampled_turns`) are re-sampled; everything else (the
  prompt, earlier turns, turns that never read r's messages) stays as sampled.
  """
  layout, rl = exp.layout, exp.config.rl
  R, K = len(layout.roles), rl.counterfactual_samples
  B, T = tokens_BxT.shape
  free_RxT = np.zeros((R, T), bool)  # positions re-drawn in role r's counterfactual
  absent_RxT = np.zeros((R, T), bool)  # role r's message slots, when they are made absent
  absent_msg_RxT = np.zeros((R, T), np.int32)
  for r in range(R):
    for i in layout.resampled_turns(r):
      free_RxT[r, slice(*layout.turn_slices[i])] = True
    for i in layout.role_turns(r) if rl.counterfactual == "absent" else ():
      start, stop = layout.turn_slices[i]
      absent_RxT[r, start:stop] = True
      absent_msg_RxT[r, start:stop] = ([text.ABSENT, text.EOS] + [text.PAD] * stop)[:stop - start]
  force_RxT = ~free_RxT | absent_RxT
  canvas_RxBxT = jnp.where(absent_RxT[:, None], absent_msg_RxT[:, None], tokens_BxT[None])
  rows = lambda x: jnp.broadcast_to(x[:, None], (R, K) + x.shape[1:]).reshape((R * K,) + x.shape[1:])
  canvas = rows(canvas_RxBxT).reshape(R * K * B, T)
  force = jnp.broadcast_to(jnp.asarray(force_RxT)[:, None, None], (R, K, B, T)).reshape(R * K * B, T)
  keys = jax.vmap(lambda k: jax.random.split(k, R * K))(key_B)  # B x RK
  keys = jnp.swapaxes(keys, 0, 1).reshape((R * K * B,) + key_B.shape[1:])
  cf_tokens, _, _ = sampling.generate(exp.model, layout, params_R, canvas, force, keys, rl.temperature)
  return cf_tokens.reshape(R, K, B, T)


def counterfactual_team(exp: Experiment, params_R, problems, tokens_BxT, key_B):
  """Team outcome of each role's counterfactual transcripts (`counterfactual_tokens`): team_RxKxB."""
  cf_tokens_RxKxBxT = counterfactual_tokens(exp, params_R, problems, tokens_BxT, key_B)
  R, K, B, T = cf_tokens_RxKxBxT.shape
  cf_problems = jax.tree.map(lambda x: jnp.tile(x, (R * K,) + (1,) * (x.ndim - 1)), problems)
  team = exp.protocol.rewards(exp.task, exp.layout, cf_problems,
                              cf_tokens_RxKxBxT.reshape(R * K * B, T))["team_B"]
  return team.reshape(R, K, B)


# ---------------------------------------------------------------------------------------------
# The update: per-role token-level losses, PPO epochs x minibatches, per-set optimiser.


def role_losses(exp: Experiment, params_R, batch, devices: int):
  """Per-role loss_R: the mean over each role's sampled tokens (across all devices) of the surrogate."""
  rl = exp.config.rl
  logp_BxT, entropy_BxT = sampling.token_log_probs(exp.model, exp.layout, params_R, batch["tokens"],
                                                   rl.temperature)
  per_token_BxT = losses.policy_loss_BxT(rl.algorithm, logp_BxT, batch["old_logp"], batch["adv"],
                                         rl.clip_eps) - rl.entropy_coef * entropy_BxT
  kl_BxT = jnp.zeros_like(logp_BxT)
  if rl.kl_coef > 0:
    kl_BxT = losses.kl_to_reference(logp_BxT, batch["ref_logp"])
    per_token_BxT = per_token_BxT + rl.kl_coef * kl_BxT
  mask_RxBxT = jnp.moveaxis(batch["role_mask_BxRxT"], 1, 0)
  # Token means over the global batch: this device's sum over the average token count per device,
  # so that `pmean` of the gradients is exactly the gradient of the global mean.
  count_R = jax.lax.psum(mask_RxBxT.sum((1, 2)), parallel.DATA) / devices
  total = lambda x_BxT: jnp.einsum("bt,rbt->r", x_BxT, mask_RxBxT) / jnp.maximum(count_R, 1e-9)
  approx_kl_BxT = batch["old_logp"] - logp_BxT
  aux = {"entropy": total(entropy_BxT), "kl_to_base": total(kl_BxT), "approx_kl": total(approx_kl_BxT)}
  return total(per_token_BxT), aux


def update_params(exp: Experiment, state: TrainState, batch, devices: int):
  """Epochs of minibatch updates over this device's rows; returns the new state and diagnostics."""
  rl = exp.config.rl
  B = batch["tokens"].shape[0]
  R = len(exp.layout.roles)
  isolated = len(set(exp.role_set_R)) == R
  set_of_role = np.asarray(exp.role_set_R)
  trainable_R = np.asarray(exp.trainable_R)

  def minibatch_update(carry, idx):
    params, opt_state = carry
    mb = jax.tree.map(lambda x: x[idx], batch)
    loss_fn = lambda p: role_losses(exp, p, mb, devices)
    loss_R, vjp_fn, aux = jax.vjp(loss_fn, params, has_aux=True)
    if isolated:  # each set's gradient is its role's gradient
      grads = vjp_fn(jnp.ones(R))[0]
      set_norm = jax.vmap(optax.tree_utils.tree_norm)(jax.lax.pmean(grads, parallel.DATA))
      role_norm_R = set_norm[set_of_role]
    else:  # shared sets: one backward per role's loss, vmapped, to split the gradient by role
      grads_R = jax.vmap(vjp_fn)(jnp.eye(R))[0]
      role_norm_R = jax.vmap(optax.tree_utils.tree_norm)(jax.lax.pmean(grads_R, parallel.DATA))
      grads = jax.tree.map(lambda g: g.sum(0), grads_R)
    grads = jax.lax.pmean(grads, parallel.DATA)
    updates, opt_state = jax.vmap(exp.optimizer.update)(grads, opt_state, params)
    updates = jax.tree.map(lambda u: u * trainable_R.reshape((-1,) + (1,) * (u.ndim - 1)), updates)
    params = optax.apply_updates(params, updates)
    aux = {k: jax.lax.psum(v, parallel.DATA) for k, v in aux.items()}
    aux["loss"] = jax.lax.psum(loss_R, parallel.DATA)
    aux["grad_norm"] = role_norm_R
    return (params, opt_state), aux

  # Minibatch m holds the rows i with i % M == m.  Rows are i.i.d. episodes, so no shuffle is needed,
  # and because every device holds a whole number of minibatch strides the split of the global batch
  # is the same on any device count (so sharded and single-device runs agree).
  minibatch_rows = np.arange(B).reshape(B // rl.minibatches, rl.minibatches).T

  def epoch(carry, _):
    return jax.lax.scan(minibatch_update, carry, minibatch_rows)

  (params, opt_state), aux = jax.lax.scan(epoch, (state.params, state.opt_state), None,
                                          length=rl.epochs)
  aux = jax.tree.map(lambda x: x[-1, -1], aux)  # diagnostics of the last minibatch
  return state.replace(params=params, opt_state=opt_state), aux


def local_step(exp: Experiment, state: TrainState, problem_key_B, sample_key_B, cf_key_B):
  """One seed, this device's rows: rollout, rewards, credit, update."""
  rl, layout = exp.config.rl, exp.layout
  devices = jax.lax.psum(1, parallel.DATA)
  problems = jax.vmap(exp.task.sample)(problem_key_B)
  tokens_BxT, logp_BxT, sampled_BxT = rollout(exp, state.params, problems, sample_key_B)
  # Scored once on the global batch, so the protocol's metrics are rates over every row (e.g.
  # false_accept: accepted among wrong answers), not means of per-device rates; credit takes this
  # device's rows (block `axis_index` of the batch, as the rows are sharded).
  gather = lambda x: jax.lax.all_gather(x, parallel.DATA, tiled=True)
  scored = exp.protocol.rewards(exp.task, layout, jax.tree.map(gather, problems), gather(tokens_BxT))
  B = tokens_BxT.shape[0]
  first_row = jax.lax.axis_index(parallel.DATA) * B
  own_rows = lambda x_xB: jax.lax.dynamic_slice_in_dim(x_xB, first_row, B, axis=-1)
  rewards = {"team_B": own_rows(scored["team_B"]), "role_RxB": own_rows(scored["role_RxB"])}
  cf_team_RxKxB = None
  if rl.credit == "difference":
    cf_team_RxKxB = counterfactual_team(exp, state.params, problems, tokens_BxT, cf_key_B)
  adv_RxB = credit.advantages(rl, rewards, cf_team_RxKxB)
  R = len(layout.roles)
  role_mask_RxBxT = sampled_BxT[None] & (layout.author_T[None, None] == np.arange(R)[:, None, None])
  adv_BxT = jnp.einsum("rb,rbt->bt", adv_RxB, role_mask_RxBxT)
  # Every entry is row-major so that minibatches can index rows.
  batch = {"tokens": tokens_BxT, "old_logp": logp_BxT, "adv": adv_BxT,
           "role_mask_BxRxT": jnp.moveaxis(role_mask_RxBxT, 0, 1)}
  if rl.kl_coef > 0:
    batch["ref_logp"], _ = sampling.token_log_probs(exp.model, layout, state.ref_params, tokens_BxT,
                                                    rl.temperature)
  state, aux = update_params(exp, state, batch, devices)
  metrics = dict(scored["metrics"])
  metrics["reward"] = rewards["team_B"].mean()
  metrics["tokens"] = sampled_BxT.sum().astype(jnp.float32)
  for r, role in enumerate(layout.roles):
    metrics[f"{role}/reward"] = rewards["role_RxB"][r].mean()
    metrics[f"{role}/grad_norm_share"] = aux["grad_norm"][r] / jnp.maximum(aux["grad_norm"].sum(), 1e-12)
    metrics[f"{role}/loss"] = aux["loss"][r]
    metrics[f"{role}/entropy"] = aux["entropy"][r]
    metrics[f"{role}/approx_kl"] = aux["approx_kl"][r]
    if rl.kl_coef > 0:
      metrics[f"{role}/kl_to_base"] = aux["kl_to_base"][r]
    if cf_team_RxKxB is not None:
      metrics[f"{role}/influence"] = jnp.abs(credit.difference_credit(
          rewards["team_B"], cf_team_RxKxB)[r]).mean()
  metrics = {k: jax.lax.pmean(v, parallel.DATA) for k, v in metrics.items()}
  metrics["tokens"] = metrics["tokens"] * devices
  return state.replace(step=state.step + 1), metrics


# ---------------------------------------------------------------------------------------------
# The compiled program: scan over steps, vmap over seeds, shard_map over devices.


def make_train_call(exp: Experiment):
  """`train_call(state_S) -> (state_S, metrics_SxN)`: N = steps_per_call steps in one program."""
  config, rl = exp.config, exp.config.rl
  rows = jnp.arange(rl.batch_size)
  fold_rows = jax.vmap(jax.random.fold_in, in_axes=(None, 0))

  def row_keys(state):
    # Keys are per row of the global batch, so a row's episode does not depend on the device count.
    k_problem, k_sample, k_cf = jax.random.split(jax.random.fold_in(state.key, state.step), 3)
    return (fold_rows(k_problem, rows // rl.group_size), fold_rows(k_sample, rows),
            fold_rows(k_cf, rows))

  rows_spec = P(None, parallel.DATA)
  sharded_step = jax.shard_map(
      jax.vmap(functools.partial(local_step, exp)), mesh=exp.mesh,
      in_specs=(P(), rows_spec, rows_spec, rows_spec), out_specs=(P(), P()), check_vma=False)

  def one_step(state_S, _):
    return sharded_step(state_S, *jax.vmap(row_keys)(state_S))

  @functools.partial(jax.jit, donate_argnums=0)
  def train_call(state_S):
    state_S, metrics_NxS = jax.lax.scan(one_step, state_S, None, length=config.steps_per_call)
    return state_S, jax.tree.map(lambda m: m.T, metrics_NxS)

  return train_call


def make_evaluate(exp: Experiment, greedy: bool = True):
  """`evaluate(params_S) -> metrics_S` on the fixed evaluation set (greedy, or sampled)."""
  cfg = exp.config.eval
  if cfg.data_dir:  # the versioned TFDS evaluation set: read when it exists, built when it does not
    from marl_jax import data  # data builds on train, so it is imported here, not at the top
    problems = data.load_eval_set(exp.task, cfg.seed, cfg.size, cfg.data_dir)
  else:
    problems = tasks.eval_problems(exp.task, cfg.seed, cfg.size)
  keys = jax.random.split(jax.random.PRNGKey(cfg.seed + 1), cfg.size)

  @jax.jit
  def evaluate(params_S):
    def one_seed(params_R):
      tokens_BxT, _, _ = rollout(exp, params_R, problems, keys, greedy)
      return exp.protocol.rewards(exp.task, exp.layout, problems, tokens_BxT)["metrics"]
    return jax.vmap(one_seed)(params_S)

  return evaluate


def to_host(tree):
  """Replicated (possibly multi-process) arrays to numpy."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def replicate(exp: Experiment, tree):
  """Host-identical values to arrays replicated over the (possibly multi-process) mesh."""
  sharding = NamedSharding(exp.mesh, P())
  to_global = lambda x: jax.make_array_from_callback(x.shape, sharding, lambda i: np.asarray(x)[i])
  return jax.tree.map(to_global, tree)


def initial_state(exp: Experiment, params_S=None):
  """State for all seeds: `params_S` (e.g. from `init_from`), else an inline warm start, else random."""
  config = exp.config
  keys_S = jax.random.split(jax.random.PRNGKey(config.seed), config.num_seeds)
  if params_S is None and config.sft.steps > 0:
    params_S = sft.warm_start(exp, keys_S)
  return replicate(exp, jax.jit(jax.vmap(functools.partial(init_state, exp)))(keys_S, params_S))


def abstract_state(exp: Experiment):
  """Shapes, dtypes and (replicated) shardings of the state of all seeds, for restoring."""
  shapes = jax.eval_shape(jax.vmap(functools.partial(init_state, exp)),
                          jax.random.split(jax.random.PRNGKey(0), exp.config.num_seeds))
  sharding = NamedSharding(exp.mesh, P())
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), shapes)


def load_params(exp: Experiment, workdir: str, step: int | None = None):
  """params_S from a checkpoint (the latest by default) of another run (e.g. a warm start)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path) or checkpoint.latest_step(workdir) is None:
    raise FileNotFoundError(f"config.init_from={workdir!r} holds no config.json and checkpoint")
  with open(path) as f:
    other_config = ml_collections.ConfigDict(json.load(f))
  other_config.num_devices = 1
  other = build(other_config)
  params_S = checkpoint.restore(workdir, abstract_state(other), step).params
  expected = jax.eval_shape(lambda: model_lib.init_stack(exp.model, jax.random.PRNGKey(0), exp.num_sets))
  if jax.tree.map(lambda p: p.shape, expected) != jax.tree.map(lambda p: p.shape[1:], params_S):
    raise ValueError(f"config.init_from={workdir!r} holds a model whose shapes or parameter sets "
                     f"differ from config.model / config.roles")
  S = jax.tree.leaves(params_S)[0].shape[0]
  if S not in (1, exp.config.num_seeds):
    raise ValueError(f"config.init_from={workdir!r} holds {S} seeds; config.num_seeds="
                     f"{exp.config.num_seeds} needs 1 or the same number")
  return jax.tree.map(lambda p: jnp.broadcast_to(p, (exp.config.num_seeds,) + p.shape[1:]), params_S)


# ---------------------------------------------------------------------------------------------
# Host loop.


def summarize(metrics_SxN) -> dict:
  """Mean over the steps of a call, kept per seed: {name: values_S}."""
  return {k: np.asarray(v).mean(-1) for k, v in metrics_SxN.items()}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> None:
  if config.distributed:
    parallel.initialize_distributed()
  exp = build(config)  # every config error surfaces here, before the workdir is touched
  # A bad warm-start directory fails here too, before anything is written.
  init_params_S = load_params(exp, config.init_from) if config.init_from else None
  lead = jax.process_index() == 0
  if lead:
    os.makedirs(workdir, exist_ok=True)
  mngr = checkpoint.manager(workdir)
  start = mngr.latest_step()
  if start is None:
    state_S = initial_state(exp, init_params_S)
  else:
    state_S = checkpoint.restore(workdir, abstract_state(exp))
  if lead:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json(indent=2))
  writer = metrics_lib.Writer(workdir, config.total_steps, start or 0, enabled=lead)
  evaluate = make_evaluate(exp)

  def eval_scalars(state_S):
    return {f"eval_{k}": v for k, v in to_host(evaluate(state_S.params)).items()}

  def log(step, scalars_S):
    row = {}
    for name, values_S in scalars_S.items():
      row.update(metrics_lib.per_seed(name, values_S))
    writer.write(step, row)

  if start is None:
    start = 0
    sampled = to_host(make_evaluate(exp, greedy=False)(state_S.params))
    log(0, {"accuracy": sampled["accuracy"], **eval_scalars(state_S)})
    checkpoint.save(mngr, 0, state_S)  # the base model, reusable through config.init_from

  train_call = make_train_call(exp)
  tokens, clock = 0.0, None
  for step in range(start + config.steps_per_call, config.total_steps + 1, config.steps_per_call):
    state_S, metrics_SxN = train_call(state_S)
    jax.block_until_ready(state_S)  # never queue many collective-heavy calls on the CPU backend
    now = time.perf_counter()
    if clock is None:  # the first call compiles; measure throughput from the second on
      clock, tokens = now, 0.0
    summary = summarize(to_host(metrics_SxN))
    tokens += float(summary["tokens"].sum()) * config.steps_per_call
    writer.advance(step)
    if step % config.log_every == 0 or step % config.eval_every == 0:
      row = dict(summary)
      if now > clock:
        row["tokens_per_s"] = np.asarray(tokens / (now - clock))
      if step % config.eval_every == 0:
        row.update(eval_scalars(state_S))
      log(step, row)
    if step % config.checkpoint_every == 0 or step == config.total_steps:
      checkpoint.save(mngr, step, state_S)
  mngr.wait_until_finished()
  writer.close()
