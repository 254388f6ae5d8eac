"""The host loop: check the config and workdir, initialise or resume (a stopped warm start too), run
compiled calls, evaluate, log, checkpoint (the latest and the best); stop cleanly on SIGTERM / SIGINT,
and skip or stop at a non-finite update."""
import contextlib
import functools
import math
import os
import signal
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from marl_jax import checkpoint, evaluate, experiment, files, memory, metrics as metrics_lib, parallel, sft, state
from marl_jax import newcomers, transcripts
from marl_jax import train
from marl_jax import model as model_lib
from marl_jax import workdir as workdir_lib


class NonFiniteError(FloatingPointError):
  """A non-finite reward, advantage, loss, gradient or updated state under
  `config.rl.on_nonfinite='stop'`, or a warm start that left non-finite parameters."""


def load_params(exp: experiment.Experiment, init_from: str, step: int | None = None, flag: str = ""):
  """params_S from a checkpoint of another run, e.g. a warm start: `DIR` (its latest checkpoint, or
  `step`) or `DIR:best` (its best-evaluated one).  The run may have used any credit estimator or
  optimiser; its parameters must fit `config.model` and the number of parameter sets, and hold 1
  seed or `config.num_seeds`.  Errors name `flag` (a command's own, such as `--workdir=DIR`), or
  `config.init_from`."""
  workdir = init_from.removesuffix(":best")
  flag = flag or f"config.init_from={init_from!r}"
  if not os.path.exists(os.path.join(workdir, "config.json")) or checkpoint.latest_step(workdir) is None:
    raise FileNotFoundError(f"{flag} holds no config.json and checkpoint")
  if workdir != init_from:
    step = checkpoint.best_step(workdir)
    if step is None:
      raise FileNotFoundError(f"{flag}: no checkpoint there was saved with its "
                              f"evaluation accuracy (it was written before best-checkpoint tracking)")
  step, saved = checkpoint.saved_shapes(workdir, step)
  params_S = saved.get("params") if isinstance(saved, dict) else None
  if checkpoint.per_layer_decoder(params_S):
    raise ValueError(checkpoint.per_layer_error(flag))
  expected = jax.eval_shape(lambda: model_lib.init_stack(exp.model, jax.random.PRNGKey(0), exp.num_sets))
  shapes = lambda tree, drop: jax.tree.map(lambda p: tuple(p.shape[drop:]), tree)
  if params_S is None or shapes(expected, 0) != shapes(params_S, 1):
    raise ValueError(f"{flag} holds a model whose shapes or parameter sets "
                     f"differ from config.model / config.roles")
  S = jax.tree.leaves(params_S)[0].shape[0]
  if S not in (1, exp.config.num_seeds):
    raise ValueError(f"{flag} holds {S} seeds; config.num_seeds="
                     f"{exp.config.num_seeds} needs 1 or the same number")
  # Only the parameters are read, each placed as this run places its own (split over `model` when
  # config.model_shards > 1).
  params_S = checkpoint.restore_part(workdir, exp.abstract({"params": params_S}), step)["params"]
  return jax.tree.map(lambda p: jnp.broadcast_to(p, (exp.config.num_seeds,) + p.shape[1:]), params_S)


def initial_state(exp: experiment.Experiment, params_S=None) -> state.TrainState:
  """State for all seeds: `params_S` (e.g. from `init_from`, or a warm start the loop ran), else an
  inline warm start, else the model's pretrained parameters, else random ones."""
  config = exp.config
  keys_S = state.seed_keys(config)
  if params_S is None and config.sft.steps > 0:
    params_S = sft.warm_start(exp, keys_S)
  if params_S is None:  # no warm start: a checkpoint's parameters for every seed, or random ones
    pretrained_R = model_lib.pretrained_stack(exp.model, exp.num_sets)
    if pretrained_R is not None:
      params_S = jax.tree.map(lambda p: np.broadcast_to(p, (config.num_seeds,) + p.shape), pretrained_R)
  init = jax.vmap(functools.partial(state.init_state, exp))
  if not exp.splits_parameters:
    return state.place(exp, jax.jit(init)(keys_S, params_S))
  # Split parameters: the state is computed where it lives, each device its share (a whole state on
  # one device would not fit there, for the models the split exists for).
  keys_S, params_S = state.place(exp, (keys_S, params_S))
  return jax.jit(init, out_shardings=exp.shardings(jax.eval_shape(init, keys_S, params_S)))(keys_S, params_S)


def summarize(metrics_SxN) -> dict:
  """Mean over the steps of a call, kept per seed: {name: values_S}.  Diagnostics measured on some
  steps only, or over a subset some steps lack (NaN on the others), average over the steps that have
  them."""
  with warnings.catch_warnings():  # a diagnostic that no step of the call defined stays NaN, silently
    warnings.simplefilter("ignore", RuntimeWarning)
    return {k: np.nanmean(np.asarray(v), -1) for k, v in metrics_SxN.items()}


def _setup(config: ml_collections.ConfigDict, workdir: str):
  """Everything that can refuse the run, before anything is compiled or written: the config, the
  workdir, its latest checkpoint (restored), the warm start `init_from` or a stopped warm start's
  progress (for a new run) and the evaluation set.  Returns (exp, start, state_S, init_params_S,
  progress, the archived transcripts it distils, eval_problems) with start None for a new run; raises
  ConfigError."""
  try:
    exp = experiment.build(config)
    workdir_lib.check(config, workdir)
    checkpoint.check_entries(workdir)
    start = checkpoint.latest_step(workdir)
    if start is not None and start > config.total_steps:  # it would rewrite config.json and stop
      raise ValueError(f"config.total_steps={config.total_steps} is below step {start}, the latest checkpoint "
                       f"in {workdir}; allowed: >= {start} (a run does not go back: a new workdir with "
                       f"--config.init_from={workdir} starts from its parameters)")
    if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
      metrics_lib.read(workdir)  # a corrupt row refuses the run before config.json is rewritten
    # The calls step from `start` by steps_per_call: off its multiples they would pass total_steps and
    # every log, evaluation and checkpoint step, and end without saving.
    if start is not None and start < config.total_steps and start % config.steps_per_call:
      raise ValueError(
          f"config.steps_per_call={config.steps_per_call} does not divide step {start}, the latest "
          f"checkpoint in {workdir} that this run resumes from, so its calls would never reach "
          f"config.total_steps={config.total_steps}; allowed: the divisors of "
          f"{math.gcd(start, config.total_steps)} (they divide both step {start} and the "
          f"{config.total_steps - start} steps left)")
    state_S = None if start is None else checkpoint.restore(workdir, state.abstract_state(exp))
    replaced = newcomers.replaced_sets(exp)  # before the team is read: newcomers it cannot place are refused
    init_params_S = load_params(exp, config.init_from) if config.init_from and start is None else None
    if replaced and init_params_S is not None:
      source = config.newcomers.source
      newcomers_S = (newcomers.fresh_params(exp, state.seed_keys(config)) if source == newcomers.FRESH else
                     load_params(exp, source, flag=f"config.newcomers.source={source!r}"))
      init_params_S = newcomers.join(exp, init_params_S, newcomers_S)
    warm_starts = start is None and _warm_starts(config, init_params_S)
    progress = (checkpoint.restore_warm_start(workdir, sft.abstract_progress(exp, state.seed_keys(config)),
                                              config.sft.steps) if warm_starts else None)
    archived = transcripts.distillation_set(exp) if warm_starts else None
    eval_problems = evaluate.eval_problems(exp, config.eval.data_dir)
  except (ValueError, OSError) as e:
    raise experiment.ConfigError(str(e)) from e
  return exp, start, state_S, init_params_S, progress, archived, eval_problems


def _warm_starts(config, init_params_S) -> bool:
  """Whether a new run warm-starts: without starting parameters (`init_from`), or to distil the
  newcomers who joined them (`config.newcomers.distil`)."""
  return bool(config.sft.steps) and (init_params_S is None or newcomers.distilled(config))


@contextlib.contextmanager
def stop_on_signals():
  """Yields an Event that SIGTERM (preemption) or SIGINT (Ctrl-C) sets, read by the host loop between
  compiled calls; a second signal gets the handler there was before (Ctrl-C twice: stop at once)."""
  requested = threading.Event()
  if threading.current_thread() is not threading.main_thread():  # only the main thread has handlers
    yield requested
    return
  previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

  def restore():
    for s, handler in previous.items():
      signal.signal(s, signal.SIG_DFL if handler is None else handler)

  def handler(signum, frame):
    if requested.is_set():
      restore()
      signal.raise_signal(signum)
      return
    requested.set()
    os.write(2, f"\n{signal.Signals(signum).name}: finishing the current call, then writing a "
                f"checkpoint (send it again to stop at once)\n".encode())

  for s in previous:
    signal.signal(s, handler)
  try:
    yield requested
  finally:
    restore()


def _agree_on_start(workdir: str, start: int | None) -> None:
  """A barrier after every process has read the workdir and before any writes to it.  Without it a
  process that reads it after the lead created checkpoints/ takes another path through orbax's
  collective calls (a read of the empty directory) and the processes deadlock or fail on mismatched
  barrier names.  Processes that still see different latest checkpoints do not share the workdir."""
  if jax.process_count() == 1:
    return
  starts = multihost_utils.process_allgather(np.int64(-1 if start is None else start))
  if len(set(starts.tolist())) > 1:
    raise experiment.ConfigError(f"the processes found different latest checkpoints in {workdir}: "
                                 f"{starts.tolist()} (-1: none); is it on a filesystem they all share?")


def _stop_agreed(requested: threading.Event) -> bool:
  """Whether any process was signalled: all stop after the same call, as saving is collective."""
  if jax.process_count() == 1:
    return requested.is_set()
  return bool(multihost_utils.process_allgather(np.int32(requested.is_set())).any())


def _skipped_updates(exp: experiment.Experiment, nonfinite_SxNxQxR, first_step: int) -> np.ndarray:
  """skipped_S: the updates of a call that the step skipped (a non-finite quantity).  The first one
  names its step, seed, quantity and roles: with `config.rl.on_nonfinite='stop'` it ends the run
  (NonFiniteError), else a warning."""
  skipped_SxN = nonfinite_SxNxQxR.any((2, 3))
  if skipped_SxN.any():
    n, s = np.argwhere(skipped_SxN.T)[0]  # the earliest step, then the lowest seed
    q = int(np.argmax(nonfinite_SxNxQxR[s, n].any(1)))  # the first quantity the step computes
    roles = ", ".join(exp.layout.roles[r] for r in np.flatnonzero(nonfinite_SxNxQxR[s, n, q]))
    message = (f"non-finite {train.NONFINITE[q]} at step {first_step + n + 1} (seed {s}, role {roles}): "
               f"the update was skipped")
    if exp.config.rl.on_nonfinite == "stop":
      raise NonFiniteError(f"{message}; config.rl.on_nonfinite='stop' ends the run (its checkpoints hold "
                           f"finite values only; 'skip' skips such updates and goes on)")
    logging.warning("%s (%d updates skipped in this call)", message, skipped_SxN.sum())
  return skipped_SxN.sum(1)


def _check_start(config: ml_collections.ConfigDict, params_S) -> None:
  """A new run's parameters are finite before anything evaluates or saves them: a warm start that
  diverged has no update to skip, so it ends the run whatever `config.rl.on_nonfinite`."""
  if not state.to_host(jax.jit(train.all_finite)(params_S)):
    raise NonFiniteError(f"non-finite parameters before the first update (after config.sft.steps="
                         f"{config.sft.steps} warm-start steps at config.sft.learning_rate="
                         f"{config.sft.learning_rate}): nothing saved; a lower config.sft.learning_rate "
                         f"keeps the warm start finite")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> None:
  if config.distributed:
    parallel.initialize_distributed()
  exp, start, state_S, init_params_S, progress, archived, eval_problems = _setup(config, workdir)
  train_call = train.make_train_call(exp)
  evaluate_set = evaluate.make_evaluate(exp, eval_problems)
  try:  # before the warm start: a run that cannot fit is refused now, not after it
    memory.check_run(exp, state.abstract_state(exp), train_call, evaluate_set)
  except memory.DoesNotFit as e:
    raise experiment.ConfigError(str(e)) from e
  _agree_on_start(workdir, start)
  lead = jax.process_index() == 0
  if lead:
    try:
      os.makedirs(workdir, exist_ok=True)
      files.write_atomically(os.path.join(workdir, "config.json"), config.to_json(indent=2))
    except OSError as e:  # what os.access did not foresee (a file system that refuses new entries)
      raise experiment.ConfigError(f"--workdir={workdir} cannot be written: {e}; give a directory this "
                                   "run can write") from e
  mngr = checkpoint.manager(workdir)  # removes the unfinished save of a killed run
  # Carried over from the checkpoint resumed: skipped updates so far, and the best evaluation.
  saved = {} if start is None else mngr.metrics(start) or {}
  skipped_S = np.asarray(saved.get("skipped_updates", [0] * config.num_seeds), np.int64)
  peak = checkpoint.best_value(mngr)
  writer = metrics_lib.Writer(workdir, config.total_steps, start, enabled=lead)

  def evaluation(step, state_S) -> tuple[dict, float]:
    """Greedy evaluation scalars (the role-collapse diagnostic at the steps `evaluate.diagnosed` names)
    with the drop of their mean accuracy from the best so far (the best checkpoint's), and that mean
    accuracy."""
    nonlocal peak
    metrics_S = evaluate_set(state_S.params, divergence=evaluate.diagnosed(config, step))
    scalars = {f"eval_{k}": v for k, v in state.to_host(metrics_S).items()}
    accuracy = float(np.mean(scalars["eval_accuracy"]))
    peak = max(peak, accuracy)  # a NaN accuracy leaves the peak as it was
    return {**scalars, "eval_drop_from_peak": np.asarray(peak - accuracy)}, accuracy

  def log(step, scalars_S):
    row = {}
    for name, values_S in scalars_S.items():
      row.update(metrics_lib.per_seed(name, values_S))
    writer.write(step, row)

  def save(step, state_S, accuracy=None):
    values = {"skipped_updates": skipped_S.tolist()}
    if accuracy is not None and math.isfinite(accuracy):
      values[checkpoint.BEST] = accuracy
    checkpoint.save(mngr, step, state_S, values)

  def stopped(step):
    logging.warning("stopped at step %d by a signal, checkpoint %d written; run again with the same "
                    "--workdir=%s to resume", step, step, workdir)

  with stop_on_signals() as requested:
    try:
      if start is None:
        start = 0
        if _warm_starts(config, init_params_S):
          try:
            progress = sft.run(exp, state.seed_keys(config), progress, stop=lambda: _stop_agreed(requested),
                               archived=archived, joined=init_params_S)
          except memory.DoesNotFit as e:
            raise experiment.ConfigError(str(e)) from e
          if _stop_agreed(requested):  # what it did is kept, for a rerun to resume
            _check_start(config, progress.params)
            checkpoint.save_warm_start(workdir, progress)
            logging.warning("stopped the warm start at step %d of %d by a signal, its progress written to "
                            "%s; run again with the same --workdir=%s to resume it",
                            int(progress.step.addressable_data(0)), config.sft.steps,
                            os.path.join(workdir, checkpoint.WARM_START), workdir)
            return
          init_params_S = progress.params
        state_S = initial_state(exp, init_params_S)
        _check_start(config, state_S.params)
        sampled = state.to_host(evaluate_set(state_S.params, greedy=False))  # only its accuracy is kept
        evals, accuracy = evaluation(0, state_S)
        log(0, {"accuracy": sampled["accuracy"], **evals, "skipped_updates": skipped_S, **memory.peak_scalars()})
        save(0, state_S, accuracy)  # the base model, reusable through config.init_from
        mngr.wait_until_finished()  # checkpoint 0 holds the warm start: a stopped one's progress can go
        if lead:
          checkpoint.remove_warm_start(workdir)
      if _stop_agreed(requested):  # signalled before training (during the evaluations of step 0, say)
        stopped(start)
        return

      tokens, train_seconds = 0.0, 0.0
      for step in range(start + config.steps_per_call, config.total_steps + 1, config.steps_per_call):
        clock = time.perf_counter()
        # The last step is evaluated too, so that the report's final accuracy is the saved model's.
        evaluating = step % config.eval_every == 0 or step == config.total_steps
        logging_step = step % config.log_every == 0 or evaluating
        # Only a call whose metrics are logged pays for the costly diagnostics.
        state_S, metrics_SxN = train_call(state_S, logging_step)
        jax.block_until_ready(state_S)  # never queue many collective-heavy calls on the CPU backend
        metrics_SxN = state.to_host(metrics_SxN)
        skipped_S += _skipped_updates(exp, metrics_SxN.pop("nonfinite_QxR"), step - config.steps_per_call)
        summary = summarize(metrics_SxN)
        # Throughput counts the compiled calls' time only, from the second call on (the first compiles).
        if step > start + config.steps_per_call:
          train_seconds += time.perf_counter() - clock
          tokens += float(summary["tokens"].sum()) * config.steps_per_call
        writer.advance(step)
        accuracy, best = None, False
        if logging_step:
          row = {**summary, "skipped_updates": skipped_S, **memory.peak_scalars()}
          if train_seconds > 0:
            row["tokens_per_s"] = np.asarray(tokens / train_seconds)
          if evaluating:
            before = peak
            evals, accuracy = evaluation(step, state_S)
            best = accuracy > before
            row.update(evals)
          log(step, row)
        stopping = _stop_agreed(requested)
        if step % config.checkpoint_every == 0 or step == config.total_steps or best or stopping:
          save(step, state_S, accuracy)
        if stopping:
          stopped(step)
          return
    finally:
      mngr.wait_until_finished()
      writer.close()
