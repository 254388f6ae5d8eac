"""Config -> Experiment: every validation, the role map, the credit estimator, the loss and the
optimiser.  Everything a run closes over is built here, before anything compiles or is written."""
import dataclasses
from collections.abc import Callable

import jax
import ml_collections
import optax

from marl_jax import credit, losses, parallel, protocols, tasks
from marl_jax import model as model_lib
from marl_jax.protocols import engine


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
  credit: credit.Estimator
  loss: Callable  # (losses.LossInput, config.rl) -> loss_BxT
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


def build(config: ml_collections.ConfigDict) -> Experiment:
  """Validates the config and builds the static pieces; raises a clear error before any compile."""
  task_name, task_knobs = _sub_config(config.task)
  task = tasks.make(task_name, **task_knobs)
  protocol_name, protocol_knobs = _sub_config(config.protocol)
  protocol = protocols.make(protocol_name, task, **protocol_knobs)
  role_set_R = role_map(protocol.roles, config.roles.sharing)
  num_sets = max(role_set_R) + 1
  if sorted(set(role_set_R)) != list(range(num_sets)):
    raise ValueError(f"config.roles.sharing={list(role_set_R)} names parameter sets "
                     f"{sorted(set(role_set_R))}; sets must be numbered 0..n-1 without gaps")
  trainable = str(config.roles.trainable)
  trainable_R = (tuple(t.strip().lower() in ("1", "true") for t in trainable.split(",")) if trainable
                 else (True,) * num_sets)
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
  loss = losses.get(rl.algorithm)
  if rl.group_size < 1 or rl.batch_size % rl.group_size:
    raise ValueError(f"config.rl.batch_size={rl.batch_size} must divide by config.rl.group_size="
                     f"{rl.group_size}")
  credit_name, credit_knobs = _sub_config(config.credit)
  estimator = credit.make(credit_name, **credit_knobs)
  estimator.check(len(protocol.roles), rl.group_size)
  mesh = parallel.make_mesh(config.num_devices)
  devices = mesh.devices.size
  local_batch = rl.batch_size // devices
  if rl.batch_size % devices or local_batch % rl.group_size:
    raise ValueError(f"config.rl.batch_size={rl.batch_size} must split into {devices} devices with "
                     f"whole groups of config.rl.group_size={rl.group_size} on each")
  if local_batch % rl.minibatches:
    raise ValueError(f"the per-device batch {local_batch} must divide by config.rl.minibatches="
                     f"{rl.minibatches}")
  if config.eval.size % devices:
    raise ValueError(f"config.eval.size={config.eval.size} must divide by the {devices} devices "
                     f"(evaluation is sharded like training)")
  for key in ("log_every", "eval_every", "checkpoint_every", "total_steps"):
    if config[key] % config.steps_per_call:
      raise ValueError(f"config.{key}={config[key]} must be a multiple of config.steps_per_call="
                       f"{config.steps_per_call}")
  model_cfg = model_lib.ModelConfig(
      d_model=config.model.d_model, n_layers=config.model.n_layers, n_heads=config.model.n_heads,
      d_ff=config.model.d_ff, max_len=config.model.max_len,
      dtype=model_lib.compute_dtype(config.model.dtype))
  optimizer = make_optimizer(config.optim, config.total_steps * rl.epochs * rl.minibatches)
  make_optimizer(sft_optim(config), config.sft.steps, "sft")  # refuses bad warm-start settings now
  return Experiment(config, task, protocol, layout, model_cfg, role_set_R, trainable_R, estimator,
                    loss, optimizer, mesh)
