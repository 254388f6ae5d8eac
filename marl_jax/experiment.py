"""Config -> Experiment: every validation, the role map, the reward source and judges' payment rule,
the credit estimator, the loss and the optimiser.  Everything a run closes over is built here, before anything compiles or is written."""
import dataclasses
import functools
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from marl_jax import checks, credit, losses, parallel, protocols, rewards, tasks
from marl_jax import mixed_teams
from marl_jax import model as model_lib
from marl_jax.lm import agent as lm_agent
from marl_jax.lm import model as lm_model
from marl_jax.lm import sharding as lm_sharding
from marl_jax.protocols import engine


class ConfigError(ValueError):
  """A config, `init_from` or workdir the run refuses, before anything is compiled or written; the
  command line prints its message alone, without a traceback."""


# What a non-finite reward, advantage, loss, gradient or updated state does (`config.rl.on_nonfinite`):
# the update is skipped either way; `skip` counts it and goes on, `stop` ends the run with the step,
# role and quantity.
ON_NONFINITE = ("skip", "stop")

# Integer settings that others divide by or loop over, with the least value each allows.
_AT_LEAST = {"num_seeds": 1, "seeds_at_once": 0, "total_steps": 0, "steps_per_call": 1, "log_every": 1,
             "eval_every": 1, "checkpoint_every": 1, "num_devices": 0, "model_shards": 1, "model.max_len": 1,
             "rl.batch_size": 1, "rl.group_size": 1, "rl.epochs": 1, "rl.minibatches": 1, "rl.microbatch_size": 0,
             "rl.rollout_batch_size": 0, "optim.warmup_steps": 0, "sft.steps": 0, "sft.batch_size": 1, "sft.microbatch_size": 0,
             "sft.warmup_steps": 0, "sft.steps_per_call": 1, "eval.size": 1, "eval.batch_size": 0,
             "eval.divergence_every": 0}
# The built-in model's shapes are checked where it is made (`make_model`), for each model of a team.
# Real settings that must be above a bound.
_ABOVE = {"rl.temperature": 0.0, "rl.clip_eps": 0.0, "optim.learning_rate": 0.0, "optim.max_grad_norm": 0.0,
          "sft.learning_rate": 0.0}
# Real settings with the least value each allows: coefficients that 0 turns off.
_NOT_BELOW = {"rl.kl_coef": 0.0, "rl.entropy_coef": 0.0, "optim.weight_decay": 0.0}
# Adam's decay rates, in [0, 1): 1 would never forget.
_DECAY_RATES = ("optim.b1", "optim.b2", "sft.b2")


def check_ranges(config: ml_collections.ConfigDict) -> None:
  """The numeric settings are in range, before anything divides by them.  Each check says what is
  allowed, so a NaN (every comparison with it False) is refused too."""
  def value(key):
    return functools.reduce(getattr, key.split("."), config)

  for key, low in _AT_LEAST.items():
    checks.integer(key, value(key), low)
  for key, low in _ABOVE.items():
    checks.number(key, value(key), low, above=True)
  for key, low in _NOT_BELOW.items():
    checks.number(key, value(key), low)
  for key in _DECAY_RATES:
    checks.number(key, value(key), 0, below=1)


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Everything static a run closes over, built (and validated) from the config before compiling."""
  config: ml_collections.ConfigDict
  task: tasks.Task
  protocol: protocols.Protocol
  layout: engine.Layout
  model: model_lib.ModelConfig | lm_agent.LMAgent | mixed_teams.Team
  role_set_R: tuple[int, ...]
  trainable_R: tuple[bool, ...]
  credit: credit.Estimator
  loss: Callable  # (losses.LossInput, config.rl) -> loss_BxT
  optimizer: optax.GradientTransformation  # over params_R, one state per set (`model.per_set`)
  mesh: jax.sharding.Mesh
  reward: rewards.PayRule  # where the judged roles' reward comes from, how judges are paid

  @property
  def num_sets(self) -> int:
    return len(self.trainable_R)

  @property
  def splits_parameters(self) -> bool:
    """Whether the mesh has a `model` axis that parameters are split over (`config.model_shards` > 1)."""
    return parallel.MODEL in self.mesh.shape

  def shardings(self, tree):
    """Where each leaf of a state-shaped tree (arrays or shapes) lives on the mesh: replicated, or
    with `config.model_shards` > 1 the parameters (and what mirrors them) split over the `model`
    axis by `config.model.sharding_rules` (`lm.sharding.state_shardings`)."""
    if not self.splits_parameters:
      return jax.tree.map(lambda _: NamedSharding(self.mesh, P()), tree)
    return lm_sharding.state_shardings(tree, self.mesh, lm_sharding.rules_from_config(self.config.model))

  def abstract(self, shapes):
    """`shapes` (a state-shaped tree of arrays or shapes) as `jax.ShapeDtypeStruct`s placed by
    `shardings`: what a checkpoint restores into."""
    return jax.tree.map(lambda a, sharding: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                        shapes, self.shardings(shapes))


# `config.roles.sharing` by name, a role map of R roles: each role its own parameter set, or one for all.
NAMED_SHARING = {"isolated": lambda R: tuple(range(R)), "shared": lambda R: (0,) * R}


def role_map(roles, sharing) -> tuple[int, ...]:
  if isinstance(sharing, str) and sharing in NAMED_SHARING:
    return NAMED_SHARING[sharing](len(roles))
  try:
    role_set = tuple(int(s) for s in str(sharing).split(","))
  except ValueError:
    role_set = ()
  if len(role_set) != len(roles) or min(role_set) < 0:
    raise ValueError(f"config.roles.sharing={sharing!r}; allowed: {', '.join(map(repr, NAMED_SHARING))}, or a "
                     f"parameter set for each role {list(roles)} such as '0,1'")
  return role_set


def per_set_values(key: str, text: str, num_sets: int, parse, default, allowed: str) -> list:
  """One value per parameter set from `config.roles.KEY` (comma-separated; '' gives every set
  `default`), each `parse`d (None, or a ValueError: not allowed), refused naming the key and `allowed`."""
  try:
    values = [parse(s.strip()) for s in text.split(",")] if text else [default] * num_sets
  except ValueError:
    values = []
  if len(values) != num_sets or any(v is None for v in values):
    raise ValueError(f"config.roles.{key}={text!r} for {num_sets} parameter sets (from config.roles.sharing); "
                     f"allowed: {allowed}, such as {','.join(['1'] * num_sets)!r}")
  return values


def learning_rate_scales(lr_scale: str, num_sets: int) -> np.ndarray:
  """lr_scale_S from `config.roles.lr_scale`: each parameter set's factor on the learning rate (a
  judge that learns slower than the solver it judges, say), 1 for every set when empty."""
  factor = lambda s: float(s) if np.isfinite(float(s)) and float(s) >= 0 else None
  return np.array(per_set_values("lr_scale", lr_scale, num_sets, factor, 1.0,
                                 "'' (1 for every set) or one factor >= 0 per set"))


def make_optimizer(optim, total_updates: int, group: str = "optim") -> optax.GradientTransformation:
  """Gradient clipping, then the optimiser `optim.name` on the schedule `optim.schedule`.  `group`
  names the config group in errors (`sft` builds its warm-start optimiser with this too)."""
  schedules = {
      "constant": lambda: optax.constant_schedule(optim.learning_rate),
      "cosine": lambda: optax.warmup_cosine_decay_schedule(
          0.0, optim.learning_rate, optim.warmup_steps, max(total_updates, optim.warmup_steps + 1)),
  }
  if optim.schedule not in schedules:
    raise ValueError(f"config.{group}.schedule={optim.schedule!r} is unknown; allowed: {sorted(schedules)}")
  lr = schedules[optim.schedule]()
  optimizers = {
      "adam": lambda: optax.adam(lr, b1=optim.b1, b2=optim.b2),
      "adamw": lambda: optax.adamw(lr, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay),
      "sgd": lambda: optax.sgd(lr),
  }
  if optim.name not in optimizers:
    raise ValueError(f"config.{group}.name={optim.name!r} is unknown; allowed: {sorted(optimizers)}")
  return optax.chain(optax.clip_by_global_norm(optim.max_grad_norm), optimizers[optim.name]())


def sft_optim(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The warm start's optimiser settings: `config.optim`, with the keys `config.sft` sets replacing
  those of `config.optim` (learning rate, schedule, ...)."""
  optim = ml_collections.ConfigDict(config.optim.to_dict())
  optim.update({k: v for k, v in config.sft.items() if k in optim})
  if optim.schedule == "cosine" and optim.warmup_steps == 0:  # 0: a tenth of the steps, at most 100
    optim.warmup_steps = min(100, config.sft.steps // 10 + 1)
  return optim


def _sub_config(group: ml_collections.ConfigDict) -> tuple[str, dict]:
  return group.name, {k: v for k, v in group.items() if k != "name"}


def _check_rows_per_pass(key: str, size: int, rows: int, what: str) -> None:
  """A setting that caps a pass's rows (`parallel.rows_per_pass`) leaves whole passes of a device's rows."""
  if rows % parallel.rows_per_pass(size, rows):
    raise ValueError(f"config.{key}={size} does not divide the per-device {what} of {rows} rows; allowed: 0 "
                     f"(the whole {what}), its divisors or at least {rows} (one pass)")


def build(config: ml_collections.ConfigDict) -> Experiment:
  """Validates the config and builds the static pieces; raises a clear error before any compile."""
  check_ranges(config)
  if config.rl.on_nonfinite not in ON_NONFINITE:
    raise ValueError(f"config.rl.on_nonfinite={config.rl.on_nonfinite!r} is unknown; allowed: "
                     f"{list(ON_NONFINITE)}")
  task = tasks.from_config(config)
  task.check(config.eval.size)
  protocol_name, protocol_knobs = _sub_config(config.protocol)
  protocol = protocols.make(protocol_name, task, **protocol_knobs)
  role_set_R = role_map(protocol.roles, config.roles.sharing)
  num_sets = max(role_set_R) + 1
  if sorted(set(role_set_R)) != list(range(num_sets)):
    raise ValueError(f"config.roles.sharing={list(role_set_R)} names parameter sets "
                     f"{sorted(set(role_set_R))}; sets must be numbered 0..n-1 without gaps")
  flag = {"1": True, "true": True, "0": False, "false": False}
  trainable_R = tuple(per_set_values("trainable", str(config.roles.trainable), num_sets,
                                     lambda s: flag.get(s.lower()), True, "'' (all trainable) or one 1 or 0 per set"))
  lr_scale_S = learning_rate_scales(str(config.roles.lr_scale), num_sets)
  layout = protocol.layout(task, role_set_R)
  if layout.length > config.model.max_len:
    raise ValueError(f"config.model.max_len={config.model.max_len} is too short: prompt plus messages "
                     f"take {layout.length} tokens (their lengths are config.task.* and config.protocol.* "
                     f"settings); allowed: >= {layout.length}")
  rl = config.rl
  loss = losses.REGISTRY.lookup(rl.algorithm)
  losses.entropy_coef_R(rl, layout.roles)  # refuses a name that is not a role
  if rl.batch_size % rl.group_size:
    raise ValueError(f"config.rl.batch_size={rl.batch_size} must divide by config.rl.group_size="
                     f"{rl.group_size}")
  credit_name, credit_knobs = _sub_config(config.credit)
  estimator = credit.make(credit_name, **credit_knobs)
  estimator.check(len(protocol.roles), rl.group_size)
  reward_knobs = {k: v for k, v in config.reward.items() if k != "pay"}
  reward = rewards.make(config.reward.pay, **reward_knobs)
  rewards.check(reward, protocol.judge_roles, estimator.reruns(len(protocol.roles)) is not None,
                estimator.role_rewards, role_set_R, trainable_R, readout=protocol.verdict_readout(layout) is not None)
  model_cfg = make_agents(config, num_sets, task.free_text)
  if reward.cross == "rotate":
    rewards.check_rotation(config.num_seeds, model_cfg.set_axes(jax.eval_shape(
        lambda: model_lib.init_stack(model_cfg, jax.random.PRNGKey(0), num_sets))))
  if config.model_shards > 1 and isinstance(model_cfg, mixed_teams.Team):
    raise ValueError(f"config.model_shards={config.model_shards} with a mixed team (config.roles.models="
                     f"{config.roles.models!r}): split parameters serve one model; allowed: 1")
  mesh = parallel.make_mesh(config.num_devices, config.model_shards)
  devices = mesh.shape[parallel.DATA]
  local_batch = rl.batch_size // devices
  if rl.batch_size % devices or local_batch % rl.group_size:
    raise ValueError(f"config.rl.batch_size={rl.batch_size} must split into {devices} devices with "
                     f"whole groups of config.rl.group_size={rl.group_size} on each")
  if local_batch % rl.minibatches:
    raise ValueError(f"config.rl.minibatches={rl.minibatches} does not divide the per-device batch "
                     f"{local_batch}; allowed: its divisors")
  if config.seeds_at_once > config.num_seeds:
    raise ValueError(f"config.seeds_at_once={config.seeds_at_once} is more than config.num_seeds="
                     f"{config.num_seeds}; allowed: 0 (every seed at once) to {config.num_seeds}")
  _check_rows_per_pass("rl.rollout_batch_size", rl.rollout_batch_size, local_batch, "batch")
  if reward.replay and reward.replay < rl.batch_size:
    raise ValueError(f"config.reward.replay={reward.replay} holds fewer episodes than one step writes at most "
                     f"(config.rl.batch_size={rl.batch_size}); allowed: >= {rl.batch_size}")
  if reward.replay_rows % rl.minibatches:
    raise ValueError(f"config.reward.replay_rows={reward.replay_rows} does not split into config.rl.minibatches="
                     f"{rl.minibatches}; allowed: its multiples")
  _check_rows_per_pass("rl.microbatch_size", rl.microbatch_size,
                       (local_batch + reward.replay_rows) // rl.minibatches, "minibatch")
  _check_rows_per_pass("sft.microbatch_size", config.sft.microbatch_size, config.sft.batch_size, "warm-start batch")
  if config.eval.size % devices:
    raise ValueError(f"config.eval.size={config.eval.size} does not split over the {devices} devices "
                     f"(evaluation is sharded like training); allowed: multiples of {devices}")
  _check_rows_per_pass("eval.batch_size", config.eval.batch_size, config.eval.size // devices, "evaluation set")
  for key in ("log_every", "eval_every", "checkpoint_every", "total_steps"):
    if config[key] % config.steps_per_call:
      raise ValueError(f"config.{key}={config[key]} must be a multiple of config.steps_per_call="
                       f"{config.steps_per_call}")
  if config.model_shards > 1:
    check_model_sharding(config, model_cfg, mesh)
  tx = make_optimizer(config.optim, config.total_steps * rl.epochs * rl.minibatches)
  optimizer = model_lib.per_set(model_cfg, tx, np.asarray(trainable_R) * lr_scale_S)
  make_optimizer(sft_optim(config), config.sft.steps, "sft")  # refuses bad warm-start settings now
  return Experiment(config, task, protocol, layout, model_cfg, role_set_R, trainable_R, estimator,
                    loss, optimizer, mesh, reward)


def check_model_sharding(config, model_cfg, mesh) -> None:
  """`config.model_shards` > 1 splits a language model's parameters: every parameter of the decoder
  must match a rule of `config.model.sharding_rules` whose split dimensions divide by the axis."""
  if not isinstance(model_cfg, lm_agent.LMAgent):
    raise ValueError(f"config.model_shards={config.model_shards} splits a language model's parameters "
                     f"(config.model.checkpoint); the built-in model is small enough for one device: "
                     f"allowed: 1")
  shapes = jax.eval_shape(lambda: lm_model.init_stack(model_cfg.lm, jax.random.PRNGKey(0), 1))
  lm_sharding.partition_specs(shapes, mesh.shape, lm_sharding.rules_from_config(config.model),
                              leading_axes=1)


def make_agents(config: ml_collections.ConfigDict, num_sets: int, free_text: bool = False):
  """The agent model of every parameter set: `config.model` for all of them, or with
  `config.roles.models` (one name per set: 'model' or a key of `config.models`) a mixed team, one
  group per distinct model (`marl_jax.mixed_teams`; names whose configs build the same model share a group,
  stacked together).  Every model uses `config.model.max_len` (one canvas)."""
  names = str(config.roles.models)
  if not names:
    return make_model(config.model, free_text)
  allowed = ["model", *config.models.keys()]
  names_S = tuple(n.strip() for n in names.split(","))
  if len(names_S) != num_sets or not set(names_S) <= set(allowed):
    raise ValueError(f"config.roles.models={names!r} for {num_sets} parameter sets (from "
                     f"config.roles.sharing); allowed: '' (config.model for every set) or one name per set "
                     f"from {allowed}, such as {','.join(allowed[:1] * num_sets)!r}")
  by_name = {}
  for name in dict.fromkeys(names_S):  # in order of first use
    model_config = config.model if name == "model" else ml_collections.ConfigDict(config.models[name].to_dict())
    model_config.max_len = config.model.max_len
    by_name[name] = make_model(model_config, free_text, "config." + ("model" if name == "model" else f"models.{name}"))
  models_S = [by_name[n] for n in names_S]
  groups = list(dict.fromkeys(models_S))  # one group per distinct model, in order of first use
  if len(groups) == 1:  # every set on one model: a uniform team of it
    agents = groups[0]
  else:
    group_S = tuple(groups.index(model) for model in models_S)
    group_names = tuple(names_S[group_S.index(g)] for g in range(len(groups)))  # a group's first name
    agents = mixed_teams.make(group_names, tuple(groups), group_S, free_text)  # one canvas for all groups
  # A free-text task is posed (tasks.from_config) and archived through config.model's tokenizer.
  if free_text and getattr(groups[0], "canvas_ids_V", None) != tuple(
      lm_agent.free_text_canvas(config.model.checkpoint)[1].tolist()):
    used = ", ".join(f"config.models.{name}.checkpoint" for name in by_name)
    raise ValueError(f"config.roles.models={names!r}: the free-text task is posed through the tokenizer of "
                     f"config.model.checkpoint={config.model.checkpoint!r}, which the roles' models ({used}) "
                     f"do not read; allowed: config.model.checkpoint set to a checkpoint of their tokenizer")
  return agents


def make_model(model_config, free_text: bool = False, key: str = "config.model"):
  """`config.model` (or another model config, named `key` in errors) -> the agent model: the built-in
  transformer, or with `checkpoint` a local Qwen3/Llama checkpoint (`lm.agent`, over its whole
  vocabulary for a `free_text` task; `d_model`, `n_layers`, `n_heads`, `d_ff` are then the
  checkpoint's, from its config.json)."""
  # A config saved before the setting existed (an archive's, say) recomputes nothing, as it ran.
  remat = model_config.get("remat", False)
  if not isinstance(remat, bool):
    raise ValueError(f"{key}.remat={remat!r}; allowed: True or False")
  if model_config.checkpoint:
    return lm_agent.from_config(model_config, free_text, key)
  if model_config.lora.enabled:
    raise ValueError(f"{key}.lora.enabled=True needs {key}.checkpoint: adapters train on a "
                     "checkpoint's frozen weights, not on the built-in model")
  for shape in ("d_model", "n_layers", "n_heads", "d_ff"):  # a checkpoint's are its config.json's
    checks.integer(f"{key.removeprefix('config.')}.{shape}", model_config[shape], 1)
  if model_config.d_model % model_config.n_heads:
    raise ValueError(f"{key}.d_model={model_config.d_model} does not divide by "
                     f"{key}.n_heads={model_config.n_heads}; allowed: multiples of it")
  return model_lib.ModelConfig(
      d_model=model_config.d_model, n_layers=model_config.n_layers, n_heads=model_config.n_heads,
      d_ff=model_config.d_ff, max_len=model_config.max_len, dtype=model_lib.compute_dtype(model_config.dtype),
      remat=remat)
