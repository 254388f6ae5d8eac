"""Mixed teams: parameter sets of different agent models, e.g. a small solver and a larger verifier
(`config.roles.models`).

The sets of one model stay stacked and vmapped as in a uniform team; each model is its own group, so
params_R is {group name: that group's sets, stacked as its model stacks them}.  A set is addressed by
its global index (`config.roles.sharing` numbers them), which `Team` maps to (group, index within the
group).  Every group reads and writes the same canvas values (the engine's symbols, or one
tokenizer's free text), so logits of different groups line up and the step mixes them freely.
"""
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax


@dataclasses.dataclass(frozen=True)
class Team:
  """The agent-model interface over groups: `names[g]` and `models[g]` for group g, `group_S[s]` the
  group of parameter set s."""
  names: tuple[str, ...]
  models: tuple[Any, ...]
  group_S: tuple[int, ...]

  def _local(self, index: int) -> int:
    """Set `index`'s place among its group's sets."""
    return self.group_S[:index].count(self.group_S[index])

  def _sets(self, g: int) -> list[int]:
    return [s for s, group in enumerate(self.group_S) if group == g]

  def set_model(self, index: int):
    return self.models[self.group_S[index]]

  def init_stack(self, key, n_sets: int):
    if n_sets != len(self.group_S):
      raise ValueError(f"a team of {len(self.group_S)} parameter sets cannot initialise {n_sets}")
    return {name: model.init_stack(jax.random.fold_in(key, g), len(self._sets(g)))
            for g, (name, model) in enumerate(zip(self.names, self.models))}

  def pretrained_stack(self, n_sets: int):
    """Every group's checkpoint parameters, or None when the groups start from random ones (`team.make`
    refuses a team that mixes pretrained and randomly initialised groups)."""
    del n_sets
    stacks = {name: model.pretrained_stack(len(self._sets(g)))
              for g, (name, model) in enumerate(zip(self.names, self.models))}
    return None if any(stack is None for stack in stacks.values()) else stacks

  def take_sets(self, params_R, index):
    """One set (an int), unstacked, for `set_model(index)`."""
    if not isinstance(index, (int, np.integer)):
      raise TypeError("a mixed team takes one set at a time; `apply_sets` runs several across groups")
    g = self.group_S[index]
    return self.models[g].take_sets(params_R[self.names[g]], self._local(index))

  def apply_sets(self, params_R, set_N, tokens_BxL, start, key_ok_NxBxT, readout_NxM=None):
    """Each group's sets in one vmap of its model, the logits put back in the order of `set_N`."""
    set_N = np.asarray(set_N)
    group_N = np.asarray(self.group_S)[set_N]
    order, logits = [], []
    for g, name in enumerate(self.names):
      rows = np.flatnonzero(group_N == g)
      if len(rows):
        local = [self._local(int(s)) for s in set_N[rows]]
        logits.append(self.models[g].apply_sets(params_R[name], local, tokens_BxL, start, key_ok_NxBxT[rows],
                                                None if readout_NxM is None else readout_NxM[rows]))
        order.extend(rows)
    return jnp.concatenate(logits)[np.argsort(order)]

  def _per_group(self, make_tx) -> optax.GradientTransformation:
    """A transformation over {group: params} from one per group, `make_tx(g)`."""
    txs = {name: make_tx(g) for g, name in enumerate(self.names)}

    def init(params):
      return {name: tx.init(params[name]) for name, tx in txs.items()}

    def update(grads, state, params=None):
      out = {name: tx.update(grads[name], state[name], None if params is None else params[name])
             for name, tx in txs.items()}
      return {name: u for name, (u, _) in out.items()}, {name: s for name, (_, s) in out.items()}

    return optax.GradientTransformation(init, update)

  def trainable(self, tx):
    return self._per_group(lambda g: self.models[g].trainable(tx))

  def per_set(self, tx, scale_S):
    """Each group's parameter sets vmapped over with their own states, as its model restricts `tx`."""
    scale_S = np.asarray(scale_S)
    return self._per_group(lambda g: self.models[g].per_set(tx, scale_S[self._sets(g)]))

  def set_norms(self, tree_R):
    norms = [self.models[g].set_norms(tree_R[name]) for g, name in enumerate(self.names)]
    order = [s for g in range(len(self.names)) for s in self._sets(g)]
    return jnp.concatenate(norms)[np.argsort(order)]


def make(names: tuple[str, ...], models: tuple, group_S: tuple[int, ...], free_text: bool = False) -> Team:
  """A team of `models` (named `config.models` keys, 'model' for `config.model`), refused before
  anything compiles when its groups cannot share one canvas or one start."""
  keys = ["config.model" if name == "model" else f"config.models.{name}" for name in names]
  vocab = {key: model.vocab_size for key, model in zip(keys, models)}
  if len(set(vocab.values())) > 1 or (free_text and len({getattr(m, "canvas_ids_V", None) for m in models}) > 1):
    raise ValueError(f"config.roles.models: the team's models read different canvases ({vocab} values"
                     f"{', or free text through different tokenizers' if free_text else ''}); allowed: "
                     f"models whose logits line up (the built-in model and checkpoints on the engine's "
                     f"symbols, or checkpoints of one tokenizer on free text)")
  pretrained = {key: not getattr(model, "random_weights", True) for key, model in zip(keys, models)}
  if len(set(pretrained.values())) > 1:
    raise ValueError(f"config.roles.models: some models start from checkpoint weights and others from "
                     f"random ones ({pretrained}); allowed: all from checkpoints or all random (the "
                     f"built-in model, or random_weights=True)")
  return Team(names, models, group_S)
