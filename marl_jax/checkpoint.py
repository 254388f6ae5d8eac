"""Orbax checkpoints under DIR/checkpoints; a step is only visible once completely written."""
import os

import jax
import orbax.checkpoint as ocp
from etils import epath


def manager(workdir: str, max_to_keep: int = 3) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, "checkpoints")),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def latest_step(workdir: str) -> int | None:
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    return None
  return manager(workdir).latest_step()


def _step(mngr: ocp.CheckpointManager, workdir: str, step: int | None) -> int:
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {os.path.join(workdir, 'checkpoints')}")
  return step


def restore(workdir: str, abstract_state, step: int | None = None):
  """Restores into the structure, shapes and shardings of `abstract_state`; a clear error otherwise."""
  mngr = manager(workdir)
  step = _step(mngr, workdir, step)
  try:
    return mngr.restore(step, args=ocp.args.StandardRestore(abstract_state))
  except Exception as e:  # orbax raises several types for missing/corrupt/mismatched files
    raise ValueError(
        f"checkpoint {step} in {workdir} cannot be restored into this config's state: it is corrupt, "
        f"or was written by a different model / roles / credit config, or by a marl_jax older than "
        f"the credit-estimator state (TrainState.credit, added after commit bbf80e3). Start a new "
        f"workdir; --config.init_from={workdir} starts one from its parameters. ({e})") from e


def restore_as_saved(workdir: str, sharding, step: int | None = None) -> dict:
  """The whole saved tree (as nested dicts) with every array placed by `sharding`, whatever state
  layout wrote it: how `init_from` reads parameters from any run."""
  mngr = manager(workdir)
  step = _step(mngr, workdir, step)
  try:
    # The saved tree's shapes and dtypes, placed by `sharding` rather than by the devices that wrote it.
    saved = ocp.StandardCheckpointHandler().metadata(
        epath.Path(os.path.abspath(workdir)) / "checkpoints" / str(step) / "default")
    saved = getattr(saved, "tree", saved)
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding), saved)
    return mngr.restore(step, args=ocp.args.StandardRestore(abstract))
  except Exception as e:
    raise ValueError(f"checkpoint {step} in {workdir} cannot be read (corrupt or not a marl_jax "
                     f"checkpoint): {e}") from e


def save(mngr: ocp.CheckpointManager, step: int, state) -> None:
  mngr.save(step, args=ocp.args.StandardSave(state))
