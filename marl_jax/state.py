"""The training state of all seeds: one seed's initialisation (random or given parameters), its
abstract shape for restoring, and moving it between hosts and the device mesh.  The loop starts a run
(`loop.initial_state`: given parameters, a warm start, pretrained or random ones)."""
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import model as model_lib
from marl_jax.experiment import Experiment
from marl_jax.rewards import replay as replay_lib


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any  # params_R: parameter sets stacked on a leading axis
  ref_params: Any  # the warm-started base model for the KL penalty; () without one (`rl.kl_coef=0`)
  opt_state: Any  # one optimiser state per parameter set (`model.per_set`)
  credit: Any  # the credit estimator's own state (a learned baseline or critic); () when it has none
  key: jax.Array
  reward: Any = ()  # the judges' payment rule's own state (reputation's track records); () when none
  replay: Any = ()  # the replay of labelled judged answers (`rewards.replay`); () without one


def init_state(exp: Experiment, key, params_R=None) -> TrainState:
  """One seed's state; `params_R` (e.g. a warm start) replaces the random initialisation."""
  k_init, k_run = jax.random.split(key)
  if params_R is None:
    params_R = model_lib.init_stack(exp.model, k_init, exp.num_sets)
  opt_state = exp.optimizer.init(params_R)
  # The estimator's own key, folded from the seed's: the parameters' and the run's keys stay as they were.
  credit_state = exp.credit.init(jax.random.fold_in(key, 2), exp.layout)
  # Only the KL penalty reads the base model: without it, neither the state nor a checkpoint holds a
  # copy (a quarter of a two-set Qwen3-0.6B run's state with Adam).
  ref_params = params_R if exp.config.rl.kl_coef > 0 else ()
  return TrainState(step=jnp.zeros((), jnp.int32), params=params_R, ref_params=ref_params,
                    opt_state=opt_state, credit=credit_state, key=k_run,
                    reward=exp.reward.init(len(exp.protocol.judge_roles)), replay=replay_init(exp))


def replay_init(exp: Experiment):
  """An empty replay of labelled answers (`config.reward.replay` episodes), or () without one."""
  if not exp.reward.replay:
    return ()
  answers = len(exp.protocol.verdict_readout(exp.layout).answer_turn_K)
  return replay_lib.init(exp.reward.replay, exp.layout.length, answers)


def to_host(tree):
  """Replicated (possibly multi-process) arrays to numpy."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def place(exp: Experiment, tree):
  """Host-identical values to arrays on the (possibly multi-process) mesh, where `exp.shardings`
  puts them: replicated, or parameters split over the `model` axis.  An array already spread over
  several processes' devices (a warm start split over a `model` axis that spans hosts) cannot be read
  on one host: it moves between shardings on the devices instead."""
  def to_global(x, sharding):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return jax.device_put(x, sharding)
    return jax.make_array_from_callback(x.shape, sharding, lambda i: np.asarray(x)[i])
  return jax.tree.map(to_global, tree, exp.shardings(tree))


def seed_keys(config) -> jax.Array:
  """keys_S: each seed's key, split from `config.seed`; its warm start's and its run's."""
  return jax.random.split(jax.random.PRNGKey(config.seed), config.num_seeds)


def abstract_state(exp: Experiment) -> TrainState:
  """Shapes, dtypes and shardings (`exp.shardings`) of the state of all seeds, for restoring."""
  shapes = jax.eval_shape(jax.vmap(functools.partial(init_state, exp)),
                          jax.random.split(jax.random.PRNGKey(0), exp.config.num_seeds))
  return exp.abstract(shapes)
