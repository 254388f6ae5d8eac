"""Evaluation on the fixed evaluation set, sharded over the `data` axis like training: each device
samples its rows, and the protocol's metrics (with the judges', for a run rewarded by them, and those
of the protocol's `ablation`, if any) are computed on the gathered set; at some evaluations (`config.eval.divergence_every`) the role-collapse diagnostic
too."""
import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from marl_jax import datasets, parallel, rewards, rollout, sampling, tasks
from marl_jax.experiment import Experiment


def eval_problems(exp: Experiment, data_dir: str) -> dict:
  """The fixed evaluation set (`config.eval`): the versioned TFDS set in `data_dir` when one is given
  (read when it exists, built when it does not), else the same problems drawn in memory."""
  cfg = exp.config.eval
  if not data_dir:
    return tasks.eval_problems(exp.task, cfg.seed, cfg.size)
  try:
    return datasets.load_eval_set(exp.task, cfg.seed, cfg.size, data_dir)
  except OSError as e:
    raise ValueError(f"config.eval.data_dir={data_dir!r}: {e}; give a directory that holds the evaluation "
                     f"set or where this run can build it") from e


@dataclasses.dataclass(frozen=True)
class Evaluator:
  """`evaluator(params_S, greedy=True, divergence=False) -> metrics_S`: greedy or sampled, with or
  without the role-collapse diagnostic (`role_divergence`); both are arguments of one compiled program
  (`program(params_S, greedy, divergence) -> (metrics_S, divergence_S)`), not more programs.  The
  diagnostic is a branch taken only when asked for; where it cannot exist (one parameter set) or
  never runs (`config.eval.divergence_every=0`) the program lacks it."""
  program: Callable

  def __call__(self, params_S, greedy=True, divergence=False):
    metrics_S, divergence_S = self.program(params_S, jnp.asarray(greedy), jnp.asarray(divergence))
    return {**metrics_S, **divergence_S} if divergence else metrics_S

  def lower(self, params_S) -> jax.stages.Lowered:
    return self.program.lower(params_S, jnp.asarray(True), jnp.asarray(True))


def diagnosed(config, step: int) -> bool:
  """Whether the evaluation at `step` computes the role-collapse diagnostic: at every
  `config.eval.divergence_every`-th evaluation (the steps that are multiples of it times `eval_every`,
  step 0 included), and the last step's, whose values the report reads."""
  every = config.eval.divergence_every
  return every > 0 and (step % (every * config.eval_every) == 0 or step == config.total_steps)


def make_evaluate(exp: Experiment, problems: dict | None = None) -> Evaluator:
  """The Evaluator of params_S on the fixed evaluation set (`problems`, when already loaded)."""
  cfg = exp.config.eval
  problems = eval_problems(exp, cfg.data_dir) if problems is None else problems
  keys = jax.random.split(jax.random.PRNGKey(cfg.seed + 1), cfg.size)
  diagnoses = cfg.divergence_every > 0 and len(set(exp.role_set_R)) > 1

  def local(params_S, greedy, divergence, problems, key_B):
    def one_seed(params_R):
      def chunk(problems, key_B):
        tokens_BxT = rollout.sample(exp, params_R, problems, key_B, greedy).tokens_BxT
        # The protocol's counterfactual (if any): its transcripts re-drawn with a message replaced.
        ablation = exp.protocol.ablation(exp.layout, tokens_BxT, key_B)
        ablated_BxT = None if ablation is None else rollout.redraw(exp, params_R, *ablation, key_B, greedy)
        if not diagnoses:
          return tokens_BxT, ablated_BxT, None
        # A teacher-forced pass of every set, about as long as the sampling: computed only when asked.
        sums = functools.partial(divergence_sums, exp, params_R)
        unused = lambda t: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(sums, t))
        return tokens_BxT, ablated_BxT, jax.lax.cond(divergence, sums, unused, tokens_BxT)
      # `config.eval.batch_size` rows at a time; the protocol's rates are then of every row.
      tokens_CxBxT, ablated_CxBxT, sums_C = parallel.in_row_chunks(chunk, cfg.batch_size, problems, key_B)
      score = lambda t_CxBxT: exp.protocol.rewards(
          exp.task, exp.layout, *parallel.gather_rows((problems, t_CxBxT.reshape(-1, t_CxBxT.shape[-1]))))
      scored = score(tokens_CxBxT)
      if rollout.reads_levels(exp):  # the judges' distributions over their levels, for their monitoring
        scored = rollout.with_levels(exp, params_R, scored, tokens_CxBxT.reshape(-1, tokens_CxBxT.shape[-1]))
      judges = rewards.evaluation(exp.reward, exp.layout.roles, exp.protocol.judge_roles, scored.judgments)
      ablated = {} if ablated_CxBxT is None else {f"ablated_{k}": v for k, v in score(ablated_CxBxT).metrics.items()}
      return {**scored.metrics, **judges, **ablated}, role_divergence(exp, jax.tree.map(lambda x: x.sum(0), sums_C))
    return parallel.over_seeds(one_seed, exp.config.seeds_at_once)(params_S)

  rows = P(parallel.DATA)
  sharded = parallel.shard_map(local, exp.mesh, in_specs=(P(), P(), P(), rows, rows), out_specs=P())
  return Evaluator(jax.jit(lambda params_S, greedy, divergence: sharded(params_S, greedy, divergence, problems,
                                                                       keys)))


def divergence_sums(exp: Experiment, params_R, tokens_BxT):
  """This device's (js_sum_RxS, count_R) of `sampling.next_token_divergence` on `tokens_BxT`, or None
  when every role shares one set."""
  if len(set(exp.role_set_R)) < 2:
    return None
  return sampling.next_token_divergence(exp.model, exp.layout, exp.role_set_R, params_R, tokens_BxT,
                                        exp.config.rl.temperature)


def role_divergence(exp: Experiment, sums) -> dict:
  """`ROLE/next_token_js` from `divergence_sums` (summed over this device's rows): the mean over the
  other roles of the Jensen-Shannon divergence between their sets' next-token distributions and this
  role's own, on this role's messages (0 for roles that share its set); nothing when every role shares
  one set."""
  if sums is None:
    return {}
  R = len(exp.layout.roles)
  js_sum_RxS, count_R = parallel.sum_over_devices(sums)
  js_RxR = (js_sum_RxS / jnp.maximum(count_R, 1)[:, None])[:, np.asarray(exp.role_set_R)]
  others_R = (js_RxR.sum(1) - jnp.diagonal(js_RxR)) / (R - 1)
  return {f"{role}/next_token_js": others_R[r] for r, role in enumerate(exp.layout.roles)}
