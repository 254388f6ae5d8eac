"""Orbax checkpoints under DIR/checkpoints; a step is only visible once completely written."""
import os

import jax
import orbax.checkpoint as ocp


def manager(workdir: str, max_to_keep: int = 3) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, "checkpoints")),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def latest_step(workdir: str) -> int | None:
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    return None
  return manager(workdir).latest_step()


def restore(workdir: str, abstract_state, step: int | None = None):
  """Restores into the structure, shapes and shardings of `abstract_state`; a clear error otherwise."""
  mngr = manager(workdir)
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {os.path.join(workdir, 'checkpoints')}")
  try:
    return mngr.restore(step, args=ocp.args.StandardRestore(abstract_state))
  except Exception as e:  # orbax raises several types for missing/corrupt/mismatched files
    raise ValueError(f"checkpoint {step} in {workdir} cannot be restored into this config's state "
                     f"(corrupt, or written by a different model/roles config): {e}") from e


def save(mngr: ocp.CheckpointManager, step: int, state) -> None:
  mngr.save(step, args=ocp.args.StandardSave(state))


def abstract(state):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
