"""Orbax checkpoints under DIR/checkpoints; a step is only visible once completely written.

Orbax writes a step into a temporary directory and renames it when complete, so a process killed
mid-save leaves the previous steps intact and an unfinished temporary directory, which the next run's
manager removes.  Besides the latest steps, the one with the best evaluation accuracy is kept (its
`BEST` value is saved with it).  A warm start stopped by a signal saves its progress (`sft.Progress`)
under DIR/warm_start, which a rerun resumes; it is removed once checkpoint 0 holds the warm start."""
import contextlib
import json
import math
import os
import re
import shutil

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

BEST = "eval_accuracy"  # mean over seeds; ranks the checkpoints saved with it
_TMP = ".orbax-checkpoint-tmp"  # how orbax names a step that is still being written
WARM_START = "warm_start"  # DIR/warm_start: a stopped warm start's progress, by its step


def _best_value(metrics) -> float:
  return (metrics or {}).get(BEST, -math.inf)


def manager(workdir: str, max_to_keep: int = 3, read_only: bool = False,
            folder: str = "checkpoints") -> ocp.CheckpointManager:
  """The run's own manager of DIR/`folder` removes unfinished saves of a killed run and keeps the
  `max_to_keep` latest steps and the best-evaluated one.  A `read_only` one (for reading, e.g. another
  run's workdir through `init_from`) creates and removes nothing."""
  policies = ocp.checkpoint_managers
  keep = policies.AnyPreservationPolicy([
      policies.LatestN(max_to_keep),
      policies.BestN(get_metric_fn=_best_value, n=1, keep_checkpoints_without_metrics=False)])
  directory = os.path.abspath(os.path.join(workdir, folder))
  try:
    return ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            best_fn=_best_value, best_mode="max", preservation_policy=keep, create=not read_only,
            cleanup_tmp_directories=not read_only))
  except ValueError:  # orbax reads every step's metrics first, and names none that fails
    _check_metrics(directory)
    raise


def _check_metrics(directory: str) -> None:
  """Refuses a step whose saved metrics (its `BEST` value) do not read as JSON, naming its directory
  to move aside.  Never reads it as a step without metrics: the `BestN` policy would then delete it."""
  steps = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
  for step in steps:
    step_dir = os.path.join(directory, str(step))
    path = os.path.join(step_dir, "metrics", "metrics")
    try:
      with open(path) as f:
        json.load(f)
    except FileNotFoundError:  # saved without metrics
      continue
    except ValueError as e:
      others = [s for s in steps if s != step]
      way_out = (f"moving {step_dir} out of the workdir resumes from step {others[-1]}" if others else
                 "give a new workdir")
      raise ValueError(f"checkpoint {step} in {os.path.dirname(directory)} cannot be read: its metrics "
                       f"file {path} is corrupt ({e}); {way_out}") from e


def latest_step(workdir: str) -> int | None:
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    return None
  with manager(workdir, read_only=True) as mngr:
    return mngr.latest_step()


def best_value(mngr: ocp.CheckpointManager) -> float:
  """The best `BEST` value saved with a checkpoint; -inf when none was saved with one."""
  step = mngr.best_step()
  return -math.inf if step is None else _best_value(mngr.metrics(step))


def best_step(workdir: str) -> int | None:
  """The step saved with the best `BEST` value (the latest of equals); None when none has one."""
  with manager(workdir, read_only=True) as mngr:
    return mngr.best_step() if best_value(mngr) > -math.inf else None


def check_entries(workdir: str) -> None:
  """Refuses a checkpoints/ directory holding anything but step directories and unfinished saves
  (another program's files), which this run could neither read nor write over.  A step directory
  that is not a complete checkpoint fails `restore` with its own message."""
  path = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(path):
    return
  with manager(workdir, read_only=True) as mngr:
    steps = {str(s) for s in mngr.all_steps()}
  other = sorted(e for e in os.listdir(path) if e not in steps and _TMP not in e)
  if other:
    raise ValueError(f"{path} holds {other}, which are not checkpoints (files of another program?): "
                     f"move them out of the workdir, or give a new workdir")


def _step(mngr: ocp.CheckpointManager, workdir: str, step: int | None) -> int:
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {os.path.join(workdir, 'checkpoints')}")
  return step


def restore(workdir: str, abstract_state, step: int | None = None):
  """Restores into the structure, shapes and shardings of `abstract_state`; a clear error otherwise."""
  with manager(workdir, read_only=True) as mngr:
    step = _step(mngr, workdir, step)
    try:
      return mngr.restore(step, args=ocp.args.StandardRestore(abstract_state))
    except Exception as e:  # orbax raises several types for missing/corrupt/mismatched files
      earlier = [s for s in mngr.all_steps() if s < step]
      fallback = (f"moving {os.path.join(workdir, 'checkpoints', str(step))} out of the workdir resumes "
                  f"from step {earlier[-1]}" if earlier else "the run starts again in a new workdir")
      cause = _cause(e)
      try:
        saved = saved_shapes(workdir, step)[1]
      except ValueError:  # its metadata unreadable too (`_reading`): the message below says what to do
        saved = {}
      if per_layer_decoder(saved):
        raise ValueError(per_layer_error(f"checkpoint {step} in {workdir}")) from e
      if same_arrays_but_empty_parts(saved, abstract_state):
        return its_arrays(workdir, abstract_state, step)
      raise ValueError(
          f"checkpoint {step} in {workdir} cannot be restored into this config's state ({cause}). If it "
          f"is corrupt, {fallback}. If it was written by a different model / roles / credit config, or "
          f"by a marl_jax older than the credit-estimator state (TrainState.credit, added after commit "
          f"bbf80e3), start a new workdir: --config.init_from={workdir} starts one from its "
          f"parameters.") from e


def _cause(error: Exception) -> str:
  """What failed in an orbax error, whose message can end in whole TensorStore specs."""
  return (str(error).strip().splitlines() or [type(error).__name__])[0].split(" [tensorstore_spec")[0]


def save_warm_start(workdir: str, progress) -> None:
  """Saves a stopped warm start's `sft.Progress` under DIR/warm_start; the one saved before there is
  removed only once this one is complete."""
  step = int(progress.step.addressable_data(0))
  with manager(workdir, max_to_keep=1, folder=WARM_START) as mngr:
    if mngr.latest_step() != step:  # a finished warm start resumed and stopped again: saved already
      save(mngr, step, progress)


def restore_warm_start(workdir: str, abstract_progress, steps: int):
  """The `sft.Progress` a stopped warm start saved under DIR/warm_start, restored into
  `abstract_progress` (shapes and shardings); None when none is saved there.  A save that is corrupt,
  of another config, or past `steps` (config.sft.steps) is refused, naming the directory to move aside."""
  path = os.path.join(workdir, WARM_START)
  if not os.path.exists(path):
    return None
  refused = lambda why: ValueError(
      f"the warm-start progress saved in {path} {why}; moving {path} out of the workdir starts the warm "
      f"start again from step 0")
  try:
    with manager(workdir, read_only=True, folder=WARM_START) as mngr:
      step = mngr.latest_step()
      progress = None if step is None else mngr.restore(step, args=ocp.args.StandardRestore(abstract_progress))
  except Exception as e:  # orbax raises several types for missing/corrupt/mismatched files
    raise refused(f"cannot be restored into this config's warm start ({_cause(e)}): it is corrupt or "
                  f"was not written by this run") from e
  if progress is None:  # only an unfinished save, which the next save removes
    return None
  done = int(progress.step.addressable_data(0))
  if done != step or not 0 <= done <= steps:
    raise refused(f"is at step {done} (saved as step {step}), which config.sft.steps={steps} does "
                  f"not allow: it was not written by this run")
  return progress


def remove_warm_start(workdir: str) -> None:
  """Removes DIR/warm_start once checkpoint 0 holds the finished warm start."""
  shutil.rmtree(os.path.join(workdir, WARM_START), ignore_errors=True)


def same_arrays_but_empty_parts(saved: dict, abstract_state) -> bool:
  """Whether a saved tree holds the arrays (shapes and dtypes) of `abstract_state` but for the base
  model's copy (`ref_params`) that this state does not hold, or but for the payment rule's state
  (`TrainState.reward`, added after commit 9e63ee3) that this state leaves empty."""
  arrays = lambda tree: sorted((tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(tree))
  drops_copy = bool(jax.tree.leaves(saved.get("ref_params"))) and not jax.tree.leaves(abstract_state.ref_params)
  lacks_reward = "reward" not in saved and not jax.tree.leaves(abstract_state.reward)
  rest = {name: part for name, part in saved.items() if not (drops_copy and name == "ref_params")}
  return ((drops_copy or lacks_reward) and vars(abstract_state).keys() - saved.keys() <= {"ref_params", "reward"}
          and arrays(rest) == arrays(abstract_state))


def its_arrays(workdir: str, abstract_state, step: int):
  """A checkpoint of an older marl_jax restored into this one's state (`same_arrays_but_empty_parts`):
  one that kept the base model's copy (`TrainState.ref_params`) at `rl.kl_coef=0` (commit d3c0371 and
  earlier), or lacks a part this state leaves empty; every part that holds arrays, as it was saved."""
  fields = {name: part for name, part in vars(abstract_state).items() if jax.tree.leaves(part)}
  return abstract_state.replace(**restore_part(workdir, fields, step))


def per_layer_decoder(saved) -> bool:
  """Whether a saved tree holds a language model of a marl_jax before the decoder stacked its layers
  (commit 42ba1d4 and earlier): one subtree per layer, `layer0`, `layer1`, ..."""
  return any(re.search(r"(^|/)layer[0-9]+/", jax.tree_util.keystr(path, simple=True, separator="/"))
             for path, _ in jax.tree_util.tree_leaves_with_path(saved))


def per_layer_error(what: str) -> str:
  return (f"{what} was written by a marl_jax whose language-model decoder kept one parameter subtree per "
          f"layer (layer0/q_proj/kernel, layer1/...); this one stacks them on a leading layer axis "
          f"(layers/q_proj/kernel), which compiles once whatever the depth. Resume it, warm-start from it "
          f"or export it (python -m marl_jax.tools.lm_export) with marl_jax at commit 42ba1d4 or earlier")


def saved_shapes(workdir: str, step: int | None = None) -> tuple[int, dict]:
  """(step, the saved tree as nested dicts of `jax.ShapeDtypeStruct`) of `step` (the latest by
  default), whatever state layout wrote it; reads no array."""
  with manager(workdir, read_only=True) as mngr:
    step = _step(mngr, workdir, step)
  with _reading(workdir, step):
    saved = ocp.StandardCheckpointHandler().metadata(
        epath.Path(os.path.abspath(workdir)) / "checkpoints" / str(step) / "default")
    return step, jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), getattr(saved, "tree", saved))


def restore_part(workdir: str, abstract_part: dict, step: int):
  """The arrays of `abstract_part`, a part of the saved tree (e.g. `{"params": ...}`, shapes with the
  shardings to place them by); the rest of the checkpoint is not read: how `init_from` takes
  parameters from any run without holding its optimiser state, or a whole split model on every
  device."""
  with manager(workdir, read_only=True) as mngr, _reading(workdir, step):
    return mngr.restore(step, args=ocp.args.PyTreeRestore(
        abstract_part, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_part),
        partial_restore=True))


@contextlib.contextmanager
def _reading(workdir: str, step: int):
  try:
    yield
  except Exception as e:  # orbax raises several types for missing/corrupt files
    raise ValueError(f"checkpoint {step} in {workdir} cannot be read (corrupt or not a marl_jax "
                     f"checkpoint): {e}") from e


@jax.jit
def _finite(leaves):
  return [jnp.isfinite(x).all() for x in leaves]


def save(mngr: ocp.CheckpointManager, step: int, state, metrics: dict | None = None) -> None:
  """Saves `state` with `metrics` (JSON values such as `BEST`; `mngr.metrics(step)` reads them back).
  Refuses a state holding a non-finite value: the last guard behind the step's (`train.nonfinite`)."""
  leaves = [(path, x) for path, x in jax.tree_util.tree_leaves_with_path(state)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  bad = [jax.tree_util.keystr(path) for (path, _), ok in zip(leaves, _finite([x for _, x in leaves]))
         if not ok]
  if bad:
    raise FloatingPointError(f"checkpoint {step} not written: non-finite values in {', '.join(bad)}")
  mngr.save(step, args=ocp.args.StandardSave(state), metrics=metrics or {})
