"""The host loop: initialise or resume, run compiled calls, evaluate, log, checkpoint."""
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from marl_jax import checkpoint, evaluate, experiment, metrics as metrics_lib, parallel, state, train
from marl_jax import model as model_lib


def load_params(exp: experiment.Experiment, workdir: str, step: int | None = None):
  """params_S from a checkpoint (the latest by default) of another run, e.g. a warm start.  The run
  may have used any credit estimator or optimiser; its parameters must fit `config.model` and the
  number of parameter sets, and hold 1 seed or `config.num_seeds`."""
  if not os.path.exists(os.path.join(workdir, "config.json")) or checkpoint.latest_step(workdir) is None:
    raise FileNotFoundError(f"config.init_from={workdir!r} holds no config.json and checkpoint")
  saved = checkpoint.restore_as_saved(workdir, NamedSharding(exp.mesh, P()), step)
  params_S = saved.get("params") if isinstance(saved, dict) else None
  expected = jax.eval_shape(lambda: model_lib.init_stack(exp.model, jax.random.PRNGKey(0), exp.num_sets))
  shapes = lambda tree, drop: jax.tree.map(lambda p: tuple(p.shape[drop:]), tree)
  if params_S is None or shapes(expected, 0) != shapes(params_S, 1):
    raise ValueError(f"config.init_from={workdir!r} holds a model whose shapes or parameter sets "
                     f"differ from config.model / config.roles")
  S = jax.tree.leaves(params_S)[0].shape[0]
  if S not in (1, exp.config.num_seeds):
    raise ValueError(f"config.init_from={workdir!r} holds {S} seeds; config.num_seeds="
                     f"{exp.config.num_seeds} needs 1 or the same number")
  return jax.tree.map(lambda p: jnp.broadcast_to(p, (exp.config.num_seeds,) + p.shape[1:]), params_S)


def summarize(metrics_SxN) -> dict:
  """Mean over the steps of a call, kept per seed: {name: values_S}.  Diagnostics measured on some
  steps only (NaN on the others) average over the steps that have them."""
  return {k: np.nanmean(np.asarray(v), -1) for k, v in metrics_SxN.items()}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> None:
  if config.distributed:
    parallel.initialize_distributed()
  exp = experiment.build(config)  # every config error surfaces here, before the workdir is touched
  # A bad warm-start directory fails here too, before anything is written.
  init_params_S = load_params(exp, config.init_from) if config.init_from else None
  lead = jax.process_index() == 0
  if lead:
    os.makedirs(workdir, exist_ok=True)
  mngr = checkpoint.manager(workdir)
  start = mngr.latest_step()
  if start is None:
    state_S = state.initial_state(exp, init_params_S)
  else:
    state_S = checkpoint.restore(workdir, state.abstract_state(exp))
  if lead:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json(indent=2))
  writer = metrics_lib.Writer(workdir, config.total_steps, start or 0, enabled=lead)
  evaluate_greedy = evaluate.make_evaluate(exp)

  def eval_scalars(state_S):
    return {f"eval_{k}": v for k, v in state.to_host(evaluate_greedy(state_S.params)).items()}

  def log(step, scalars_S):
    row = {}
    for name, values_S in scalars_S.items():
      row.update(metrics_lib.per_seed(name, values_S))
    writer.write(step, row)

  if start is None:
    start = 0
    sampled = state.to_host(evaluate.make_evaluate(exp, greedy=False)(state_S.params))
    log(0, {"accuracy": sampled["accuracy"], **eval_scalars(state_S)})
    checkpoint.save(mngr, 0, state_S)  # the base model, reusable through config.init_from

  train_call = train.make_train_call(exp)
  tokens, train_seconds = 0.0, 0.0
  for step in range(start + config.steps_per_call, config.total_steps + 1, config.steps_per_call):
    clock = time.perf_counter()
    state_S, metrics_SxN = train_call(state_S)
    jax.block_until_ready(state_S)  # never queue many collective-heavy calls on the CPU backend
    summary = summarize(state.to_host(metrics_SxN))
    # Throughput counts the compiled calls' time only, from the second call on (the first compiles).
    if step > start + config.steps_per_call:
      train_seconds += time.perf_counter() - clock
      tokens += float(summary["tokens"].sum()) * config.steps_per_call
    writer.advance(step)
    if step % config.log_every == 0 or step % config.eval_every == 0:
      row = dict(summary)
      if train_seconds > 0:
        row["tokens_per_s"] = np.asarray(tokens / train_seconds)
      if step % config.eval_every == 0:
        row.update(eval_scalars(state_S))
      log(step, row)
    if step % config.checkpoint_every == 0 or step == config.total_steps:
      checkpoint.save(mngr, step, state_S)
  mngr.wait_until_finished()
  writer.close()
