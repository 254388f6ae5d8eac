"""Warm start: supervised training on protocol demonstrations (every role's messages), producing the
"base model" that RL starts from.  Demonstrations are noisy on purpose (`task.demo_error_rate`, and the
protocol's own knobs), so the base team starts weak but not random.  The optimiser is
`experiment.make_optimizer` over `config.optim` with `config.sft`'s keys replacing its own.

With `config.sft.transcripts` (a transcript archive, `marl_jax.tools.archive`) the warm start distils another
team instead: each seed's batches are drawn from that team's seed's transcripts, and each role learns
its own role's messages (every role-authored token goes to its role's parameter set), from the
transcripts `config.sft.filter` keeps: `right` (the checker scored the team's answer right), `all`,
or `credit` (each role's tokens weighted by its positive difference credit); with
`config.sft.archive_share` below 1 each row comes from the archive with that probability and is
otherwise a demonstration (a replay of an earlier task's transcripts while learning a new one).  Generations
(`marl_jax.tools.generations`) warm-start this way; `transcripts.distillation_set` reads the archive, before
anything compiles.

The steps run `config.sft.steps_per_call` at a time, one compiled call after another with the
`Progress` carried between them, so that a run can stop between two calls (a signal) and save its
progress, which a rerun resumes (`marl_jax.loop`)."""
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from marl_jax import experiment
from marl_jax import model as model_lib
from marl_jax import checks, memory, newcomers, parallel, sampling, text

FILTERS = ("right", "all", "credit")  # config.sft.filter: which archived transcripts a warm start distils


@flax.struct.dataclass
class Progress:
  """A warm start so far, for every seed: what a stopped run saves and a rerun resumes."""
  step: jax.Array  # steps done, the same for every seed
  params: Any  # params_S
  opt_state: Any  # the warm-start optimiser's state of each seed; its step count drives the schedule


@flax.struct.dataclass
class Archived:
  """A team's archived transcripts to distil, per seed of the run: canvases and how much each role's
  tokens in each weigh (`config.sft.filter`)."""
  tokens_SxNxT: jax.Array
  weight_SxNxR: jax.Array


def check_filter(config) -> None:
  """Refuses an unknown `config.sft.filter` and an `archive_share` outside (0, 1]."""
  if config.sft.filter not in FILTERS:
    raise ValueError(f"config.sft.filter={config.sft.filter!r} is unknown; allowed: {list(FILTERS)}")
  checks.check("sft.archive_share", config.sft.archive_share, lambda v: 0 < v <= 1, "a number in (0, 1]")


def token_weights(exp, tokens_BxT, weight_BxR=None):
  """weight_BxT: 1 on every role-authored, non-padding token (with `weight_BxR`, its row's weight for
  its author), 0 elsewhere."""
  author_T = exp.layout.author_T
  weight_BxT = (author_T[None] >= 0) & (tokens_BxT != text.PAD)
  return weight_BxT if weight_BxR is None else weight_BxT * weight_BxR[:, np.maximum(author_T, 0)]


def _weighted_nll(exp, params_R, tokens_BxT, weight_BxT, total_weight):
  logp_BxT, _ = sampling.token_log_probs(exp.model, exp.layout, params_R, tokens_BxT, 1.0)
  return -jnp.sum(logp_BxT * weight_BxT) / total_weight


def demonstration_loss(exp, params_R, tokens_BxT, weight_BxR=None):
  """Mean cross-entropy over every role-authored, non-padding token; with `weight_BxR`, each token
  weighs its row's weight for its author."""
  weight_BxT = token_weights(exp, tokens_BxT, weight_BxR)
  return _weighted_nll(exp, params_R, tokens_BxT, weight_BxT, jnp.maximum(weight_BxT.sum(), 1e-6))


def demonstration_gradient(exp, params_R, tokens_BxT, weight_BxR=None):
  """(loss, grads) of `demonstration_loss`, `config.sft.microbatch_size` rows per forward and backward
  pass: each part's weighted sum over the whole batch's weight, added (the same gradient up to float
  rounding, with one part's activations in memory at once)."""
  weight_BxT = token_weights(exp, tokens_BxT, weight_BxR)
  total_weight = jnp.maximum(weight_BxT.sum(), 1e-6)
  part = lambda tokens, weight: jax.value_and_grad(_weighted_nll, argnums=1)(exp, params_R, tokens, weight,
                                                                              total_weight)
  return parallel.summed_over_row_chunks(part, exp.config.sft.microbatch_size, tokens_BxT, weight_BxT)


def _programs(exp, keys_S, archived: Archived | None = None) -> tuple[Callable, Callable]:
  """(begin, chunk), compiled at their first calls: `begin(keys_S, pretrained_R, joined_S)` the Progress
  at step 0 (random parameters, the model's pretrained ones, or a team the newcomers joined), and
  `chunk(progress, keys_S, archived)` (progress donated; `archived` as given here, or None) the next
  `config.sft.steps_per_call` steps with each step's demonstration loss, loss_SxC.  Steps past
  `config.sft.steps` are skipped (a loss of 0), so that one program serves every call."""
  cfg = exp.config.sft
  tx = experiment.make_optimizer(experiment.sft_optim(exp.config), cfg.steps, "sft")
  if newcomers.distilled(exp.config):  # the newcomers learn, the rest of the team stays as it was
    tx = model_lib.per_set(exp.model, tx, np.isin(np.arange(exp.num_sets), newcomers.replaced_sets(exp)))
  else:
    tx = model_lib.trainable(exp.model, tx)
  C = min(cfg.steps_per_call, cfg.steps)
  # A seed's keys: its initial parameters', and the one its step keys are split from (as many as
  # config.sft.steps, whatever the calls: a chunked warm start is the same as one scan).
  init_and_data_keys = lambda key: jax.random.split(jax.random.fold_in(key, 7))

  def archived_rows(key, archived):
    """Rows drawn as often as their roles weigh together; within a row, each role as it weighs."""
    weight_NxR = archived.weight_SxNxR
    row_B = jax.random.categorical(key, jnp.log(weight_NxR.sum(-1)), shape=(cfg.batch_size,))
    weight_BxR = weight_NxR[row_B]
    return archived.tokens_SxNxT[row_B], weight_BxR / jnp.mean(weight_BxR, -1, keepdims=True)

  def demonstrated_rows(key):
    k_problem, k_demo = jax.random.split(key)
    problems = exp.task.sample_batch(jax.random.split(k_problem, cfg.batch_size))
    return exp.protocol.demonstrate(exp.task, exp.layout, problems, jax.random.split(k_demo, cfg.batch_size))

  def demonstrations(key, archived):
    """A batch of transcripts (tokens_BxT) and each role's weight in each (weight_BxR, None: 1)."""
    if archived is None:
      return demonstrated_rows(key), None
    if cfg.archive_share == 1:
      return archived_rows(key, archived)
    # A replay: each row from the archive with probability archive_share, else a demonstration.
    k_mix, k_archive, k_demo = jax.random.split(key, 3)
    tokens_BxT, weight_BxR = archived_rows(k_archive, archived)
    from_archive_B = jax.random.bernoulli(k_mix, cfg.archive_share, (cfg.batch_size,))
    return (jnp.where(from_archive_B[:, None], tokens_BxT, demonstrated_rows(k_demo)),
            jnp.where(from_archive_B[:, None], weight_BxR, 1.0))

  def begin_seed(key, pretrained_R, joined_R):
    params = (joined_R if joined_R is not None else pretrained_R if pretrained_R is not None else
              model_lib.init_stack(exp.model, init_and_data_keys(key)[0], exp.num_sets))
    return params, tx.init(params)

  def chunk_seed(key, params, opt_state, archived, first):
    keys_N = jax.random.split(init_and_data_keys(key)[1], cfg.steps)

    def sgd_step(carry, step):
      def update(carry):
        params, opt_state = carry
        loss, grads = demonstration_gradient(exp, params, *demonstrations(keys_N[jnp.minimum(step, cfg.steps - 1)],
                                                                           archived))
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss.astype(jnp.float32)
      # The step is the same for every seed, so this stays a branch under vmap: a skipped step costs nothing.
      return jax.lax.cond(step < cfg.steps, update, lambda carry: (carry, jnp.float32(0)), carry)

    (params, opt_state), loss_C = jax.lax.scan(sgd_step, (params, opt_state), first + jnp.arange(C))
    return params, opt_state, loss_C

  def begin(keys_S, pretrained_R, joined_S):
    params_S, opt_state_S = parallel.over_seeds(lambda key, joined: begin_seed(key, pretrained_R, joined),
                                                exp.config.seeds_at_once)(keys_S, joined_S)
    return Progress(step=jnp.zeros((), jnp.int32), params=params_S, opt_state=opt_state_S)

  def chunk(progress, keys_S, archived):
    params_S, opt_state_S, loss_SxC = parallel.over_seeds(
        lambda key, params, opt_state, archived: chunk_seed(key, params, opt_state, archived, progress.step),
        exp.config.seeds_at_once)(keys_S, progress.params, progress.opt_state, archived)
    return Progress(jnp.minimum(progress.step + C, cfg.steps), params_S, opt_state_S), loss_SxC

  if not exp.splits_parameters:
    return jax.jit(begin), jax.jit(chunk, donate_argnums=0)
  # On a mesh with a `model` axis the progress is split as the run's parameters are, so that the warm
  # start runs split too (random initial weights included: they are made where they will live).
  progress = jax.eval_shape(begin, keys_S, None, None)
  chunk_out = jax.eval_shape(chunk, progress, keys_S, archived)
  return (jax.jit(begin, out_shardings=exp.shardings(progress)),
          jax.jit(chunk, donate_argnums=0, out_shardings=exp.shardings(chunk_out)))


def abstract_progress(exp, keys_S) -> Progress:
  """Shapes, dtypes and shardings of the Progress of the seeds of `keys_S`, for restoring a saved one."""
  begin, _ = _programs(exp, keys_S)
  return exp.abstract(jax.eval_shape(begin, keys_S, None, None))


def _fitting(chunk, progress: Progress, keys_S, archived, cfg):
  """`chunk` compiled for these arguments, or memory.DoesNotFit naming the keys that shrink it where a
  call needs more than the device allows (a language model's warm start can need several times its
  train call: every row of the batch in one pass, by default)."""
  compiled = chunk.lower(progress, keys_S, archived).compile()
  rows = parallel.rows_per_pass(cfg.microbatch_size, cfg.batch_size)
  memory.check({"warm start": (memory.need(compiled, memory.per_device_bytes(progress)),
                               f"config.sft.microbatch_size={cfg.microbatch_size} (a step passes {rows} rows "
                               f"at a time through the model) or config.sft.batch_size={cfg.batch_size}")},
               memory.device_limit())
  return compiled


def run(exp, keys_S, progress: Progress | None = None, stop: Callable[[], bool] = lambda: False,
        archived: Archived | None = None, joined=None) -> Progress:
  """The warm start of the seeds of `keys_S` from `progress` (None: from step 0), one call after
  another until `config.sft.steps` or until `stop()` (asked after each call, so that a stopped warm
  start has something to keep) is true, with a progress bar; returns where it ended.  It distils
  `archived` (`config.sft.transcripts` as `transcripts.distillation_set` reads it), or without one the
  workflow's demonstrations; into the newcomers of `joined` (params_S of a team they joined, with
  `config.newcomers.distil`: only their sets learn), or else into fresh or pretrained parameters."""
  cfg = exp.config.sft
  if cfg.transcripts and archived is None:
    raise ValueError(f"config.sft.transcripts={cfg.transcripts!r} is distilled by a run (marl_jax.loop, which "
                     "reads it); this warm start was given no archive")
  begin, chunk = _programs(exp, keys_S, archived)
  if progress is None:
    # A checkpoint's parameters enter as an argument (shared by the seeds), not as constants of the
    # program, placed as the run's are.
    pretrained_R = model_lib.pretrained_stack(exp.model, exp.num_sets)
    if pretrained_R is not None and exp.splits_parameters:
      pretrained_R = jax.device_put(pretrained_R, exp.shardings(pretrained_R))
    progress = begin(keys_S, pretrained_R, joined if newcomers.distilled(exp.config) else None)
  first = step = int(progress.step.addressable_data(0))
  if step < cfg.steps:
    chunk = _fitting(chunk, progress, keys_S, archived, cfg)
  if first:
    print(f"warm start: resuming at step {first} of {cfg.steps}")
  loss_SxN = [np.zeros((len(keys_S), 0), np.float32)]
  with tqdm.tqdm(total=cfg.steps, initial=first, desc="warm start", dynamic_ncols=True,
                 disable=jax.process_index() != 0) as bar:
    while step < cfg.steps:
      progress, loss_SxC = chunk(progress, keys_S, archived)
      done = min(cfg.steps - step, loss_SxC.shape[-1])  # the steps this call ran (the last may skip some)
      loss_SxN.append(np.asarray(loss_SxC.addressable_data(0))[:, :done])
      step += done
      bar.set_postfix(loss=f"{loss_SxN[-1][:, -1].mean():.3f}", refresh=False)
      bar.update(done)
      if stop():
        break
  if step == cfg.steps and step > first:
    print(f"warm start: {cfg.steps} steps, final demonstration loss per seed "
          f"{np.round(np.concatenate(loss_SxN, 1)[:, -10:].mean(1), 3).tolist()}")
  return progress


def warm_start(exp, keys_S):
  """params_S: `config.sft.steps` steps on fresh demonstrations, one model per seed, from random
  parameters or from the model's pretrained ones (a checkpoint)."""
  return run(exp, keys_S).params
