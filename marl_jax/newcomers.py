"""Newcomers (issue 50): a trained team (`config.init_from`) with some of its roles replaced,
`config.newcomers.roles` (comma-separated role names), by fresh parameters (`config.newcomers.source=fresh`)
or by the same roles of another independently trained team (`source=DIR`, its latest checkpoint, or
`DIR:best`).  The rest of the team keeps its parameters, and trains on or stays frozen as
`config.roles.trainable` says.  With `config.newcomers.distil` the warm start (`config.sft`: the
workflow's demonstrations, or the team's archive as `config.sft.transcripts`) first trains the
newcomers alone, each its own role's messages, the rest of the team unchanged.  A newcomer has a
parameter set of its own; the run then trains as any run started from `init_from` does, and its
checkpoint 0 is the team the newcomers joined (after their distillation).

`python -m marl_jax.tools.newcomer_report --workdir=NEWCOMER_RUN` reports how a finished newcomer run
recovered (`marl_jax.tools.newcomer_report`).
"""
import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks
from marl_jax import model as model_lib
from marl_jax.experiment import Experiment

FRESH = "fresh"
_FRESH_KEYS = 13  # folded into each seed's key for a fresh newcomer's parameters


def replaced_sets(exp: Experiment) -> tuple[int, ...]:
  """The parameter sets `config.newcomers.roles` replace; () without newcomers.  Refuses (ValueError)
  newcomers without a team to join, unknown roles, and a role that shares its set with one that stays."""
  config = exp.config
  roles = checks.role_names("newcomers.roles", config.newcomers.roles, exp.layout.roles)
  if not roles:
    return ()
  if not config.init_from:
    raise ValueError(f"config.newcomers.roles={config.newcomers.roles!r} needs config.init_from, the trained team "
                     "the newcomers join")
  sets = sorted({exp.role_set_R[exp.layout.roles.index(r)] for r in roles})
  staying = [r for r, s in zip(exp.layout.roles, exp.role_set_R) if s in sets and r not in roles]
  if staying:
    raise ValueError(f"config.newcomers.roles={config.newcomers.roles!r} would replace roles {staying} too, which share "
                     f"their parameter sets (config.roles.sharing); allowed: roles with sets of their own")
  if exp.model.set_axes(jax.eval_shape(lambda: model_lib.init_stack(exp.model, jax.random.PRNGKey(0), exp.num_sets))) != 0:
    raise ValueError("config.newcomers.roles: this model has parameters every set shares (adapters over one "
                     "base); allowed: a model whose every parameter is per set (the built-in model, full weights)")
  return tuple(sets)


def distilled(config) -> bool:
  """Whether the warm start trains newcomers (`config.newcomers.distil`) before RL."""
  return bool(config.newcomers.distil and str(config.newcomers.roles).strip())


def fresh_params(exp: Experiment, keys_S):
  """params_S of a random initialisation per seed (from the seeds' keys_S), apart from the team's own."""
  keys_S = jax.vmap(lambda k: jax.random.fold_in(k, _FRESH_KEYS))(keys_S)
  return jax.jit(jax.vmap(lambda k: model_lib.init_stack(exp.model, k, exp.num_sets)))(keys_S)


def join(exp: Experiment, team_S, newcomers_S):
  """The team's params_S with the sets of `replaced_sets` taken from newcomers_S (each leaf
  [seed, set, ...])."""
  replaced_R = np.isin(np.arange(exp.num_sets), replaced_sets(exp))
  pick = lambda team, new: jnp.where(replaced_R.reshape((1, -1) + (1,) * (team.ndim - 2)), new, team)
  return jax.tree.map(pick, team_S, newcomers_S)
